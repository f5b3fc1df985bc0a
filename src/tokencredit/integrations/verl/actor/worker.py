"""Worker side of the actor extension: the extra signals computed inside verl's forward-only step."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from tensordict import TensorDict
from torch import Tensor, nn

from tokencredit.credit.entropy import entropy_from_logits
from tokencredit.errors import ConfigError
from tokencredit.integrations.verl.actor import reductions
from tokencredit.integrations.verl.actor.keys import (
    _BASE,
    _DELTA_PARAMS,
    _HIDDEN_ROWS,
    _NEG_IDS,
    _NEG_LENS,
    _REQUEST,
    OUTPUT_KEYS,
    SEQ_ADV,
    SWITCH,
    check_target,
)

__all__ = ["delta_coefficients", "float32_entropy", "wrap_forward_step", "wrap_infer_batch"]

# verl is imported inside the functions: an optional dependency, needed only once verl calls them.


def _lm_head(module: nn.Module) -> nn.Module:
    """The LM head of verl's actor module (FSDP1 wrapper and peft wrapper looked through)."""
    inner = getattr(module, "_fsdp_wrapped_module", module)
    get_base = getattr(inner, "get_base_model", None)
    core = get_base() if callable(get_base) else inner
    head = core.get_output_embeddings() if hasattr(core, "get_output_embeddings") else None
    if head is None:
        raise ConfigError(f"{SWITCH}: {type(core).__name__} has no LM head (get_output_embeddings)")
    return head


@contextmanager
def _head_inputs(module: nn.Module) -> Iterator[list[Tensor]]:
    """Collects the LM head's input tensor of each forward inside the block (the post-norm hidden state)."""
    seen: list[Tensor] = []
    handle = _lm_head(module).register_forward_hook(lambda _m, args, _out: seen.append(args[0].detach()))
    try:
        yield seen
    finally:
        handle.remove()


def _only(seen: list[Tensor], what: str) -> Tensor:
    if len(seen) != 1:
        raise ConfigError(
            f"{SWITCH}: expected one LM-head call in the {what} forward, saw {len(seen)} (fused-kernel LM heads "
            "compute log-probs without calling the LM head: set actor_rollout_ref.model.use_fused_kernels=False)"
        )
    return seen[0]


def _response_lengths(micro_batch: TensorDict) -> Tensor:
    """r [bs]: response tokens per sequence, the tail of each no-padding sequence (legacy trainer layout:
    padded [bs, T] response_mask beside the left/right-padded attention_mask it was cut from)."""
    width = micro_batch["response_mask"].shape[1]
    return micro_batch["attention_mask"][:, -width:].sum(-1).cpu()


def _response_positions(offsets: Tensor, resp_lens: Tensor) -> tuple[Tensor, Tensor]:
    """(row, position) [sum r] of the outputs that predict response tokens, for sequences packed back to
    back at `offsets` [bs + 1]: sequence i of length L_i, output j predicts token j + 1, so the rows
    are L_i - r_i - 1 ... L_i - 2 of the sequence. Returns the row ids and the positions within it."""
    seq_lens = offsets.diff().cpu()
    rows = torch.repeat_interleave(torch.arange(len(resp_lens)), resp_lens)
    within = torch.arange(int(resp_lens.sum())) - (torch.cumsum(resp_lens, 0) - resp_lens)[rows]
    return rows, (seq_lens - resp_lens - 1)[rows] + within


def _jagged(values: Tensor, resp_lens: Tensor) -> Tensor:
    offsets = torch.cat([resp_lens.new_zeros(1), torch.cumsum(resp_lens, 0)])
    return torch.nested.nested_tensor_from_jagged(values, offsets=offsets.to(values.device))


def _hidden_rows(hidden: Tensor, micro_batch: TensorDict, resp_lens: Tensor) -> Tensor:
    """[sum r_i, H] response rows of the captured LM-head input, sequence after sequence.

    Its layout follows verl's use_remove_padding flag: packed [1, nnz (+ pad suffix), H] with the
    sequences back to back, or padded [bs, L_max, H] with each sequence left-aligned.
    """
    from verl.utils import tensordict_utils as tu

    offsets = micro_batch["input_ids"].offsets().cpu()
    rows, pos = _response_positions(offsets, resp_lens)
    if tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True):
        values = hidden[0, (offsets[:-1][rows] + pos).to(hidden.device)]
    else:
        values = hidden[rows.to(hidden.device), pos.to(hidden.device)]
    return values


def _log_prob_rows(log_probs: Tensor, resp_lens: Tensor) -> Tensor:
    """Jagged [bs, r_i] response log-probs from verl's jagged full-sequence log_probs [bs, L_i]."""
    offsets = log_probs.offsets().cpu()
    rows, pos = _response_positions(offsets, resp_lens)
    return _jagged(log_probs.values()[(offsets[:-1][rows] + pos).to(log_probs.device)], resp_lens)


def _derived(micro_batch: TensorDict, **tensors: Tensor) -> TensorDict:
    """A shallow copy of `micro_batch` for an extra forward: no entropy, no request, `tensors` replaced."""
    from verl.utils import tensordict_utils as tu

    out = micro_batch.copy()
    for key in (_REQUEST, _DELTA_PARAMS, SEQ_ADV, _NEG_IDS, _NEG_LENS):
        out.pop(key, None)
    for key, value in tensors.items():
        out[key] = value
    tu.assign_non_tensor(out, calculate_entropy=False, calculate_sum_pi_squared=False)
    return out


def _negative_batch(micro_batch: TensorDict, resp_lens: Tensor) -> TensorDict:
    """The micro-batch with each prompt replaced by its negative prompt; the response tokens unchanged."""
    if _NEG_IDS not in micro_batch.keys():
        raise ConfigError(f"{SWITCH}: neg_log_probs requested but the batch carries no negative prompts")
    ids = micro_batch["input_ids"]
    values, offsets = ids.values(), ids.offsets()
    neg_ids, neg_lens = micro_batch[_NEG_IDS], micro_batch[_NEG_LENS]
    rows = []
    for i in range(len(resp_lens)):
        end, r, p = int(offsets[i + 1]), int(resp_lens[i]), int(neg_lens[i])
        rows.append(torch.cat([neg_ids[i, :p].to(values), values[end - r : end]]))
    new_ids = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    positions = torch.nested.as_nested_tensor(
        [torch.arange(len(row), device=values.device) for row in rows], layout=torch.jagged
    )
    return _derived(micro_batch, input_ids=new_ids, position_ids=positions)


def _check_supported(engine: Any, micro_batch: TensorDict, wanted: Sequence[str]) -> None:
    if getattr(engine, "use_ulysses_sp", False):
        raise ConfigError(
            f"{SWITCH}: Ulysses sequence parallelism (ulysses_sequence_parallel_size > 1) is not supported"
        )
    from verl.utils.model import extract_multi_modal_inputs

    if micro_batch["position_ids"].dim() == 3 or extract_multi_modal_inputs(
        micro_batch.get("multi_modal_inputs", [])
    ):
        raise ConfigError(f"{SWITCH}: multi-modal inputs are not supported (text-only models)")
    if set(wanted) & set(_BASE) and not getattr(engine, "_is_lora", False):
        raise ConfigError(
            f"{SWITCH}: {'/'.join(sorted(set(wanted) & set(_BASE)))} compare the policy with and without its LoRA "
            "adapter: set actor_rollout_ref.model.lora_rank > 0 (ARCA, policy divergence)"
        )


def wrap_forward_step(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``FSDPEngineWithLMHead.forward_step``: in a forward-only (old-policy) step the entropy is float32
    (`float32_entropy`), and a micro-batch that carries a signal request also returns those signals in
    ``model_output`` (jagged, response rows only); training steps are untouched."""
    if getattr(original, "tokencredit_hook", False):
        return original
    check_target(original, "forward_step")

    @functools.wraps(original)
    def forward_step(self: Any, micro_batch: TensorDict, loss_function: Any, forward_only: bool) -> Any:
        if not forward_only:
            return original(self, micro_batch, loss_function, forward_only)
        with float32_entropy(self, micro_batch):
            return _forward_only_step(original, self, micro_batch, loss_function)

    forward_step.tokencredit_hook = True  # type: ignore[attr-defined]
    return forward_step


@contextmanager
def float32_entropy(engine: Any, micro_batch: TensorDict) -> Iterator[None]:
    """Within the block, verl's entropy of a micro-batch that asks for it (``calculate_entropy``) is
    `tokencredit.credit.entropy.entropy_from_logits`: float32 from the same logits, without the
    cancellation of verl's ``logsumexp(z) - sum(softmax(z) z)`` that returns exactly 0 for the confident
    tokens (under bf16 autocast for most of them), which would tie the kept set of the 80/20 rule and
    S-trace. Used only for forward-only (old-policy) passes: the entropy bonus of the update is verl's.
    Both of verl's call sites are covered: the engine's ``compute_entropy_from_logits`` (remove-padding
    layout) and ``verl.utils.torch_functional.entropy_from_logits`` (padded layout)."""
    from verl.utils import tensordict_utils as tu
    from verl.utils import torch_functional as verl_f

    if not tu.get_non_tensor_data(data=micro_batch, key="calculate_entropy", default=False):
        yield
        return

    def entropy(logits: Tensor, chunk_size: int = 4096) -> Tensor:  # both of verl's signatures
        return entropy_from_logits(logits, chunk_size)

    saved_module = verl_f.entropy_from_logits
    had_own = "compute_entropy_from_logits" in vars(engine)
    saved_engine = getattr(engine, "compute_entropy_from_logits", None)
    verl_f.entropy_from_logits = entropy
    engine.compute_entropy_from_logits = entropy
    try:
        yield
    finally:
        verl_f.entropy_from_logits = saved_module
        if had_own:
            engine.compute_entropy_from_logits = saved_engine
        else:
            del engine.compute_entropy_from_logits


def _forward_only_step(
    original: Callable[..., Any], self: Any, micro_batch: TensorDict, loss_function: Any
) -> Any:
    """verl's forward-only step, plus what the micro-batch requests (`_REQUEST`), if anything."""
    from verl.utils import tensordict_utils as tu

    request = tu.get_non_tensor_data(data=micro_batch, key=_REQUEST, default="")
    if not request:
        return original(self, micro_batch, loss_function, True)
    wanted = tuple(request.split(","))
    _check_supported(self, micro_batch, wanted)
    resp_lens = _response_lengths(micro_batch)
    extra: dict[str, Tensor] = {}
    hidden_wanted = {"delta_coef", "adapter_residual"} & set(wanted)

    with _head_inputs(self.module) if hidden_wanted else nullcontext([]) as seen:
        loss, output = original(self, micro_batch, loss_function, True)
    hidden = _hidden_rows(_only(seen, "policy"), micro_batch, resp_lens) if hidden_wanted else None
    if "delta_coef" in wanted:
        # kept on this worker: the rank's DelTA runs once infer_batch has every micro-batch (wrap_infer_batch)
        extra[_HIDDEN_ROWS] = _jagged(hidden, resp_lens)

    if set(wanted) & set(_BASE):
        capture = _head_inputs(self.module) if "adapter_residual" in wanted else nullcontext([])
        with self.disable_adapter(), capture as seen:
            _, base = original(self, _derived(micro_batch), None, True)
        if "adapter_residual" in wanted:
            base_hidden = _hidden_rows(_only(seen, "adapter-free"), micro_batch, resp_lens)
            extra[OUTPUT_KEYS["adapter_residual"]] = _jagged(
                reductions.adapter_residual(hidden, base_hidden), resp_lens
            )
        if "base_log_probs" in wanted:
            extra[OUTPUT_KEYS["base_log_probs"]] = _log_prob_rows(
                base["model_output"]["log_probs"], resp_lens
            )

    if "neg_log_probs" in wanted:
        if micro_batch.get("routed_experts", None) is not None:
            raise ConfigError(
                f"{SWITCH}: GCPO's negative-prompt pass cannot replay MoE routing (router_replay)"
            )
        _, neg = original(self, _negative_batch(micro_batch, resp_lens), None, True)
        extra[OUTPUT_KEYS["neg_log_probs"]] = _log_prob_rows(neg["model_output"]["log_probs"], resp_lens)

    output["model_output"].update(extra)
    return loss, output


def wrap_infer_batch(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``FSDPEngineWithLMHead.infer_batch`` (all micro-batches of this rank): for a batch that requests
    DelTA's coefficients, compute them from the hidden rows its forward steps kept, the old log-probs and the
    sequence advantages the driver sent (`SEQ_ADV`), with the statistics summed over the data-parallel group,
    and return the coefficient rows in place of the hidden states. Every other call is verl's."""
    if getattr(original, "tokencredit_hook", False):
        return original
    check_target(original, "infer_batch")

    @functools.wraps(original)
    def infer_batch(self: Any, data: TensorDict, loss_function: Any = None) -> Any:
        from verl.utils import tensordict_utils as tu

        request = tu.get_non_tensor_data(data=data, key=_REQUEST, default="")
        if "delta_coef" not in request.split(","):
            return original(self, data, loss_function)
        if SEQ_ADV not in data.keys():
            raise ConfigError(
                f"{SWITCH}: DelTA's coefficients requested without the sequence advantages ({SEQ_ADV})"
            )
        params = dict(tu.get_non_tensor_data(data=data, key=_DELTA_PARAMS, default=None) or {})
        seq_adv = data[SEQ_ADV]
        output = original(self, data, loss_function)
        model_output = output["model_output"]
        hidden = model_output.pop(_HIDDEN_ROWS)
        resp_lens = _response_lengths(data)
        old_log_probs = _log_prob_rows(model_output["log_probs"], resp_lens)
        model_output[OUTPUT_KEYS["delta_coef"]] = delta_coefficients(
            hidden,
            old_log_probs,
            seq_adv,
            data["response_mask"],
            group=self.get_data_parallel_group(),
            **params,
        )
        del hidden
        return output

    infer_batch.tokencredit_hook = True  # type: ignore[attr-defined]
    return infer_batch


def delta_coefficients(
    hidden: Tensor,
    old_log_probs: Tensor,
    seq_adv: Tensor,
    response_mask: Tensor,
    *,
    group: Any = None,
    **params: Any,
) -> Tensor:
    """One rank's DelTA coefficient rows (`reductions.delta_coefficients`, collective over `group`); a
    module-level function so that a test can record what each rank held and returned."""
    return reductions.delta_coefficients(
        hidden, old_log_probs, seq_adv, response_mask=response_mask, group=group, **params
    )

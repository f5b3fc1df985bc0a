"""Driver side of the actor extension: ask verl's workers for the signals and reductions, pad what they return."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from tensordict import TensorDict
from torch import Tensor

from tokencredit.credit.gcpo import negative_prompt
from tokencredit.errors import ConfigError
from tokencredit.integrations.verl.actor.keys import (
    _DELTA_PARAMS,
    _NEG_IDS,
    _NEG_LENS,
    _REQUEST,
    OUTPUT_KEYS,
    SEQ_ADV,
    SWITCH,
)

__all__ = ["collect", "negative_prompts", "requesting"]

# verl is imported inside the functions: an optional dependency, needed only once verl calls them.


def negative_prompts(
    raw_prompts: Sequence[Any], tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None
) -> tuple[Tensor, Tensor]:
    """GCPO's negative prompts as token ids: ([bs, P'] int64 right-padded with 0, lengths [bs]).

    Each prompt is verl's chat (``non_tensor_batch["raw_prompt"]``) with its last user message, taken as
    the problem, replaced by `tokencredit.credit.gcpo.negative_prompt`; it is rendered with the tokenizer's
    chat template and the generation prompt, as verl renders the real prompt.
    """
    encoded = []
    for i, chat in enumerate(raw_prompts):
        messages = [dict(m) for m in chat] if not isinstance(chat, str) else None
        users = [m for m in messages or [] if m.get("role") == "user" and isinstance(m.get("content"), str)]
        if not users:
            raise ConfigError(
                f"{SWITCH}: GCPO needs each prompt as chat messages with a text user message (data.return_raw_chat=True); "
                f"prompt {i} has none"
            )
        users[-1]["content"] = negative_prompt(users[-1]["content"])
        text = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **(chat_template_kwargs or {})
        )
        encoded.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    lens = torch.tensor([len(e) for e in encoded], dtype=torch.long)
    ids = torch.zeros(len(encoded), int(lens.max()) if encoded else 0, dtype=torch.long)
    for i, e in enumerate(encoded):
        ids[i, : len(e)] = torch.tensor(e, dtype=torch.long)
    return ids, lens


def collect(output: TensorDict, response_mask: Tensor, wanted: Sequence[str]) -> dict[str, Tensor]:
    """The requested rows from the workers' output (`OUTPUT_KEYS`), padded to [bs, T] and 0 outside response_mask."""
    from verl.utils import tensordict_utils as tu

    mask = response_mask.bool()
    out = {}
    for name in wanted:
        key = OUTPUT_KEYS[name]
        value = tu.get(output, key)
        if value is None:
            raise ConfigError(
                f"{SWITCH}: the actor workers returned no {key!r}. Set {SWITCH}=1 in the workers' environment too "
                f"(+ray_kwargs.ray_init.runtime_env.env_vars.{SWITCH}=1) and use actor strategy fsdp or fsdp2"
            )
        size = (mask.shape[0], mask.shape[1], *value.shape[2:])
        padded = torch.nested.to_padded_tensor(value, 0.0, output_size=size)
        keep = mask.reshape(*mask.shape, *([1] * (padded.dim() - 2))).to(padded.device)
        out[key] = torch.where(keep, padded, torch.zeros((), dtype=padded.dtype, device=padded.device))
    return out


@contextmanager
def requesting(
    trainer: Any,
    batch: Any,
    wanted: Sequence[str],
    *,
    seq_adv: Tensor | None = None,
    delta_params: Mapping[str, Any] | None = None,
) -> Iterator[dict[str, Tensor]]:
    """Within the block, the trainer's ``actor_rollout_wg.compute_log_prob`` asks for `wanted` (keys of
    `OUTPUT_KEYS`) and the yielded dict is filled with the padded results when the call returns (see
    `collect`). DelTA's coefficients (``delta_coef``) need the sequence advantages `seq_adv` [bs] of the
    batch's rows and the method's `delta_params`; `seq_adv` is sent with the rows (each data-parallel rank
    gets its own) and also yielded under `SEQ_ADV`, for the estimator's check."""
    if "delta_coef" in wanted and (seq_adv is None or tuple(seq_adv.shape) != (len(batch),)):
        raise ConfigError(
            f"{SWITCH}: DelTA's coefficients need the sequence advantages [bs] of the batch ({SEQ_ADV})"
        )
    group = trainer.actor_rollout_wg
    call = group.compute_log_prob
    own = "compute_log_prob" in vars(group)
    negatives = None
    if "neg_log_probs" in wanted:
        if "raw_prompt" not in batch.non_tensor_batch:
            raise ConfigError(
                f"{SWITCH}: GCPO builds its negative prompt from the chat: set data.return_raw_chat=True"
            )
        data_cfg = trainer.config.get("data", {}) if hasattr(trainer.config, "get") else {}
        kwargs = dict(data_cfg.get("apply_chat_template_kwargs", None) or {})
        negatives = negative_prompts(list(batch.non_tensor_batch["raw_prompt"]), trainer.tokenizer, kwargs)
    result: dict[str, Tensor] = {}

    def compute_log_prob(data: TensorDict, *args: Any, **kwargs: Any) -> Any:
        from verl.utils import tensordict_utils as tu

        tu.assign_non_tensor(data, **{_REQUEST: ",".join(wanted)})
        if negatives is not None:
            data[_NEG_IDS], data[_NEG_LENS] = negatives
        if "delta_coef" in wanted:
            assert seq_adv is not None  # checked above
            data[SEQ_ADV] = seq_adv.detach().float().cpu()
            tu.assign_non_tensor(data, **{_DELTA_PARAMS: dict(delta_params or {})})
        output = call(data, *args, **kwargs)
        result.update(collect(output, data["response_mask"], wanted))
        if "delta_coef" in wanted:
            result[SEQ_ADV] = seq_adv.detach().float().cpu()
        return output

    group.compute_log_prob = compute_log_prob
    try:
        yield result
    finally:
        if own:
            group.compute_log_prob = call
        else:
            del group.compute_log_prob

"""Per-token signals of a causal LM on (prompt, response) sequences, computed without [N,T,V] tensors.

Two entry points:

- `token_log_probs(model, ...)`: log pi(y_t) [N,T] (and optionally the full-vocabulary entropy),
  differentiable when called under grad. The trainer uses it for the training forward.
- `compute_signals(model, ..., needs)`: the detached per-token signals a credit method declares
  (names from `tokencredit.batch.SIGNALS`), in the fewest forwards: ONE old-policy forward per
  micro-batch for old_log_probs + entropy + hidden (+ sum_sq_probs) together, ONE adapter-disabled forward for
  base_hidden + base_log_probs (+ ref_log_probs when the LoRA base is the reference), ONE forward
  of `ref_model` for ref_log_probs, ONE negative-prompt forward for neg_log_probs (GCPO). A signal
  that is not asked for costs nothing.

Sequence layout: `sequences` [N, P+T] int64 = left-padded prompt (P columns) then right-padded
response (T columns); `attention_mask` [N, P+T]; the logits at column P-1+t predict response
token t, so `hidden[:, t]` is the LM head's input at column P-1+t. Position ids are
cumsum(attention_mask) - 1 (0 on padding), as `transformers`' `generate` uses for left-padded
prompts, so a left-padded row gets the values it would get alone.

How the logits are formed (the design choice behind the memory bound): the model's decoder
(`get_decoder()` of the transformers model, reached through a peft wrapper; LoRA layers live inside
it, so the adapter applies) runs once and returns the final hidden state after the final norm,
which is exactly the tensor the causal-LM forward feeds to the LM head. We keep only the
response-predicting positions (and only valid tokens), then apply the LM head module itself
(`get_output_embeddings()`; if peft wrapped it because it was targeted, the LoRA term is
included) to `chunk_size` tokens at a time and reduce each chunk to float32 log-prob/entropy.
The hidden signal is that same decoder output, so no hook and no `output_hidden_states` copy of
every layer is needed. Gemma-style `final_logit_softcapping` is applied; other config-driven logit
rescalings (`logits_scaling`, `logit_scale`, `output_multiplier`) are refused with a ConfigError
rather than silently ignored.

Memory: under no-grad at most two [chunk_size, V] float32 buffers (plus the LM head's output in
the model dtype when that is not float32) exist at once. Under grad each chunk runs inside
`torch.utils.checkpoint`, so its logits are freed after the forward and recomputed in the
backward: the peak stays O(chunk_size x V) at the cost of one extra LM-head matmul per chunk.

Temperature: log-probs and entropy use logits / temperature (the sampling temperature; verl's
convention), for every pass (old, base, ref, negative prompt).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from tokencredit.batch import SIGNALS
from tokencredit.errors import ConfigError, closest

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "chunked_log_probs",
    "compute_signals",
    "has_lora_adapter",
    "position_ids_from_mask",
    "token_log_probs",
]

DEFAULT_CHUNK_SIZE = 512
"""Tokens per LM-head chunk: 512 x 151,936 (Qwen vocabulary) x 4 B = 311 MB per float32 buffer."""

_POLICY_SIGNALS = ("old_log_probs", "entropy", "hidden", "sum_sq_probs")
_BASE_SIGNALS = ("base_hidden", "base_log_probs")
_LORA_ERROR = "ARCA / policy-divergence need a LoRA adapter (set lora.rank > 0)"


# --------------------------------------------------------------------------- model plumbing
def _unwrap(model: nn.Module) -> nn.Module:
    """The transformers model under a peft wrapper (LoRA layers are injected into it in place)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def _model_parts(model: nn.Module) -> tuple[nn.Module, nn.Module, float | None]:
    """(decoder returning the post-norm last hidden state, LM head module, logit softcap or None)."""
    core = _unwrap(model)
    get_decoder = getattr(core, "get_decoder", None)
    get_head = getattr(core, "get_output_embeddings", None)
    decoder = get_decoder() if callable(get_decoder) else None
    head = get_head() if callable(get_head) else None
    if decoder is None or head is None or decoder is core:
        raise ConfigError(
            f"tokencredit.signals needs a transformers causal LM with get_decoder() and get_output_embeddings() "
            f"(got {type(core).__name__})"
        )
    cfg = getattr(core, "config", None)
    if cfg is not None and callable(getattr(cfg, "get_text_config", None)):
        cfg = cfg.get_text_config()
    for attr in ("logits_scaling", "logit_scale", "output_multiplier"):
        value = getattr(cfg, attr, None)
        if value is not None and value != 1:
            raise ConfigError(
                f"{type(core).__name__} rescales its logits by config.{attr}={value}; tokencredit.signals forms logits "
                "as lm_head(final hidden state) (+ final_logit_softcapping) and does not support this model"
            )
    cap = getattr(cfg, "final_logit_softcapping", None)
    return decoder, head, (float(cap) if cap else None)


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """[N, L] int64 position ids cumsum(mask) - 1, 0 on padding (what `generate` uses for left padding)."""
    mask = attention_mask.long()
    return (mask.cumsum(-1) - 1).clamp_(min=0).masked_fill_(mask == 0, 0)


def has_lora_adapter(model: nn.Module) -> bool:
    """True iff `model` holds a peft LoRA layer whose active adapter has rank > 0."""
    from peft.tuners.lora import LoraLayer

    for module in model.modules():
        if isinstance(module, LoraLayer):
            ranks = getattr(module, "r", {})
            if any(ranks.get(name, 0) > 0 for name in module.active_adapters):
                return True
    return False


@contextmanager
def _adapter_disabled(model: nn.Module) -> Iterator[None]:
    """Run with every adapter switched off, then restore each layer's previous state."""
    disable = getattr(model, "disable_adapter", None)
    if callable(disable):  # peft.PeftModel: its own context also covers modules_to_save
        with disable():
            yield
        return
    # LoRA injected without a PeftModel wrapper (e.g. transformers' load_adapter): toggle the layers.
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    saved = [m.disable_adapters for m in layers]
    try:
        for m in layers:
            m.enable_adapters(False)
        yield
    finally:
        for m, was_disabled in zip(layers, saved):
            m.enable_adapters(not was_disabled)


@contextmanager
def _eval_mode(*models: nn.Module | None) -> Iterator[None]:
    """Eval mode (no dropout) inside; every submodule's own train/eval flag restored after."""
    saved = [(m, m.training) for model in models if model is not None for m in model.modules()]
    try:
        for model in models:
            if model is not None:
                model.eval()
        yield
    finally:
        for m, flag in saved:
            m.training = flag


# --------------------------------------------------------------------------- chunked LM head
def _chunk_stats_inplace(
    head: nn.Module,
    h: Tensor,
    y: Tensor,
    temperature: float,
    softcap: float | None,
    with_entropy: bool,
    with_sum_sq: bool = False,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """No-grad path: at most two [c, V] float32 buffers. Shift by the row max in place, then
    log p_y = z_y - log s, H = log s - (sum_v e_v z_v) / s and sum_v p_v^2 = ||e||^2 / s^2 with
    e = exp(z), s = sum e, z shifted (the norm is a reduction: no extra [c, V] buffer)."""
    z = head(h).float()
    if softcap is not None:
        z.div_(softcap).tanh_().mul_(softcap)
    if temperature != 1.0:
        z.div_(temperature)
    z.sub_(z.amax(-1, keepdim=True))
    z_y = z.gather(-1, y[:, None]).squeeze(-1)
    if not with_entropy:
        e = z.exp_()
        s = e.sum(-1)
        sum_sq = torch.linalg.vector_norm(e, dim=-1).square_().div_(s * s) if with_sum_sq else None
        return z_y - s.log_(), None, sum_sq
    e = z.exp()
    s = e.sum(-1)
    sum_sq = torch.linalg.vector_norm(e, dim=-1).square_().div_(s * s) if with_sum_sq else None
    ez = e.mul_(z).sum(-1)  # in place: no third [c, V] buffer; torch.sum's cascade keeps fp32 error ~1e-6
    log_s = s.log()
    return z_y - log_s, log_s - ez / s, sum_sq


def _chunk_stats_autograd(
    head: nn.Module,
    h: Tensor,
    y: Tensor,
    temperature: float,
    softcap: float | None,
    with_entropy: bool,
    with_sum_sq: bool = False,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Differentiable path (run under checkpoint): log p_y = z_y - logsumexp z, H = logsumexp z - sum softmax(z) z,
    sum_v softmax(z)_v^2."""
    z = head(h).float()
    if softcap is not None:
        z = torch.tanh(z / softcap) * softcap
    if temperature != 1.0:
        z = z / temperature
    lse = torch.logsumexp(z, -1)
    log_p = z.gather(-1, y[:, None]).squeeze(-1) - lse
    probs = torch.softmax(z, -1) if with_entropy or with_sum_sq else None
    ent = lse - (probs * z).sum(-1) if with_entropy else None
    sum_sq = probs.square().sum(-1) if with_sum_sq else None
    return log_p, ent, sum_sq


def chunked_log_probs(
    hidden: Tensor,
    lm_head: nn.Module,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    logit_softcap: float | None = None,
) -> tuple[Tensor, Tensor | None]:
    """log softmax(lm_head(hidden) / temperature)[target] and the full-vocabulary entropy, float32.

    hidden [M, H] (any dtype), targets [M] int64 in [0, V). Returns (log_p [M], entropy [M] or None).
    The LM head runs on `chunk_size` rows at a time, so at most O(chunk_size x V) logits exist at
    once; with grad each chunk is checkpointed (logits recomputed in the backward).
    """
    log_p, entropy, _ = _chunked_stats(
        hidden, lm_head, targets, temperature=temperature, with_entropy=with_entropy, with_sum_sq=False,
        chunk_size=chunk_size, logit_softcap=logit_softcap,
    )  # fmt: skip
    return log_p, entropy


def _chunked_stats(
    hidden: Tensor,
    lm_head: nn.Module,
    targets: Tensor,
    *,
    temperature: float,
    with_entropy: bool,
    with_sum_sq: bool,
    chunk_size: int,
    logit_softcap: float | None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """`chunked_log_probs` plus, when `with_sum_sq`, sum_v p_v^2 [M] of the same distribution."""
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(
            f"chunked_log_probs: expected hidden [M, H] and targets [M], got {tuple(hidden.shape)} and {tuple(targets.shape)}"
        )
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    vocab = getattr(lm_head, "out_features", None)
    if targets.numel() and (int(targets.min()) < 0 or (vocab is not None and int(targets.max()) >= vocab)):
        raise ValueError(
            f"token ids must lie in [0, {vocab}) at valid response positions; got min {int(targets.min())}, "
            f"max {int(targets.max())} (is a padding id marked valid in response_mask?)"
        )
    needs_graph = torch.is_grad_enabled() and (
        hidden.requires_grad or any(p.requires_grad for p in lm_head.parameters())
    )
    parts: list[tuple[Tensor, Tensor | None, Tensor | None]] = []
    for start in range(0, hidden.shape[0], chunk_size):
        h, y = hidden[start : start + chunk_size], targets[start : start + chunk_size]
        if needs_graph:
            parts.append(
                checkpoint(
                    _chunk_stats_autograd,
                    lm_head,
                    h,
                    y,
                    temperature,
                    logit_softcap,
                    with_entropy,
                    with_sum_sq,
                    use_reentrant=False,
                )
            )
        else:
            parts.append(_chunk_stats_inplace(lm_head, h, y, temperature, logit_softcap, with_entropy, with_sum_sq))
    wanted = (True, with_entropy, with_sum_sq)
    if not parts:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return tuple(empty.clone() if w else None for w in wanted)  # type: ignore[return-value]
    return tuple(torch.cat([p[k] for p in parts]) if w else None for k, w in enumerate(wanted))  # type: ignore[return-value]


# --------------------------------------------------------------------------- one forward
def _check_layout(
    sequences: Tensor,
    attention_mask: Tensor,
    prompt_len: int,
    response_mask: Tensor | None,
    what: str = "sequences",
) -> int:
    """Validate the (prompt, response) layout; returns T."""
    if sequences.dim() != 2 or sequences.dtype.is_floating_point or sequences.dtype == torch.bool:
        raise ValueError(
            f"{what}: expected an integer tensor [N, P+T], got shape {tuple(sequences.shape)} dtype {sequences.dtype}"
        )
    if tuple(attention_mask.shape) != tuple(sequences.shape):
        raise ValueError(
            f"attention_mask for {what}: expected shape {tuple(sequences.shape)}, got {tuple(attention_mask.shape)}"
        )
    n, length = sequences.shape
    if not isinstance(prompt_len, int) or not 1 <= prompt_len < length:
        raise ValueError(f"prompt_len for {what}: expected an int in [1, {length - 1}], got {prompt_len!r}")
    t = length - prompt_len
    if response_mask is not None:
        if tuple(response_mask.shape) != (n, t):
            raise ValueError(f"response_mask: expected shape ({n}, {t}), got {tuple(response_mask.shape)}")
        unattended = response_mask.bool() & (attention_mask[:, prompt_len:] == 0)
        if bool(unattended.any()):
            i, j = (int(x) for x in unattended.nonzero()[0])
            raise ValueError(
                f"response_mask marks token {j} of rollout {i} valid but attention_mask for {what} is 0 there"
            )
    return t


def _check_ids(model: nn.Module, sequences: Tensor, what: str) -> None:
    """Every column (padding included) is embedded, so every id must index the input embedding."""
    get_emb = getattr(_unwrap(model), "get_input_embeddings", None)
    emb = get_emb() if callable(get_emb) else None
    vocab = getattr(emb, "num_embeddings", None)
    if vocab is None or sequences.numel() == 0:
        return
    bad = (sequences < 0) | (sequences >= vocab)
    if bool(bad.any()):
        i, j = (int(x) for x in bad.nonzero()[0])
        raise ValueError(
            f"{what}: token id {int(sequences[i, j])} at rollout {i}, column {j} is outside the vocabulary [0, {vocab}) "
            "(padding must use a valid id, e.g. the pad token, not -100)"
        )


def _forward_stats(
    decoder: nn.Module,
    head: nn.Module,
    softcap: float | None,
    sequences: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    prompt_len: int,
    response_mask: Tensor,
    *,
    want_log_p: bool,
    want_entropy: bool,
    want_hidden: bool,
    want_sum_sq: bool = False,
    temperature: float,
    chunk_size: int,
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """One decoder forward on rows [n, P+T] -> (log_p [n,T], entropy [n,T], hidden [n,T,H], sum_v p_v^2 [n,T]),
    float32, 0 where masked.

    Columns that cannot matter are dropped first: leading columns padded in every row (masked keys
    with mask-derived position ids contribute nothing), and the columns after the last valid
    response token (causal attention); the final response token itself is never an input.
    """
    n, length = sequences.shape
    t = length - prompt_len
    valid_cols = response_mask.any(0).nonzero()
    t_keep = int(valid_cols[-1]) + 1 if valid_cols.numel() else 1
    attended = attention_mask[:, :prompt_len].ne(0).any(0).nonzero()
    lead = min(int(attended[0]) if attended.numel() else prompt_len - 1, prompt_len - 1)
    end = prompt_len - 1 + t_keep
    out = decoder(
        input_ids=sequences[:, lead:end],
        attention_mask=attention_mask[:, lead:end],
        position_ids=position_ids[:, lead:end],
        use_cache=False,
    )
    last = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    h = last[:, prompt_len - 1 - lead :]  # [n, t_keep, H]: h[:, t] predicts response token t

    mask = response_mask[:, :t_keep].bool()
    rows, cols = mask.nonzero(as_tuple=True)
    log_p = entropy = hidden = sum_sq = None
    if want_log_p or want_entropy or want_sum_sq:
        targets = sequences[:, prompt_len : prompt_len + t_keep][rows, cols]
        lp, ent, sq = _chunked_stats(
            h[rows, cols],
            head,
            targets,
            temperature=temperature,
            with_entropy=want_entropy,
            with_sum_sq=want_sum_sq,
            chunk_size=chunk_size,
            logit_softcap=softcap,
        )
        zeros = torch.zeros(n, t, dtype=torch.float32, device=h.device)
        if want_log_p:
            log_p = zeros.index_put((rows, cols), lp)
        if want_entropy:
            entropy = zeros.index_put((rows, cols), ent)
        if want_sum_sq:
            sum_sq = zeros.index_put((rows, cols), sq)
    if want_hidden:
        hidden = torch.zeros(n, t, h.shape[-1], dtype=torch.float32, device=h.device)
        hidden[:, :t_keep] = torch.where(mask[..., None], h.float(), 0.0)
    return log_p, entropy, hidden, sum_sq


def token_log_probs(
    model: nn.Module,
    sequences: Tensor,
    attention_mask: Tensor,
    prompt_len: int,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    response_mask: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """log pi(y_t | prompt, y_<t) [N,T] float32 (and the full-vocabulary entropy [N,T] if with_entropy).

    Differentiable when called under grad (the trainer's training forward): one model forward,
    the LM head applied in checkpointed chunks of `chunk_size` tokens. `response_mask` [N,T]
    (optional) restricts the work to valid tokens; other positions are exactly 0. Without it every
    response column is scored, so padding ids must then be valid token ids.
    """
    t = _check_layout(sequences, attention_mask, prompt_len, response_mask)
    if response_mask is None:
        response_mask = torch.ones(sequences.shape[0], t, dtype=torch.bool, device=sequences.device)
    decoder, head, softcap = _model_parts(model)
    _check_ids(model, sequences, "sequences")
    log_p, entropy, _, _ = _forward_stats(
        decoder,
        head,
        softcap,
        sequences,
        attention_mask,
        position_ids_from_mask(attention_mask),
        prompt_len,
        response_mask.bool(),
        want_log_p=True,
        want_entropy=with_entropy,
        want_hidden=False,
        temperature=temperature,
        chunk_size=chunk_size,
    )
    return (log_p, entropy) if with_entropy else log_p


# --------------------------------------------------------------------------- all signals
def _pass(
    model: nn.Module,
    sequences: Tensor,
    attention_mask: Tensor,
    prompt_len: int,
    response_mask: Tensor,
    *,
    want_log_p: bool,
    want_entropy: bool,
    want_hidden: bool,
    want_sum_sq: bool = False,
    temperature: float,
    chunk_size: int,
    batch_size: int,
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """One forward per micro-batch of `batch_size` rows; results concatenated over rows."""
    decoder, head, softcap = _model_parts(model)
    _check_ids(model, sequences, "sequences")
    position_ids = position_ids_from_mask(attention_mask)
    parts: list[tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]] = []
    for start in range(0, sequences.shape[0], batch_size):
        rows = slice(start, start + batch_size)
        parts.append(
            _forward_stats(
                decoder,
                head,
                softcap,
                sequences[rows],
                attention_mask[rows],
                position_ids[rows],
                prompt_len,
                response_mask[rows],
                want_log_p=want_log_p,
                want_entropy=want_entropy,
                want_hidden=want_hidden,
                want_sum_sq=want_sum_sq,
                temperature=temperature,
                chunk_size=chunk_size,
            )
        )
    return tuple(torch.cat([p[k] for p in parts]) if parts[0][k] is not None else None for k in range(4))  # type: ignore[return-value]


def _check_needs(needs: Iterable[str]) -> set[str]:
    needs = set(needs)
    for name in sorted(needs):
        if name not in SIGNALS:
            raise ConfigError(f"unknown signal {name!r}{closest(name, SIGNALS)}; known: {', '.join(SIGNALS)}")
    return needs


def compute_signals(
    model: nn.Module,
    sequences: Tensor,
    attention_mask: Tensor,
    prompt_len: int,
    response_mask: Tensor,
    needs: Iterable[str],
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    batch_size: int | None = None,
    ref_model: nn.Module | None = None,
    neg_sequences: Tensor | None = None,
    neg_attention_mask: Tensor | None = None,
    neg_prompt_len: int | None = None,
) -> dict[str, Tensor]:
    """The per-token signals `needs` (names from tokencredit.batch.SIGNALS), detached float32, 0 where masked.

    Returns {name: [N,T]} (hidden / base_hidden: [N,T,H], the post-final-norm LM-head input, hidden[:, t]
    predicting token t) for exactly the names asked. Passes (each one forward per micro-batch of
    `batch_size` rows, None = all rows at once; no pass for a signal not asked):
      - old policy: old_log_probs, entropy, hidden, sum_sq_probs (sum_v pi_old(v)^2, same chunked LM-head pass);
      - LoRA adapter disabled (peft `disable_adapter()`): base_hidden, base_log_probs, and
        ref_log_probs when `ref_model` is None (the adapter-free base is the reference under LoRA);
      - `ref_model`: ref_log_probs when a separate reference model is given;
      - negative prompt (GCPO): neg_log_probs, the same response columns scored after
        `neg_sequences` [N, P'+T] (prompt length `neg_prompt_len` = P') with `neg_attention_mask`.
    `model` (and `ref_model`) run in eval mode (no dropout); each submodule's mode is restored after.
    Raises ConfigError for an unknown name, for base_* (or ref_log_probs without ref_model) on a
    model without a LoRA adapter, and ValueError for inconsistent shapes or negative-prompt inputs.
    """
    needs = _check_needs(needs)
    t = _check_layout(sequences, attention_mask, prompt_len, response_mask)
    n = sequences.shape[0]
    batch_size = n if batch_size is None else batch_size
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    response_mask = response_mask.bool()

    ref_from_base = "ref_log_probs" in needs and ref_model is None
    base_needed = bool(needs & set(_BASE_SIGNALS)) or ref_from_base
    if base_needed and not has_lora_adapter(model):
        if needs & set(_BASE_SIGNALS):
            raise ConfigError(_LORA_ERROR)
        raise ConfigError(
            "ref_log_probs needs ref_model= (or a LoRA adapter, whose disabled base serves as the reference)"
        )
    if "neg_log_probs" in needs:
        if neg_sequences is None or neg_attention_mask is None or neg_prompt_len is None:
            raise ValueError(
                "neg_log_probs needs neg_sequences, neg_attention_mask and neg_prompt_len (GCPO's negative prompt)"
            )
        if (
            neg_sequences.dim() != 2
            or neg_sequences.shape[0] != n
            or not isinstance(neg_prompt_len, int)
            or neg_sequences.shape[1] - neg_prompt_len != t
        ):
            raise ValueError(
                f"neg_sequences: expected {n} rows with the same {t} response columns after neg_prompt_len, "
                f"got shape {tuple(neg_sequences.shape)} with neg_prompt_len {neg_prompt_len!r}"
            )
        _check_layout(neg_sequences, neg_attention_mask, neg_prompt_len, response_mask, what="neg_sequences")
        differs = (neg_sequences[:, neg_prompt_len:] != sequences[:, prompt_len:]) & response_mask
        if bool(differs.any()):
            i, j = (int(x) for x in differs.nonzero()[0])
            raise ValueError(f"neg_sequences: response token {j} of rollout {i} differs from sequences'")

    kw = {"temperature": temperature, "chunk_size": chunk_size, "batch_size": batch_size}
    args = (sequences, attention_mask, prompt_len, response_mask)
    out: dict[str, Tensor] = {}
    with torch.no_grad(), _eval_mode(model, ref_model):
        if needs & set(_POLICY_SIGNALS):
            lp, ent, hid, sq = _pass(
                model,
                *args,
                want_log_p="old_log_probs" in needs,
                want_entropy="entropy" in needs,
                want_hidden="hidden" in needs,
                want_sum_sq="sum_sq_probs" in needs,
                **kw,
            )
            out.update(old_log_probs=lp, entropy=ent, hidden=hid, sum_sq_probs=sq)
        if base_needed:
            with _adapter_disabled(model):
                lp, _, hid, _ = _pass(
                    model,
                    *args,
                    want_log_p="base_log_probs" in needs or ref_from_base,
                    want_entropy=False,
                    want_hidden="base_hidden" in needs,
                    **kw,
                )
            out.update(base_log_probs=lp, base_hidden=hid)
            if ref_from_base:
                out["ref_log_probs"] = lp.clone()
        if "ref_log_probs" in needs and ref_model is not None:
            out["ref_log_probs"] = _pass(
                ref_model, *args, want_log_p=True, want_entropy=False, want_hidden=False, **kw
            )[0]
        if "neg_log_probs" in needs:
            out["neg_log_probs"] = _pass(
                model,
                neg_sequences,
                neg_attention_mask,
                neg_prompt_len,
                response_mask,
                want_log_p=True,
                want_entropy=False,
                want_hidden=False,
                **kw,
            )[0]
    return {name: value.detach() for name, value in out.items() if name in needs and value is not None}


def negative_prompt_inputs(
    tokenizer: Any,
    prompts: Sequence[str],
    response_ids: Tensor,
    response_mask: Tensor,
    add_special_tokens: bool | None = None,
) -> dict[str, Any]:
    """`compute_signals`'s GCPO inputs: each negative prompt (already rendered as text) followed by
    the same response tokens, [N, P' + T].

    The prompts are left-padded and tokenised as the engine tokenised the real prompts: by default
    as `tokencredit.rollout.generate` does (special tokens added unless every text already starts
    with the BOS token); an engine that never adds them (TRL) passes add_special_tokens=False.
    """
    bos = getattr(tokenizer, "bos_token", None)
    add_special = not (bos and all(p.startswith(bos) for p in prompts)) if add_special_tokens is None else add_special_tokens
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        enc = tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=add_special)
    finally:
        tokenizer.padding_side = side
    device = response_ids.device
    return {
        "neg_sequences": torch.cat([enc["input_ids"].to(device), response_ids], dim=1),
        "neg_attention_mask": torch.cat([enc["attention_mask"].to(device), response_mask.long()], dim=1),
        "neg_prompt_len": int(enc["input_ids"].shape[1]),
    }

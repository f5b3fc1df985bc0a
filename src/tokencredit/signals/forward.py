"""One forward of the decoder and the chunked LM head on (prompt, response) sequences: `token_log_probs`."""

from __future__ import annotations

from typing import Literal, overload

import torch
from torch import Tensor, nn

from tokencredit.signals.head import DEFAULT_CHUNK_SIZE, _chunked_stats
from tokencredit.signals.model import _model_parts, _unwrap, position_ids_from_mask
from tokencredit.signals.prefix import decoder_hidden


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
    response token (causal attention); the final response token itself is never an input. Rows
    that repeat a prompt share its forward (`tokencredit.signals.prefix.decoder_hidden`).
    """
    n, length = sequences.shape
    t = length - prompt_len
    valid_cols = response_mask.any(0).nonzero()
    t_keep = int(valid_cols[-1]) + 1 if valid_cols.numel() else 1
    attended = attention_mask[:, :prompt_len].ne(0).any(0).nonzero()
    lead = min(int(attended[0]) if attended.numel() else prompt_len - 1, prompt_len - 1)
    end = prompt_len - 1 + t_keep
    # [n, t_keep, H]: h[:, t] predicts response token t; each distinct prompt runs once where that is exact
    h = decoder_hidden(decoder, sequences, attention_mask, position_ids, prompt_len, lead, end)

    mask = response_mask[:, :t_keep].bool()
    rows, cols = mask.nonzero(as_tuple=True)
    log_p: Tensor | None = None
    entropy: Tensor | None = None
    hidden: Tensor | None = None
    sum_sq: Tensor | None = None
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
        # ent and sq are computed exactly when asked for (with_entropy / with_sum_sq above)
        log_p = zeros.index_put((rows, cols), lp) if want_log_p else None
        entropy = None if ent is None else zeros.index_put((rows, cols), ent)
        sum_sq = None if sq is None else zeros.index_put((rows, cols), sq)
    if want_hidden:
        hidden = torch.zeros(n, t, h.shape[-1], dtype=torch.float32, device=h.device)
        hidden[:, :t_keep] = torch.where(mask[..., None], h.float(), 0.0)
    return log_p, entropy, hidden, sum_sq


# The result's form follows with_entropy: log_p alone, or (log_p, entropy); a plain bool gives either.
@overload
def token_log_probs(
    model: nn.Module,
    sequences: Tensor,
    attention_mask: Tensor,
    prompt_len: int,
    *,
    temperature: float = ...,
    with_entropy: Literal[False] = ...,
    chunk_size: int = ...,
    response_mask: Tensor | None = ...,
) -> Tensor: ...
@overload
def token_log_probs(
    model: nn.Module,
    sequences: Tensor,
    attention_mask: Tensor,
    prompt_len: int,
    *,
    temperature: float = ...,
    with_entropy: Literal[True],
    chunk_size: int = ...,
    response_mask: Tensor | None = ...,
) -> tuple[Tensor, Tensor]: ...
@overload
def token_log_probs(
    model: nn.Module,
    sequences: Tensor,
    attention_mask: Tensor,
    prompt_len: int,
    *,
    temperature: float = ...,
    with_entropy: bool,
    chunk_size: int = ...,
    response_mask: Tensor | None = ...,
) -> Tensor | tuple[Tensor, Tensor]: ...
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
    lp, ent, _, _ = _forward_stats(
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
    log_p = _asked(lp, "log_p")
    return (log_p, _asked(ent, "entropy")) if with_entropy else log_p


def _asked(value: Tensor | None, what: str) -> Tensor:
    """A statistic of `_forward_stats` whose `want_*` flag was set: computed, so never None.

    The four statistics are optional because each pass asks for some of them; where the flag is known
    to be set this narrows the value (a None here is a bug in the pass, named)."""
    if value is None:
        raise RuntimeError(f"tokencredit.signals: {what} was asked of the forward pass but not computed")
    return value

"""The LM head applied in chunks of tokens, reduced at once to float32 log-probs, entropy and sum pi^2."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

DEFAULT_CHUNK_SIZE = 512
"""Tokens per LM-head chunk: 512 x 151,936 (Qwen vocabulary) x 4 B = 311 MB per float32 buffer."""


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
    ent: Tensor | None = None
    sum_sq: Tensor | None = None
    if with_entropy or with_sum_sq:
        probs = torch.softmax(z, -1)
        if with_entropy:
            ent = lse - (probs * z).sum(-1)
        if with_sum_sq:
            sum_sq = probs.square().sum(-1)
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
        hidden,
        lm_head,
        targets,
        temperature=temperature,
        with_entropy=with_entropy,
        with_sum_sq=False,
        chunk_size=chunk_size,
        logit_softcap=logit_softcap,
    )
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
            parts.append(
                _chunk_stats_inplace(lm_head, h, y, temperature, logit_softcap, with_entropy, with_sum_sq)
            )
    if not parts:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return (
            empty.clone(),
            empty.clone() if with_entropy else None,
            empty.clone() if with_sum_sq else None,
        )
    return (
        torch.cat([p[0] for p in parts]),
        cat_rows([p[1] for p in parts]),
        cat_rows([p[2] for p in parts]),
    )


def cat_rows(blocks: Sequence[Tensor | None]) -> Tensor | None:
    """The blocks of one optional statistic concatenated along rows, or None when it was not asked for.

    blocks: one entry per chunk of rows ([rows, ...] or None). They come from one set of `with_*` /
    `want_*` flags, so either every block carries the statistic or none does; the first decides.
    """
    if blocks[0] is None:
        return None
    return torch.cat([b for b in blocks if b is not None])

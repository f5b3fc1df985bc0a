"""The 80/20 high-entropy rule (Wang et al. 2025, arXiv 2506.01939).

Only tokens whose old-policy entropy is at or above the (1 - keep_ratio) quantile get a
gradient; the loss normaliser stays the count of all valid tokens (as TRL's
`top_entropy_quantile`). As a credit method this is Â = A * keep: a zero advantage gives a zero
loss term and zero gradient under every ratio kernel, while the token still counts in the
token-mean denominator.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tokencredit.batch import RolloutBatch
from tokencredit.credit import register


def _quantile_threshold(values: Tensor, valid: Tensor, keep_ratio: float) -> Tensor:
    """Per-row (1 - keep_ratio) quantile of `values` over `valid` entries, [R]; linear interpolation.

    values, valid: [R, L]. Rows without a valid entry get +inf (nothing kept).
    """
    v = values.double().masked_fill(~valid, float("inf"))
    srt, _ = torch.sort(v, dim=-1)
    n = valid.sum(-1)
    pos = (1.0 - keep_ratio) * (n - 1).clamp(min=0).double()
    lo = pos.floor().long()
    hi = pos.ceil().long().clamp(max=(n - 1).clamp(min=0))
    frac = pos - lo.double()
    lo_v = srt.gather(-1, lo[:, None]).squeeze(-1)
    hi_v = srt.gather(-1, hi[:, None]).squeeze(-1)
    thr = torch.where(frac > 0, lo_v + (hi_v - lo_v) * frac, lo_v)
    return torch.where(n > 0, thr, torch.full_like(thr, float("inf")))


def top_entropy_mask(entropy: Tensor, mask: Tensor, keep_ratio: float = 0.2, scope: str = "batch") -> Tensor:
    """bool[N,T]: valid tokens whose entropy >= the (1 - keep_ratio) quantile.

    entropy [N,T] float, mask [N,T] bool/0-1. scope="batch": one threshold over all valid tokens
    of the batch (the paper's rule); scope="sequence": one threshold per response.
    The quantile interpolates linearly between order statistics (torch.quantile's default),
    so keep_ratio = 1 keeps every valid token and keep_ratio = 0 keeps the maximum (and ties).
    """
    if not 0.0 <= keep_ratio <= 1.0:
        raise ValueError(f"keep_ratio must be in [0, 1], got {keep_ratio}")
    if entropy.shape != mask.shape:
        raise ValueError(f"entropy {tuple(entropy.shape)} and mask {tuple(mask.shape)} must have the same shape")
    valid = mask.bool()
    ent = entropy.detach()
    if scope == "batch":
        thr = _quantile_threshold(ent.reshape(1, -1), valid.reshape(1, -1), keep_ratio)
        thr = thr.expand(ent.shape[0])
    elif scope == "sequence":
        thr = _quantile_threshold(ent, valid, keep_ratio)
    else:
        raise ValueError(f"scope must be 'batch' or 'sequence', got {scope!r}")
    return valid & (ent.double() >= thr[:, None])


@register("entropy-80-20", needs=("entropy",), paper="Wang et al. 2025, arXiv 2506.01939")
def entropy_80_20(batch: RolloutBatch, advantages: Tensor, keep_ratio: float = 0.2, scope: str = "batch") -> Tensor:
    """Â = A on the top-`keep_ratio` high-entropy tokens, 0 elsewhere (normaliser unchanged)."""
    keep = top_entropy_mask(batch.entropy, batch.mask, keep_ratio, scope)
    return advantages[:, None] * keep.to(advantages.dtype)

"""The 80/20 high-entropy rule (Wang et al. 2025, arXiv 2506.01939) and the kept set it defines.

Only the top `keep_ratio` fraction of the valid tokens by old-policy entropy get a gradient; the
loss normaliser stays the count of all valid tokens (as TRL's `top_entropy_quantile`). As a credit
method this is Â = A * keep: a zero advantage gives a zero loss term and zero gradient under every
ratio kernel, while the token still counts in the token-mean denominator. S-trace's kept set is the
same mask (`tokencredit.objectives.traces`).

The kept set has an exact size. The papers state the rule as "entropy >= the (1 - rho) quantile",
which keeps rho of the tokens only while entropies are distinct. A confident policy (late in
training, or any policy whose entropy is rounded by bf16 arithmetic) gives many *equal* entropies,
typically exact zeros; then the quantile is 0 and ``>=`` keeps every token, so the 80/20 rule and
S-trace silently become plain token-level training. `top_entropy_mask` therefore keeps exactly
k = ceil(keep_ratio * n) of the n valid tokens of each scope, ranked by entropy; among equal
entropies at the boundary the token that comes first in row-major (response, position) order is
kept. With distinct entropies and the default keep ratios (0.2, 0.5, 1) this is the same set the
linearly interpolated quantile threshold selects. With ``frame="proximal"`` the ranking is over PEPO's
proximal entropy instead of the raw one (PEPO, Kim & Kwak 2026, arXiv 2609.39402, Sec. 5.3 and Table 3:
"80/20 + proximal entropy", the top 20% of the batch by proximal entropy, nothing else changed);
`window` is its W. `entropy_from_logits` gives the entropy in float32
without the cancellation that zeroes small entropies in verl's and most trainers' formula.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tokencredit.batch import RolloutBatch
from tokencredit.credit.registry import register
from tokencredit.distributed import Shard, all_sum, global_top_k
from tokencredit.errors import ConfigError, closest

__all__ = [
    "DEFAULT_WINDOW",
    "FRAMES",
    "check_temperature",
    "check_window",
    "entropy_80_20",
    "entropy_from_logits",
    "entropy_kept_set",
    "keep_count",
    "proximal_entropy",
    "top_entropy_mask",
]

# The reference frame the kept set ranks entropies in: "global" compares raw entropies across the scope (the
# paper's rule); "proximal" compares PEPO's proximal entropy (each token's softmax share within a centred
# window of its own response, `proximal_entropy` below), which is blind to a response's
# overall entropy level (prompt difficulty) and to slow positional trends (PEPO, arXiv 2609.39402, Prop. 1).
FRAMES = ("global", "proximal")
DEFAULT_WINDOW = 101  # PEPO's W, in all of its experiments


def check_window(window: int, who: str) -> int:
    """floor(window / 2), the half width of PEPO's window W(t) = {k : |k - t| <= W / 2}; ConfigError unless
    window is a positive int."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ConfigError(f"{who}: window must be a positive integer (the paper's W = 101), got {window!r}")
    return window // 2


def _check_entropy(entropy: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    if entropy.shape != mask.shape or entropy.dim() != 2:
        raise ValueError(
            f"entropy {tuple(entropy.shape)} and mask {tuple(mask.shape)} must be the same shape [N, T]"
        )
    valid = mask.bool()
    ent = entropy.detach().double()
    bad = valid & ~torch.isfinite(ent)
    if bool(bad.any()):
        row, pos = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"entropy is {float(ent[row, pos])} at valid token (response {row}, position {pos}); "
            f"{int(bad.sum())} valid tokens have a non-finite entropy"
        )
    return torch.where(valid, ent, torch.zeros((), dtype=ent.dtype, device=ent.device)), valid


def _reflect_index(length: Tensor, width: int, half: int) -> Tensor:
    """int64 [N, width + 2 half]: for padded column j, the compact position j - half reflected into
    [0, length_i) (numpy's "reflect": the edge is not repeated; repeated for short rows; 0 for length <= 1)."""
    j = torch.arange(-half, width + half, device=length.device)[None, :]
    last = (length - 1).clamp(min=0)[:, None]
    period = (2 * last).clamp(min=1)
    m = torch.remainder(j, period)
    idx = torch.where(m <= last, m, period - m)
    return torch.where(last > 0, idx, torch.zeros_like(idx)).clamp(max=max(width - 1, 0))


def check_temperature(temperature: float, who: str) -> float:
    """temperature as a float; ConfigError unless it is finite and > 0."""
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, int | float)
        or not 0 < temperature < math.inf
    ):
        raise ConfigError(
            f"{who}: temperature must be a finite number > 0 (the paper's 1.0), got {temperature!r}"
        )
    return float(temperature)


def proximal_entropy(
    entropy: Tensor, mask: Tensor, window: int = DEFAULT_WINDOW, temperature: float = 1.0
) -> Tensor:
    """PEPO's proximal entropy e [N,T] float64 (Kim & Kwak 2026, arXiv 2609.39402, Eq. 6):

        e_t = exp(H_t / tau) / sum_{k in W(t)} exp(H_k / tau),   W(t) = {k : |k - t| <= window / 2},

    over the response's own valid tokens in order (a mask with holes is compacted first), the window
    reflect-padded at the response's first and last token as the paper's App. C.2 (numpy's "reflect": the
    edge token is not repeated; a response shorter than the half window repeats the reflection, our
    choice). tau = `temperature`: 1 in Eq. 6, swept over 0.5 / 1 / 2 in the paper's App. F.3.
    entropy [N,T] any float dtype, mask [N,T] bool/0-1. e is in (0, 1]; a constant row gives
    1 / (2 floor(window / 2) + 1); 0 where mask is False; a row never depends on its padding or other rows.
    Raises ValueError on a non-finite entropy at a valid token, ConfigError on a bad window.
    """
    half = check_window(window, "proximal_entropy")
    tau = check_temperature(temperature, "proximal_entropy")
    ent, valid = _check_entropy(entropy, mask)
    ent = ent / tau
    n, width = ent.shape
    if n == 0 or width == 0:
        return torch.zeros_like(ent)
    length = valid.sum(-1)
    # Valid tokens first, in order, so the window runs over the response's own tokens whatever the mask.
    order = torch.sort((~valid).to(torch.int8), dim=-1, stable=True).indices
    compact = ent.gather(-1, order)
    # exp(H / tau - row max): the softmax is shift invariant (Prop. 1 (i)); the clamp only guards inputs whose
    # H / tau lie more than 600 below the row's maximum (a real entropy is at most log V) from 0 / 0.
    top = torch.where(valid, ent, torch.full_like(ent, float("-inf"))).amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # a row without valid tokens
    expd = torch.exp((compact - top).clamp(min=-600.0))
    padded = expd.gather(-1, _reflect_index(length, width, half))
    denom = padded.unfold(-1, 2 * half + 1, 1).sum(-1)  # a strided view: no [N, T, W] copy
    e_compact = expd / denom
    out = torch.empty_like(ent).scatter_(-1, order, e_compact)
    return torch.where(valid, out, torch.zeros((), dtype=out.dtype, device=out.device))


def keep_count(n: Tensor, keep_ratio: float) -> Tensor:
    """k = ceil(keep_ratio * n) per scope, int64 like `n`.

    The product is rounded to 9 decimals first so that, e.g., 0.1 * 30 = 3.0000000000000004
    keeps 3 tokens, not 4.
    """
    return torch.ceil((n.double() * keep_ratio).round(decimals=9)).long()


def _top_k_rows(values: Tensor, valid: Tensor, keep_ratio: float) -> Tensor:
    """bool [R, L]: per row, the ceil(keep_ratio * n) largest valid `values` (n = valid count), ties
    broken towards the lower column index. values float [R, L], valid bool [R, L]."""
    k = keep_count(valid.sum(-1), keep_ratio)
    # Invalid entries sort last; a stable descending sort keeps equal values in column order.
    order = torch.sort(
        values.masked_fill(~valid, float("-inf")), dim=-1, descending=True, stable=True
    ).indices
    rank = torch.empty_like(order).scatter_(
        -1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order)
    )
    return valid & (rank < k[:, None])


def top_entropy_mask(
    entropy: Tensor,
    mask: Tensor,
    keep_ratio: float = 0.2,
    scope: str = "batch",
    *,
    shard: Shard | None = None,
) -> Tensor:
    """bool[N,T]: the top `keep_ratio` fraction of the valid tokens by entropy, exactly k of them.

    entropy [N,T] float (any dtype; compared in float32), mask [N,T] bool/0-1. scope="batch": one
    ranking over all valid tokens of the batch (the paper's rule), k = ceil(keep_ratio * n_valid);
    scope="sequence": one ranking per response. Ties at the boundary go to the token earlier in
    row-major order (lower response index, then lower position), so the set is deterministic and
    has exactly k tokens however many entropies are equal. keep_ratio = 1 keeps every valid token,
    keep_ratio = 0 none. Raises ValueError on a NaN or infinite entropy at a valid token.
    """
    if not 0.0 <= keep_ratio <= 1.0:
        raise ValueError(f"keep_ratio must be in [0, 1], got {keep_ratio}")
    if entropy.shape != mask.shape:
        raise ValueError(
            f"entropy {tuple(entropy.shape)} and mask {tuple(mask.shape)} must have the same shape"
        )
    if scope not in ("batch", "sequence"):
        raise ValueError(f"scope must be 'batch' or 'sequence', got {scope!r}")
    valid = mask.bool()
    ent = entropy.detach().float()
    bad = valid & ~torch.isfinite(ent)
    if bad.any():
        row, pos = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"entropy is {float(ent[row, pos])} at valid token (response {row}, position {pos}); "
            f"{int(bad.sum())} valid tokens have a non-finite entropy"
        )
    if scope == "batch" and shard is not None:
        n_valid = all_sum(valid.sum().to(torch.int64).reshape(1), shard)
        return global_top_k(ent, valid, int(keep_count(n_valid, keep_ratio)[0]), shard)
    if scope == "batch":
        return _top_k_rows(ent.reshape(1, -1), valid.reshape(1, -1), keep_ratio).reshape(valid.shape)
    return _top_k_rows(ent, valid, keep_ratio)


def entropy_from_logits(logits: Tensor, chunk_size: int = 4096) -> Tensor:
    """H = -sum_v p_v log p_v over the last dim, float32 [...] (logits [..., V], any float dtype).

    Computed as log s - sum_v e_v z_v / s with z = logits - max (float32), e = exp(z), s = sum e and
    log s = log c + log1p(r / c) (c: entries at the max, r: the sum of the others). The max term
    contributes exactly 0 and r is never added to 1 before the log, so a confident row
    (p_max = 1 - 1e-8) keeps its small positive entropy to float32 relative accuracy, where
    logsumexp(z) - sum(softmax(z) z) (verl's formula) cancels to 0 in float32 or bf16. Rows are processed `chunk_size` at a time: at most a few [chunk_size, V]
    float32 buffers exist at once. No gradient (the kept set is a detached statistic).
    """
    flat = logits.detach().reshape(-1, logits.shape[-1])
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
    with torch.no_grad(), torch.autocast(logits.device.type, enabled=False):
        for start in range(0, flat.shape[0], chunk_size):
            z = flat[start : start + chunk_size].float()
            z = z - z.amax(-1, keepdim=True)
            top = z == 0  # the maximum (and any tie with it): e = 1 there
            count = top.sum(-1).float()
            e = z.exp()
            rest = e.masked_fill(top, 0.0).sum(-1)  # s = count + rest without rounding 1 + 1e-9 to 1
            log_s = count.log() + torch.log1p(rest / count)
            out[start : start + chunk_size] = log_s - e.mul_(z).sum(-1) / (count + rest)
    return out.reshape(logits.shape[:-1])


def entropy_kept_set(
    batch: RolloutBatch,
    keep_ratio: float,
    scope: str,
    frame: str,
    window: int,
    temperature: float,
    who: str,
    reader: str,
) -> Tensor:
    """The kept set [N,T] bool of the entropy-selected methods (the 80/20 rule, S-trace's): the top
    `keep_ratio` of the old policy's valid tokens by entropy within `scope`, ranked in `frame`.

    frame="global" ranks raw entropies (the 80/20 paper's rule); "proximal" ranks PEPO's proximal entropy
    (Eq. 6) with its `window` and `temperature`, which are read only then but always validated. `who` names
    the method in a configuration error, `reader` the reader of the entropy signal in a missing-signal one."""
    if frame not in FRAMES:
        raise ConfigError(
            f"{who}: unknown frame {frame!r}{closest(str(frame), FRAMES)}; known: {', '.join(FRAMES)}"
        )
    check_window(window, who)
    check_temperature(temperature, who)
    entropy = batch.signal("entropy", reader)
    if frame == "proximal":
        entropy = proximal_entropy(entropy, batch.mask, window, temperature)
    return top_entropy_mask(entropy, batch.mask, keep_ratio, scope, shard=batch.shard)


@register("entropy-80-20", needs=("entropy",), paper="Wang et al. 2025, arXiv 2506.01939")
def entropy_80_20(
    batch: RolloutBatch,
    advantages: Tensor,
    keep_ratio: float = 0.2,
    scope: str = "batch",
    frame: str = "global",
    window: int = DEFAULT_WINDOW,
    temperature: float = 1.0,
) -> Tensor:
    """Â = A on the top-`keep_ratio` high-entropy tokens (exactly ceil(keep_ratio * n)), 0 elsewhere.

    frame="global" ranks raw entropies (the paper); "proximal" ranks PEPO's proximal entropy with its
    `window` and `temperature` (read only then, always validated)."""
    keep = entropy_kept_set(
        batch, keep_ratio, scope, frame, window, temperature, "entropy-80-20", "credit method 'entropy-80-20'"
    )
    return advantages[:, None] * keep.to(advantages.dtype)

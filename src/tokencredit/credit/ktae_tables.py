"""KTAE's per-table statistics: the two-sided Fisher exact p-value (exact, or the official code's float32
quirk), information gain and Cohen's h of 2x2 presence tables, tabulated once per (G, N_T) combo.

See `tokencredit.credit.ktae` for how the key value combines them (docs/spec/ktae.md#contingency-statistics).
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from tokencredit.errors import ConfigError, closest

__all__ = ["FISHER_MODES", "fisher_pvalue", "fisher_pvalue_official_fp32", "table_statistics"]

FISHER_MODES = ("exact", "official-fp32")
# Relative tolerance of the two-sided Fisher test when comparing table probabilities
# (the comparison P(k) <= P(a) * (1 + 1e-7) used by R and older scipy).
_FISHER_RTOL = 1e-7


def _log_comb(n: Tensor, k: Tensor) -> Tensor:
    return torch.lgamma(n + 1) - torch.lgamma(k + 1) - torch.lgamma(n - k + 1)


def fisher_pvalue(a: Tensor, b: Tensor, c: Tensor, d: Tensor) -> Tensor:
    """Two-sided Fisher exact p-value of 2x2 tables [[a, b], [c, d]], float64 [M].

    p = sum of P(k) over all tables with the same margins and P(k) <= P(a) * (1 + 1e-7),
    P(k) = C(c1, k) C(n - c1, r1 - k) / C(n, r1), r1 = a + b, c1 = a + c, n = a + b + c + d,
    computed in log space with lgamma in float64. p is exactly 1.0 when every table of the
    support is counted (no association at all).
    """
    a, b, c, d = (x.to(torch.float64) for x in (a, b, c, d))
    r1, c1 = a + b, a + c
    n = r1 + c + d
    lo = torch.clamp(r1 + c1 - n, min=0)
    hi = torch.minimum(r1, c1)
    width = int(n.max().item()) + 1 if n.numel() else 1
    k = torch.arange(width, dtype=torch.float64, device=a.device)[None, :]
    support = (k >= lo[:, None]) & (k <= hi[:, None])
    log_norm = _log_comb(n, r1)[:, None]
    logp = _log_comb(c1[:, None], k) + _log_comb((n - c1)[:, None], r1[:, None] - k) - log_norm
    logp_obs = _log_comb(c1, a) + _log_comb(n - c1, r1 - a) - log_norm[:, 0]
    counted = support & (logp <= (logp_obs + math.log1p(_FISHER_RTOL))[:, None])
    total = torch.where(counted, torch.exp(torch.where(support, logp, 0.0)), 0.0).sum(1)
    everything = (counted == support).all(1)
    return torch.where(everything, torch.ones_like(total), total.clamp(max=1.0))


def fisher_pvalue_official_fp32(a: Tensor, b: Tensor, c: Tensor, d: Tensor) -> Tensor:
    """Two-sided Fisher p-value as the official KTAE code computes it: float32, no tolerance [M].

    This reproduces a quirk, not the intended maths: the float32 lgamma sums and the exact
    comparison P(k) <= P(a) make many tables whose exact p-value is 1 come out as 0.99999988
    or 1.0000005, so their F = exp(-2p) is ~0.135 instead of 0. Tables are evaluated on a grid
    k = 0..c1 (the width the official code uses whenever some id occurs in at least c1
    rollouts of the group) and summed with torch's float32 reduction over that grid, so the
    bits match the official code run with the same torch build on the same device class.
    Returned as float32 values.
    """
    a, b, c, d = (x.to(torch.float32) for x in (a, b, c, d))
    out = torch.empty(a.shape, dtype=torch.float32, device=a.device)
    c1_all = a + c
    # One batched evaluation per grid width (<= G + 1 distinct widths): the float32 reduction
    # order depends on the row length, so rows are never padded to a common width.
    for c1_val in torch.unique(c1_all).tolist():
        sel = c1_all == c1_val
        ta, tb, tc, td = a[sel], b[sel], c[sel], d[sel]
        r1, c1 = ta + tb, ta + tc
        n = r1 + tc + td
        lo = torch.clamp(r1 + c1 - n, min=0)
        hi = torch.minimum(r1, c1)
        k = torch.arange(int(c1_val) + 1, dtype=torch.float32, device=a.device)[None, :]
        support = (k >= lo[:, None]) & (k <= hi[:, None])
        logp = (
            _log_comb(c1[:, None], k)
            + _log_comb((n - c1)[:, None], r1[:, None] - k)
            - _log_comb(n[:, None], r1[:, None])
        )
        pk = torch.exp(logp) * support.float()
        p_obs = torch.exp(_log_comb(c1, ta) + _log_comb(n - c1, r1 - ta) - _log_comb(n, r1))
        out[sel] = torch.where((pk <= p_obs[:, None]) & support, pk, 0.0).sum(1)
    return out


def _binary_entropy_bits(p: Tensor) -> Tensor:
    """H(p) in bits, elementwise: -(p log p + q log q) / log 2 with q = 1 - p (0 log 0 = 0 through xlogy)."""
    q = 1.0 - p
    # torch.special's functions are untyped (they return Any): the annotation types the result
    nats: Tensor = -(torch.special.xlogy(p, p) + torch.special.xlogy(q, q))
    return nats / math.log(2.0)


def table_statistics(
    n: Tensor, n_true: Tensor, a: Tensor, b: Tensor, fisher: str = "exact"
) -> tuple[Tensor, Tensor, Tensor]:
    """(F, IG, h) float64 [M] for presence tables given by group size n, correct count n_true,
    and a / b = correct / wrong rollouts containing the id. Requires 0 < n_true < n.
    """
    n, n_true, a, b = (x.to(torch.float64) for x in (n, n_true, a, b))
    n_false = n - n_true
    c, d = n_true - a, n_false - b
    if fisher == "exact":
        p = fisher_pvalue(a, b, c, d)
        f_score = torch.where(p == 1.0, torch.zeros_like(p), torch.exp(-2.0 * p))
    elif fisher == "official-fp32":
        p32 = fisher_pvalue_official_fp32(a, b, c, d)
        p = p32.double()
        f_score = torch.where(p32 == 1.0, torch.zeros_like(p), torch.exp(-2.0 * p))
    else:
        raise ConfigError(
            f"fisher must be one of {FISHER_MODES}, got {fisher!r}{closest(str(fisher), FISHER_MODES)}"
        )

    present, absent = a + b, c + d
    h_y = _binary_entropy_bits(n_true / n)
    h_present = torch.where(present > 0, _binary_entropy_bits(a / present.clamp(min=1)), 0.0)
    h_absent = torch.where(absent > 0, _binary_entropy_bits(c / absent.clamp(min=1)), 0.0)
    info_gain = h_y - (present / n) * h_present - (absent / n) * h_absent

    p_true = (a / (n_true + 1e-10)).clamp(0.0, 1.0)
    p_false = (b / (n_false + 1e-10)).clamp(0.0, 1.0)
    cohen = torch.asin(torch.sqrt(p_true)) - torch.asin(torch.sqrt(p_false))
    return f_score, info_gain, cohen


@functools.lru_cache(maxsize=4096)
def _combo_table(n: int, n_true: int, fisher: str, alpha: float, beta: float) -> Tensor:
    """[2, (n_true+1) * (n-n_true+1)] float64 CPU: strength S and Cohen h for every (a, b),
    entry a * (n - n_true + 1) + b. Cached: a run sees few (G, N_T) combos, so after the first
    steps the per-table statistics cost nothing. Treat the result as read-only.
    """
    a, b = torch.meshgrid(torch.arange(n_true + 1), torch.arange(n - n_true + 1), indexing="ij")
    a, b = a.flatten(), b.flatten()
    f_score, info_gain, cohen = table_statistics(
        torch.full_like(a, n), torch.full_like(a, n_true), a, b, fisher=fisher
    )
    return torch.stack([(alpha * f_score + beta * info_gain) / (alpha + beta), cohen])

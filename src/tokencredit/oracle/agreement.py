"""How a method's credit Â matches the Monte-Carlo A* on the same rollouts: rank correlation (pooled and
per response), sign agreement and |Â| share on the significant tokens, and blame@k's oracle target."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tokencredit.oracle.values import OracleCredit

__all__ = ["average_ranks", "fidelity", "oracle_targets", "spearman"]


def average_ranks(x: Tensor) -> Tensor:
    """float64 ranks 1..n of a 1-D tensor, tied values sharing their average rank."""
    v = x.detach().double().flatten()
    order = torch.argsort(v, stable=True)
    _, inverse, counts = torch.unique(v[order], return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    avg = ends - (counts.double() - 1) / 2  # mean of the positions start+1 .. end of each run
    ranks = torch.empty_like(v)
    ranks[order] = avg[inverse]
    return ranks


def spearman(x: Tensor, y: Tensor) -> float | None:
    """Spearman rank correlation of two 1-D tensors (Pearson of average ranks); None when there are
    fewer than 2 values or either is constant (undefined)."""
    if x.numel() != y.numel():
        raise ValueError(f"spearman: {x.numel()} vs {y.numel()} values")
    if x.numel() < 2:
        return None
    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = float(torch.sqrt((rx * rx).sum() * (ry * ry).sum()))
    return None if den == 0.0 else float((rx * ry).sum()) / den


def oracle_targets(credit: OracleCredit, z: float = 2.0) -> Tensor:
    """[N] int64: each response's most negative A* position when that A* is significantly negative
    (A* < 0 and |A*| > z se), else -1 (the first such position on ties): blame@k's target."""
    a = torch.where(credit.mask, credit.advantages.double(), math.inf)
    low, pos = a.min(1)
    se = credit.stderr.double().gather(1, pos[:, None]).squeeze(1)
    ok = (low < 0) & (low.abs() > z * se) & ~credit.skipped.gather(1, pos[:, None]).squeeze(1)
    return torch.where(ok, pos, -1)


def fidelity(
    adv_hat: Tensor, credit: OracleCredit, *, z: float = 2.0, rows: Tensor | None = None
) -> dict[str, float | int | None]:
    """How a method's per-token credit Â [N,T] matches A* on the same rollouts (valid tokens of `rows`,
    bool [N], default all). Float statistics in float64.

    spearman: rank correlation of Â and A* pooled over the tokens (average ranks on ties; skipped
      positions enter with their A* = 0). spearman_per_response: mean of each response's own rank
      correlation over the responses where both are non-constant (`responses` of them; None when
      there is none: e.g. uniform credit). sign_agreement: share of the significant tokens
      (|A*| > z se, estimated) where sign(Â) = sign(A*), Â = 0 counting as disagreement.
      significant_share: share of sum |Â| on the significant tokens (None when sum |Â| = 0);
      significant_tokens / tokens: counts.
    """
    m = credit.mask.bool()
    if tuple(adv_hat.shape) != tuple(m.shape):
        raise ValueError(
            f"fidelity: Â shape {tuple(adv_hat.shape)} differs from the oracle's {tuple(m.shape)}"
        )
    if rows is not None:
        m = m & rows.bool().cpu()[:, None]
    ah = adv_hat.detach().double().cpu()
    bad = m & ~torch.isfinite(ah)
    if bool(bad.any()):
        i, j = (int(v) for v in bad.nonzero()[0])
        raise ValueError(f"fidelity: non-finite credit at rollout {i}, token {j}")
    a = credit.advantages.double()
    sig = credit.significant(z) & m
    per = [spearman(ah[i][m[i]], a[i][m[i]]) for i in range(m.shape[0]) if bool(m[i].any())]
    per = [r for r in per if r is not None]
    mass = float(ah.abs()[m].sum())
    n_sig = int(sig.sum())
    return {
        "spearman": spearman(ah[m], a[m]),
        "spearman_per_response": sum(per) / len(per) if per else None,
        "responses": len(per),
        "sign_agreement": float(((ah * a)[sig] > 0).double().mean()) if n_sig else None,
        "significant_share": float(ah.abs()[sig].sum()) / mass if mass > 0 else None,
        "significant_tokens": n_sig,
        "tokens": int(m.sum()),
    }

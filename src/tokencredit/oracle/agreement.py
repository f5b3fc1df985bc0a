"""How a method's credit Â matches the Monte-Carlo A* on the same rollouts: rank correlation (pooled and
per response), sign agreement and |Â| share on the significant tokens, and blame@k's oracle target."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tokencredit.oracle.values import OracleCredit

__all__ = ["average_ranks", "fidelity", "fidelity_stderr", "oracle_targets", "spearman"]


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


def _checked(
    adv_hat: Tensor, credit: OracleCredit, rows: Tensor | None, who: str
) -> tuple[Tensor, Tensor, Tensor]:
    """(Â float64, A* float64, mask bool restricted to `rows`) after checking shape and finiteness."""
    m = credit.mask.bool()
    if tuple(adv_hat.shape) != tuple(m.shape):
        raise ValueError(f"{who}: Â shape {tuple(adv_hat.shape)} differs from the oracle's {tuple(m.shape)}")
    if rows is not None:
        m = m & rows.bool().cpu()[:, None]
    ah = adv_hat.detach().double().cpu()
    bad = m & ~torch.isfinite(ah)
    if bool(bad.any()):
        i, j = (int(v) for v in bad.nonzero()[0])
        raise ValueError(f"{who}: non-finite credit at rollout {i}, token {j}")
    return ah, credit.advantages.double(), m


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
    ah, a, m = _checked(adv_hat, credit, rows, "fidelity")
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


FIDELITY_STATS = ("spearman", "spearman_per_response", "sign_agreement", "significant_share")


def _ratio(num: Tensor, den: Tensor) -> Tensor:
    """[B] num / den, NaN where den = 0 (the statistic is undefined on that resample)."""
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.nan)


def fidelity_stderr(
    adv_hat: Tensor,
    credit: OracleCredit,
    groups: Tensor,
    *,
    z: float = 2.0,
    resamples: int = 200,
    seed: int = 0,
) -> dict[str, float | None]:
    """Bootstrap standard errors of `fidelity`'s four statistics, resampling whole groups.

    The rollouts of one problem share its prompt and its A* baseline, so they are not independent:
    each resample draws as many groups as there are, with replacement, and takes all their rows
    (a cluster bootstrap). groups [N] int64: each row's problem. The same `seed` draws the same
    resamples for every method, so their SEs are paired. Keys `<stat>_se` for FIDELITY_STATS: the
    standard deviation over the resamples where the statistic is defined; None with fewer than 2
    groups, `resamples` < 2 or fewer than 2 defined resamples.
    """
    ah, a, m = _checked(adv_hat, credit, None, "fidelity_stderr")
    keys = [f"{k}_se" for k in FIDELITY_STATS]
    _, gid = torch.unique(groups.cpu(), return_inverse=True)
    n_groups = int(gid.max()) + 1 if gid.numel() else 0
    if n_groups < 2 or resamples < 2:
        return dict.fromkeys(keys)
    g = torch.Generator().manual_seed(seed)
    draws = torch.randint(n_groups, (resamples, n_groups), generator=g)
    # weights [B,N]: how many times each row is drawn in each resample
    per_group = torch.zeros(resamples, n_groups, dtype=torch.float64)
    per_group.scatter_add_(1, draws, torch.ones(resamples, n_groups, dtype=torch.float64))
    w = per_group[:, gid]
    # The three ratio statistics are sums over rows, so each row's terms are computed once.
    sig = (credit.significant(z) & m).double()
    agree = (((ah * a) > 0).double() * sig).sum(1)
    mass = (ah.abs() * m).sum(1)
    sig_mass = (ah.abs() * sig).sum(1)
    rho = torch.tensor(
        [math.nan if (r := spearman(ah[i][m[i]], a[i][m[i]])) is None else r for i in range(m.shape[0])],
        dtype=torch.float64,
    )
    has_rho = ~torch.isnan(rho)
    stats = {
        "spearman_per_response": _ratio((w * torch.where(has_rho, rho, 0.0)).sum(1), (w * has_rho).sum(1)),
        "sign_agreement": _ratio(w @ agree, w @ sig.sum(1)),
        "significant_share": _ratio(w @ sig_mass, w @ mass),
    }
    pooled = []
    for b in range(resamples):
        reps = w[b].long()[:, None].expand_as(m)[m]  # each valid token repeated as often as its row
        r = spearman(ah[m].repeat_interleave(reps), a[m].repeat_interleave(reps))
        pooled.append(math.nan if r is None else r)
    stats["spearman"] = torch.tensor(pooled, dtype=torch.float64)
    out: dict[str, float | None] = {}
    for k in FIDELITY_STATS:
        v = stats[k][~torch.isnan(stats[k])]
        out[f"{k}_se"] = float(v.std()) if v.numel() >= 2 else None
    return out

"""Where does the credit go? Concentration and placement diagnostics for any token weights.

- `gini`, `effective_token_ratio` (docs/spec/arca.md#concentration-diagnostics): per completion, on its valid tokens, weights
  normalised to sum 1. For advantage-shaped methods (KTAE, DelTA, ...) use `credit_weights(Â)`,
  i.e. |Â| normalised per completion.
- `entropy_share`: share of |Â| mass on high- vs low-entropy tokens (80/20 split by default).
- `quadrants`: the four-quadrant breakdown advantage sign x entropy (He et al. 2026, arXiv
  2604.11056), as shares of |Â| mass.
- `sign_flip_rate`: share of tokens whose credit has the opposite sign of their rollout's A.
- `rank_correlation`: per-completion Spearman correlation between two methods' token credits.
All outputs are float64 on CPU-friendly small tensors; rows without mass are documented below.

`summary` (and the shares and rates it is made of) takes a `shard` for a batch split across ranks
(`tokencredit.distributed`): each mean and share is then the whole batch's, from sums all-reduced over
the ranks (a few float64 scalars), and the high-entropy set is the batch's exact global top 20%.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tokencredit.credit.entropy import top_entropy_mask
from tokencredit.distributed import Shard, all_sum


def credit_weights(advantages: Tensor, mask: Tensor) -> Tensor:
    """[N,T] |Â| normalised to sum 1 over each completion's valid tokens (rows without mass stay 0)."""
    m = mask.bool()
    a = torch.where(m, advantages.detach().double().abs(), torch.zeros((), dtype=torch.float64))
    s = a.sum(-1, keepdim=True)
    return torch.where(s > 0, a / s.clamp(min=1e-300), torch.zeros_like(a))


def _normalised(weights: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    m = mask.bool()
    w = weights.detach().double()
    if bool((w[m] < 0).any()):
        raise ValueError(
            "weights must be >= 0 on valid tokens; use credit_weights(advantages, mask) for signed credit"
        )
    w = torch.where(m, w, torch.zeros((), dtype=torch.float64))
    total = w.sum(-1)
    n = m.sum(-1)
    return w / total.clamp(min=1e-300)[:, None], total, n


def gini(weights: Tensor, mask: Tensor) -> Tensor:
    """[N] weight Gini per completion: sort ascending x_1..x_n, G = sum_i (2i - n - 1) x_i / (n sum x).

    0 = uniform, (n-1)/n = all mass on one token. Rows with n <= 1 or without mass give 0
    (use `mean_over_defined` to skip them when averaging).
    """
    w, total, n = _normalised(weights, mask)
    m = mask.bool()
    # valid weights first in ascending order, padding (set to +inf) last; then padding back to 0
    srt, _ = torch.sort(torch.where(m, w, torch.full_like(w, float("inf"))), dim=-1)
    srt = torch.where(torch.isinf(srt), torch.zeros_like(srt), srt)
    i = torch.arange(1, w.shape[-1] + 1, dtype=torch.float64, device=w.device)
    nn = n.double()[:, None]
    coef = torch.where(i[None, :] <= nn, 2 * i[None, :] - nn - 1, torch.zeros_like(srt))
    g = (coef * srt).sum(-1) / n.double().clamp(min=1)
    # clamp: a uniform row can come out as -1e-17 from rounding
    return torch.where((n > 1) & (total > 0), g.clamp(min=0.0), torch.zeros_like(g))


def effective_token_ratio(weights: Tensor, mask: Tensor) -> Tensor:
    """[N] EffN/T = 1 / (T sum_t w_t^2) with w normalised per completion; 1 = uniform, 1/T = one-hot.

    Rows without valid tokens or without mass give 1 (treated as uniform).
    """
    w, total, n = _normalised(weights, mask)
    r = 1.0 / (n.double() * (w * w).sum(-1)).clamp(min=1e-300)
    return torch.where((n > 0) & (total > 0), r, torch.ones_like(r))


def defined_rows(weights: Tensor, mask: Tensor, min_tokens: int = 2) -> Tensor:
    """bool[N]: rows with >= min_tokens valid tokens and positive mass (those the means use)."""
    m = mask.bool()
    w = torch.where(m, weights.detach().double().abs(), torch.zeros((), dtype=torch.float64))
    return (m.sum(-1) >= min_tokens) & (w.sum(-1) > 0)


def mean_over_defined(values: Tensor, rows: Tensor) -> float:
    """Mean of `values` over `rows` (bool[N]); 0.0 when no row is defined."""
    return float(values[rows].mean()) if bool(rows.any()) else 0.0


# The sign x entropy quadrants of `quadrants`, in the order of `_quadrant_mass`.
QUADRANTS = ("pos_high", "pos_low", "neg_high", "neg_low")


def _quadrant_mass(
    advantages: Tensor, entropy: Tensor, mask: Tensor, keep_ratio: float, scope: str, shard: Shard | None
) -> Tensor:
    """float64 [5]: this rank's |Â| mass on pos_high, pos_low, neg_high, neg_low tokens, and in all (`QUADRANTS`)."""
    m = mask.bool()
    high = top_entropy_mask(entropy, m, keep_ratio, scope, shard=shard)
    a = advantages.detach().double()
    mass = torch.where(m, a.abs(), torch.zeros((), dtype=torch.float64, device=a.device))
    parts = [mass[sign & ent].sum() for sign in (a > 0, a < 0) for ent in (high, m & ~high)]
    return torch.stack([*parts, mass.sum()])


def _quadrant_shares(mass: Tensor) -> dict[str, float]:
    total = float(mass[-1])
    return {k: float(v) / total if total > 0 else 0.0 for k, v in zip(QUADRANTS, mass[:-1].tolist())}


def entropy_share(
    advantages: Tensor,
    entropy: Tensor,
    mask: Tensor,
    keep_ratio: float = 0.2,
    scope: str = "batch",
    *,
    shard: Shard | None = None,
) -> dict[str, float]:
    """Share of total |Â| mass on the top-`keep_ratio` entropy tokens ("high") and the rest ("low").

    With `shard`, of the whole batch split across ranks (collective)."""
    q = _quadrant_shares(all_sum(_quadrant_mass(advantages, entropy, mask, keep_ratio, scope, shard), shard))
    if not any(q.values()):
        return {"high": 0.0, "low": 0.0}
    high = q["pos_high"] + q["neg_high"]
    return {"high": high, "low": 1.0 - high}


def quadrants(
    advantages: Tensor,
    entropy: Tensor,
    mask: Tensor,
    keep_ratio: float = 0.2,
    scope: str = "batch",
    *,
    shard: Shard | None = None,
) -> dict[str, float]:
    """Share of |Â| mass per quadrant (sign of Â) x (high/low entropy); keys pos_high, pos_low, neg_high, neg_low.

    High entropy = top `keep_ratio` of valid tokens (as the 80/20 rule). Shares sum to 1 (all 0 without mass).
    With `shard`, of the whole batch split across ranks (collective).
    """
    return _quadrant_shares(
        all_sum(_quadrant_mass(advantages, entropy, mask, keep_ratio, scope, shard), shard)
    )


def _sign_flip_counts(token_advantages: Tensor, seq_advantages: Tensor, mask: Tensor) -> Tensor:
    """float64 [2]: flipped tokens, and valid tokens of rollouts with A != 0 (`sign_flip_rate`)."""
    m = mask.bool() & (seq_advantages != 0)[:, None]
    flips = (torch.sign(token_advantages) * torch.sign(seq_advantages)[:, None]) < 0
    return torch.stack([(flips & m).sum(), m.sum()]).double()


def sign_flip_rate(
    token_advantages: Tensor, seq_advantages: Tensor, mask: Tensor, *, shard: Shard | None = None
) -> float:
    """Share of valid tokens (of rollouts with A != 0) whose Â has the opposite sign of their rollout's A.

    With `shard`, of the whole batch split across ranks (collective)."""
    flips, n = all_sum(_sign_flip_counts(token_advantages, seq_advantages, mask), shard).tolist()
    return flips / n if n > 0 else 0.0


def _row_ranks(x: Tensor, mask: Tensor) -> Tensor:
    """Average ranks (1-based, ties get their mean rank) of each row's valid entries; 0 on padding."""
    m = mask.bool()
    xd = torch.where(m, x.double(), torch.full_like(x, float("inf"), dtype=torch.float64))
    order = torch.argsort(xd, dim=-1, stable=True)
    srt = torch.gather(xd, -1, order)
    n, t = x.shape
    pos = torch.arange(1, t + 1, dtype=torch.float64, device=x.device).expand(n, t)
    # tie groups: a new group starts where the sorted value changes
    new = torch.ones_like(srt, dtype=torch.bool)
    new[:, 1:] = srt[:, 1:] != srt[:, :-1]
    gid = new.long().cumsum(-1) - 1
    g_sum = torch.zeros(n, t, dtype=torch.float64, device=x.device).scatter_add_(-1, gid, pos)
    g_cnt = torch.zeros(n, t, dtype=torch.float64, device=x.device).scatter_add_(
        -1, gid, torch.ones_like(pos)
    )
    avg = torch.gather(g_sum / g_cnt.clamp(min=1), -1, gid)
    ranks = torch.zeros(n, t, dtype=torch.float64, device=x.device).scatter_(-1, order, avg)
    return torch.where(m, ranks, torch.zeros_like(ranks))


def rank_correlation(a: Tensor, b: Tensor, mask: Tensor) -> Tensor:
    """[N] Spearman correlation between two token-credit tensors per completion (0 when undefined)."""
    m = mask.bool()
    ra, rb = _row_ranks(a.detach(), m), _row_ranks(b.detach(), m)
    n = m.sum(-1).double().clamp(min=1)
    ma = ra.sum(-1) / n
    mb = rb.sum(-1) / n
    da = torch.where(m, ra - ma[:, None], torch.zeros_like(ra))
    db = torch.where(m, rb - mb[:, None], torch.zeros_like(rb))
    cov = (da * db).sum(-1)
    den = (da.square().sum(-1) * db.square().sum(-1)).sqrt()
    return torch.where(den > 0, cov / den.clamp(min=1e-300), torch.zeros_like(cov))


def summary(
    token_advantages: Tensor,
    mask: Tensor,
    seq_advantages: Tensor,
    entropy: Tensor | None = None,
    *,
    shard: Shard | None = None,
) -> dict[str, float]:
    """Per-step credit diagnostics: mean Gini and EffN/T of |Â| (defined rows), sign flips, entropy shares.

    token_advantages, mask, entropy [N,T], seq_advantages [N]. With `shard` the rows are this rank's slice of
    a batch split across ranks and every value is the whole batch's: one all-reduce of 5 (with the entropy 10)
    float64 sums, plus the global top-k of the high-entropy set; every rank must call it (collective).
    """
    w = credit_weights(token_advantages, mask)
    rows = defined_rows(w, mask)
    zero = torch.zeros((), dtype=torch.float64, device=w.device)
    local = [
        torch.where(rows, gini(w, mask), zero).sum(),
        torch.where(rows, effective_token_ratio(w, mask), zero).sum(),
        rows.sum().double(),
        *_sign_flip_counts(token_advantages, seq_advantages, mask),
    ]
    if entropy is not None:
        local += list(_quadrant_mass(token_advantages, entropy, mask, 0.2, "batch", shard))
    sums = all_sum(torch.stack(local), shard).tolist()
    gini_sum, eff_sum, n_rows, flips, n_flip = sums[:5]
    out = {
        "credit_gini": gini_sum / n_rows if n_rows > 0 else 0.0,
        "credit_eff_ratio": eff_sum / n_rows if n_rows > 0 else 1.0,
        "credit_sign_flip": flips / n_flip if n_flip > 0 else 0.0,
    }
    if entropy is not None:
        q = _quadrant_shares(torch.tensor(sums[5:], dtype=torch.float64))
        out["credit_high_entropy_share"] = q["pos_high"] + q["neg_high"]
        out.update({f"credit_q_{k}": v for k, v in q.items()})
    return out

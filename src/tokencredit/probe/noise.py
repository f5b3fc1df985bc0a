"""Noise decomposition of a credit's per-problem gradient, from two independent groups per problem.

Let g = g(Â) be the policy gradient (`gradients.policy_gradient`) of one group of G rollouts of a
problem x, with x drawn from the probed problems and the group from the policy. Its second moment splits as

    E|g|^2 = |E g|^2 + (E|E[g|x]|^2 - |E g|^2) + (E|g|^2 - E|E[g|x]|^2)
           = signal  +  between-problem variance  +  within-problem variance

The within-problem part is the noise of the rollouts (and of the credit's own estimate); a better token
credit can only lower that part. The between-problem part is the spread of the problems' own expected
gradients: no credit, exact or not, removes it, only more problems per batch do. With `--two-groups` the
probe samples two independent groups a, b of G rollouts per problem (each its own group baseline), and
with X problems and per-problem gradients g_xa, g_xb, h_x = (g_xa + g_xb) / 2:

    E|g|^2        ≈ D = mean_x (|g_xa|^2 + |g_xb|^2) / 2          (the diagonal)
    E|E[g|x]|^2   ≈ W = mean_x g_xa·g_xb                          (a, b independent given x)
    |E g|^2       ≈ S = Σ_{x != x'} h_x·h_x' / (X (X - 1))         (different problems are independent)

each unbiased; the shares of E|g|^2 are signal S / D, between (W - S) / D and within (D - W) / D (they sum
to 1; an estimate may fall below 0 or past 1 by its noise and is not clamped). S is computed from the
blocks' sums H_b = Σ_{x in b} h_x (the probe's gradient batches, which keep those vectors anyway) as
(Σ_{b,b'} H_b·H_b' - Σ_x |h_x|^2) / (X (X - 1)), so only per-problem scalars and the [B, B] Gram are needed.

A*'s Monte-Carlo part. The oracle's A* from K continuations is the mean of A*_1 and A*_2 from each half
(`OracleCredit.half_advantages`), so g* = g_true + (n_1 + n_2) / 2 with independent half noises of equal
size s^2, and E|g(A*_1) - g(A*_2)|^2 = 2 s^2 while g*'s own noise has s^2 / 2: the Monte-Carlo part of
E|g*|^2 is M = mean_{x, c} |g(A*_1)_xc - g(A*_2)_xc|^2 / 4, a piece of g*'s within-problem share (the
noises of two groups are independent, so W carries none of it).

The per-problem cosine cos(E[g|x], E[g_ref|x]) ≈ Σ_x (g_xa·r_xb + g_xb·r_xa) / 2 / sqrt(Σ_x W_x Σ_x W_ref,x)
compares what a credit and a reference do on average on each problem, free of the within-problem noise.
One batch of n problems has the signal share n s / (1 + (n - 1) s) for the per-problem share s.

Every figure is given with the delete-one-block jackknife's standard error (`expected.jackknife`, B >= 3).
The problems are all the probed ones: a problem whose groups carry no credit (no mixed group, no A*) adds
zero gradients, as it adds nothing to a training batch's gradient.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from tokencredit.probe.expected import Gram, jackknife

__all__ = ["BLOCK_KEYS", "batch_signal_share", "conditional_cosine", "decomposition", "paired_difference"]

BLOCK_KEYS = ("n", "d", "w", "hh")
"""Per-block sums over its problems x: n (problems), d ((|g_xa|^2 + |g_xb|^2) / 2), w (g_xa·g_xb),
hh (|h_x|^2); optional: mc (A*'s (|δ_xa|^2 + |δ_xb|^2) / 8, δ the halves' gradient difference) and
cross_<ref> ((g_xa·r_xb + g_xb·r_xa) / 2 with a reference r)."""


def _sum(blocks: Sequence[Mapping[str, float]], key: str, idx: Sequence[int]) -> float:
    return sum(float(blocks[i].get(key, 0.0)) for i in idx)


def _moments(
    blocks: Sequence[Mapping[str, float]], gram: Gram, idx: Sequence[int]
) -> tuple[float, float, float, float, float] | None:
    """(X, D, W, S, M) over the blocks `idx` (module docstring); None below 2 problems or where D <= 0."""
    x = _sum(blocks, "n", idx)
    d = _sum(blocks, "d", idx)
    if x < 2 or d <= 0.0:
        return None
    total = sum(gram[i][j] for i in idx for j in idx)
    s = (total - _sum(blocks, "hh", idx)) / (x * (x - 1))
    m = _sum(blocks, "mc", idx) if all("mc" in blocks[i] for i in idx) else 0.0
    return x, d / x, _sum(blocks, "w", idx) / x, s, m / x


def _share(part: str, blocks: Sequence[Mapping[str, float]], gram: Gram, idx: Sequence[int]) -> float | None:
    got = _moments(blocks, gram, list(idx))
    if got is None:
        return None
    _, d, w, s, m = got
    return {"signal": s, "between": w - s, "within": d - w, "monte_carlo": m}[part] / d


def _moment(part: str, blocks: Sequence[Mapping[str, float]], gram: Gram, idx: Sequence[int]) -> float | None:
    got = _moments(blocks, gram, list(idx))
    if got is None:
        return None
    _, d, w, s, _m = got
    return {"mean_square": d, "conditional": w, "signal": s}[part]


def batch_signal_share(share: float | None, problems: int) -> float | None:
    """n s / (1 + (n - 1) s): the signal share of the sum of n independent problems' gradients whose
    per-problem share is s; None when s is None or the denominator is <= 0."""
    if share is None:
        return None
    den = 1.0 + (problems - 1) * share
    return None if den <= 0.0 else problems * share / den


def decomposition(
    blocks: Sequence[Mapping[str, float]], gram: Gram, *, batch_problems: int | None = None
) -> dict[str, Any]:
    """The decomposition of one credit's per-problem gradient (module docstring).

    blocks: [B] per-block sums (`BLOCK_KEYS`, with "mc" for A*); gram: [B, B] H_b·H_b' of the blocks'
    sums of h_x. Returns {"problems", "blocks", "moments": {"mean_square" E|g|^2, "conditional"
    E|E[g|x]|^2, "signal" |E g|^2}, "shares": {"signal", "between", "within"(, "monte_carlo")}} each
    {mean, se} (delete-one-block jackknife), and with `batch_problems` n also "batch_signal_share": the
    signal share of a batch of n problems (`batch_signal_share`, its SE by the same jackknife)."""
    b = len(blocks)
    parts = ["signal", "between", "within"] + (
        ["monte_carlo"] if b and all("mc" in x for x in blocks) else []
    )
    out: dict[str, Any] = {
        "problems": int(_sum(blocks, "n", range(b))),
        "blocks": b,
        "moments": {
            k: jackknife(partial(_moment, k, blocks, gram), b)
            for k in ("mean_square", "conditional", "signal")
        },
        "shares": {k: jackknife(partial(_share, k, blocks, gram), b) for k in parts},
    }
    if batch_problems is not None:

        def batched(idx: Sequence[int]) -> float | None:
            return batch_signal_share(_share("signal", blocks, gram, idx), batch_problems)

        out["batch_signal_share"] = {"problems": batch_problems, **jackknife(batched, b)}
    return out


def paired_difference(
    blocks: Sequence[Mapping[str, float]],
    gram: Gram,
    ref_blocks: Sequence[Mapping[str, float]],
    ref_gram: Gram,
    *,
    batch_problems: int | None = None,
) -> dict[str, Any]:
    """One credit's decomposition minus a reference's on the same problems (paired: both from the same
    rollouts' two groups, the same blocks): {"within": within-problem share minus the reference's, and with
    `batch_problems` n "batch_signal_share": the signal share of a batch of n problems minus the
    reference's}, each {mean, se} by the delete-one-block jackknife of the difference. Below zero, the
    credit leaves less within-problem noise than the reference (the only part a credit can remove). The
    jackknife of the difference counts the two estimates' covariance (the same rollouts), which two
    separate SEs leave out."""

    def within(idx: Sequence[int]) -> float | None:
        a, b = _share("within", blocks, gram, idx), _share("within", ref_blocks, ref_gram, idx)
        return None if a is None or b is None else a - b

    out: dict[str, Any] = {"within": jackknife(within, len(blocks))}
    if batch_problems is not None:

        def batched(idx: Sequence[int]) -> float | None:
            a = batch_signal_share(_share("signal", blocks, gram, idx), batch_problems)
            b = batch_signal_share(_share("signal", ref_blocks, ref_gram, idx), batch_problems)
            return None if a is None or b is None else a - b

        out["batch_signal_share"] = {"problems": batch_problems, **jackknife(batched, len(blocks))}
    return out


def conditional_cosine(
    blocks: Sequence[Mapping[str, float]], ref_blocks: Sequence[Mapping[str, float]], ref: str
) -> dict[str, Any]:
    """cos(E[g|x], E[g_ref|x]) pooled over problems: Σ cross_<ref> / sqrt(Σ w · Σ w_ref), {mean, se}
    (jackknife over blocks); None where either Σ w is <= 0 (no per-problem direction measurable)."""

    def stat(idx: Sequence[int]) -> float | None:
        idx = list(idx)
        w, w_ref = _sum(blocks, "w", idx), _sum(ref_blocks, "w", idx)
        if w <= 0.0 or w_ref <= 0.0:
            return None
        return _sum(blocks, f"cross_{ref}", idx) / (w * w_ref) ** 0.5

    return jackknife(stat, len(blocks))

"""Expected gradients: what the per-batch gradient cosines mix up, separated by pairing different batches.

A batch's policy gradient g_b(Â) (`gradients.policy_gradient`) is the expected gradient E g(Â) of the
credit on the policy's own rollouts plus that batch's noise (which problems, which rollouts, and for A*
its Monte-Carlo continuations). The per-batch cosine cos(g_b(Â), g_b(A*)) mixes two different things:
a *bias*, E g(Â) pointing elsewhere than E g(A*), which every update repeats; and *noise*, which averages
out over updates. By the policy-gradient theorem uniform credit has no bias in the first place
(E[Σ_t R ∇log π(y_t)] = E[Σ_t A(s_t, y_t) ∇log π(y_t)]: the outcome's advantage on a token that did not
cause it is zero-mean noise); GRPO departs from that only through its per-group std normalisation and
its token weights. So exact credit can only remove noise from GRPO's update, and the question is how
much of the noise it removes.

Batches of different problems are independent given the policy, so for b != b' the dot product
g_b(X)·g_b'(Y) is an unbiased estimate of E g(X)·E g(Y), with no noise of either batch in it (nor the
oracle's Monte-Carlo noise: a noise ceiling is not needed here). From the B x B matrices of those dot
products (B batches):

    cos(E g_X, E g_Y) = Σ_{b!=b'} g_b(X)·g_b'(Y) / sqrt(Σ_{b!=b'} g_b(X)·g_b'(X) · Σ_{b!=b'} g_b(Y)·g_b'(Y))
    signal share of X = |E g_X|^2 / E|g_X|^2 ≈ mean_{b!=b'} g_b(X)·g_b'(X) / mean_b |g_b(X)|^2

The signal share is the fraction of a batch gradient's squared norm that the batches share (1: no
noise; near 0: almost all noise at this batch size); exact credit helps an update by raising it.
Standard errors are the delete-one-batch jackknife's (B >= 3). A statistic whose denominator estimate
is <= 0 (no shared direction measurable at this B) is None. Ratios of unbiased estimates are not
themselves unbiased; with few batches read them as estimates with the stated SE.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

__all__ = ["cross_batch_cosine", "expected_gradients", "jackknife", "signal_share"]

Gram = Sequence[Sequence[float]]
"""[B, B] dot products g_b(X)·g_b'(Y) over batches b (rows: X's batch, columns: Y's)."""


def _off_diagonal(gram: Gram, idx: Sequence[int]) -> float:
    return sum(gram[i][j] for i in idx for j in idx if i != j)


def cross_batch_cosine(xx: Gram, yy: Gram, xy: Gram, idx: Sequence[int] | None = None) -> float | None:
    """cos(E g_X, E g_Y) from the batches `idx` (all by default): the off-diagonal sums of X·Y over the
    geometric mean of X·X's and Y·Y's; None when either of those is <= 0 (fewer than 2 batches, or no
    shared direction measurable). Not clamped: the sums are estimates, and a value past ±1 says, with its
    standard error, that the batches cannot tell the two directions apart (a clamp would hide that)."""
    idx = range(len(xx)) if idx is None else idx
    sxx, syy = _off_diagonal(xx, idx), _off_diagonal(yy, idx)
    if sxx <= 0.0 or syy <= 0.0:
        return None
    return _off_diagonal(xy, idx) / math.sqrt(sxx * syy)


def signal_share(xx: Gram, idx: Sequence[int] | None = None) -> float | None:
    """|E g|^2 / E|g|^2 ≈ mean_{b!=b'} g_b·g_b' / mean_b |g_b|^2 over the batches `idx`; None below 2
    batches or where every gradient is 0. Can be <= 0 when the batches share no direction (noise only)."""
    idx = list(range(len(xx)) if idx is None else idx)
    b = len(idx)
    norms = sum(xx[i][i] for i in idx)
    if b < 2 or norms <= 0.0:
        return None
    return (_off_diagonal(xx, idx) / (b * (b - 1))) / (norms / b)


def jackknife(stat: Callable[[Sequence[int]], float | None], batches: int) -> dict[str, Any]:
    """{"mean": stat(all batches), "se": delete-one-batch jackknife standard error}; se None below 3
    batches or when a leave-one-out value is undefined."""
    full = stat(range(batches))
    if full is None or batches < 3:
        return {"mean": full, "se": None}
    loo = [stat([i for i in range(batches) if i != out]) for out in range(batches)]
    if any(v is None for v in loo):
        return {"mean": full, "se": None}
    mean = sum(loo) / batches  # type: ignore[arg-type]
    var = (batches - 1) / batches * sum((v - mean) ** 2 for v in loo)  # type: ignore[operator]
    return {"mean": full, "se": math.sqrt(var)}


def _row(g: Mapping[str, Gram], references: Mapping[str, Mapping[str, Gram]], batches: int) -> dict[str, Any]:
    row = {
        f"cos_{r}": jackknife(partial(cross_batch_cosine, g["self"], ref["self"], g[r]), batches)
        for r, ref in references.items()
    }
    row["signal_share"] = jackknife(partial(signal_share, g["self"]), batches)
    return row


def expected_gradients(
    references: Mapping[str, Mapping[str, Gram]], credits: Mapping[str, Mapping[str, Gram]]
) -> dict[str, Any]:
    """The cross-batch summary of the probe's gradients (module docstring).

    references / credits: {name: {"self": [B, B] dots of its own batch gradients, ref: [B, B] dots with
    each reference's}}, the references "oracle" (A*) and "grpo". Returns {"batches": B, "headroom":
    1 - cos(E g_GRPO, E g*), "references" / "credits": {name: {"cos_oracle", "cos_grpo",
    "signal_share"}}}, each {mean, se} (`jackknife`), and "grams": the inputs, so that the figures can be
    recomputed from the JSON."""
    batches = len(references["oracle"]["self"])
    refs = {n: _row(g, references, batches) for n, g in references.items()}
    head = refs["grpo"]["cos_oracle"]
    return {
        "batches": batches,
        "headroom": {"mean": None if head["mean"] is None else 1.0 - head["mean"], "se": head["se"]},
        "references": refs,
        "credits": {n: _row(g, references, batches) for n, g in credits.items()},
        "grams": {"references": references, "credits": credits},
    }

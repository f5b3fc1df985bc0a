"""Statistics of a comparison over seeds: mean ± sample std with a t-interval, the paired t-test with
its exact p-value, Holm's correction across the recipes compared, the paired effect size d_z, steps
to a target accuracy and the area under the accuracy curve. Plain floats in, plain floats out;
nothing here reads or runs anything (no scipy: the t distribution is in closed form).

The interval of an accuracy over seeds is the t-interval of the mean cut to [0, 1] (`mean_ci` with
`bounds`). Each seed's final accuracy is one number, and what varies between seeds is mostly the
training, not the draw of problems: a Wilson interval would describe one run's problems only (its
binomial noise) and say nothing of the seed-to-seed spread the comparison is about, and a logit
transform is undefined for a seed that scores exactly 0 or 1. The true mean accuracy lies in [0, 1],
so cutting the interval there keeps every case it covered: the coverage is unchanged, the impossible
values (a printed [-0.107, 1.037] from 2 seeds) go. With fewer than 3 seeds the interval stays
honest but uninformative (t* = 12.7 for 2 seeds), which `tokencredit compare` warns about."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = [
    "PairedTest",
    "curve_area",
    "finite_or_str",
    "holm",
    "mean_ci",
    "mean_std",
    "paired_effect",
    "paired_t_test",
    "steps_to_target",
    "t_quantile",
    "t_two_sided_p",
]


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with integer `df` >= 1, in closed form (A&S 26.7.3-4).

    With theta = atan(|t| / sqrt(df)), c = cos theta, s = sin theta, A(t|df) = P(|T| < |t|) is
    2/pi * (theta + s * (c + 2/3 c^3 + ... + (2*4*...*(df-3)) / (1*3*...*(df-2)) c^(df-2))) for odd
    df (just 2 theta / pi for df = 1) and s * (1 + 1/2 c^2 + ... + (1*3*...*(df-3)) / (2*4*...*(df-2))
    c^(df-2)) for even df. Returns 1 - A.
    """
    if df < 1 or int(df) != df:
        raise ValueError(f"df must be a positive integer, got {df}")
    if math.isnan(t):
        raise ValueError("t is NaN")
    df = int(df)
    theta = math.atan(abs(t) / math.sqrt(df)) if math.isfinite(t) else math.pi / 2
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:
        series, term = 0.0, math.cos(theta)
        for k in range(1, (df - 1) // 2 + 1):
            series += term
            term *= c2 * (2 * k) / (2 * k + 1)
        a = 2 / math.pi * (theta + s * series)
    else:
        series, term = 0.0, 1.0
        for k in range(1, df // 2 + 1):
            series += term
            term *= c2 * (2 * k - 1) / (2 * k)
        a = s * series
    return min(1.0, max(0.0, 1.0 - a))


def finite_or_str(v: float | None) -> float | str | None:
    """`v` for JSON: +-inf as the strings "inf" / "-inf" (JSON has no infinity)."""
    return v if v is None or math.isfinite(v) else ("inf" if v > 0 else "-inf")


@dataclass
class PairedTest:
    """Paired t-test of x - y over matched seeds: t = mean(d) / (sd(d) / sqrt(n)), df = n - 1."""

    n: int
    mean_diff: float | None  # None when there is no pair
    t: float | None  # None when n < 2; +-inf when every difference is the same non-zero number
    p: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "mean_diff": self.mean_diff,
            "t": finite_or_str(self.t),
            "df": self.n - 1,
            "p": self.p,
        }


def paired_t_test(x: list[float], y: list[float]) -> PairedTest:
    """Two-sided paired t-test of x against y (same length, matched by position).

    Fewer than 2 pairs: t and p are None. Zero spread of the differences: p = 1 when they are all
    0 (no difference), else t = +-inf and p = 0 (a constant non-zero shift).
    """
    if len(x) != len(y):
        raise ValueError(f"paired test needs equal lengths, got {len(x)} and {len(y)}")
    d = [float(a) - float(b) for a, b in zip(x, y)]
    n = len(d)
    if n == 0:
        return PairedTest(0, None, None, None)
    mean = math.fsum(d) / n
    if n < 2:
        return PairedTest(n, mean, None, None)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in d) / (n - 1))
    if sd <= 1e-12 * max(1.0, abs(mean)):
        if abs(mean) <= 1e-12:
            return PairedTest(n, mean, 0.0, 1.0)
        return PairedTest(n, mean, math.copysign(math.inf, mean), 0.0)
    t = mean / (sd / math.sqrt(n))
    return PairedTest(n, mean, t, t_two_sided_p(t, n - 1))


def mean_std(values: list[float]) -> dict[str, Any]:
    """Mean, sample std (n - 1; None for one value) and the values; mean None for no values."""
    vals = [float(v) for v in values]
    n = len(vals)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "values": []}
    mean = math.fsum(vals) / n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else None
    return {"n": n, "mean": mean, "std": std, "values": vals}


def steps_to_target(evals: list[dict[str, Any]], key: str, target: float) -> int | None:
    """First evaluated step whose `key` reaches `target` (step 0 is the starting model); None if never."""
    for e in sorted(evals, key=lambda r: r["step"]):
        if key in e and e[key] >= target:
            return int(e["step"])
    return None


def t_quantile(level: float, df: int) -> float:
    """The two-sided critical value t* with P(|T| >= t*) = 1 - level for Student's t with `df` >= 1
    (t* = 2.262 for level 0.95, df 9), by bisection on the closed-form `t_two_sided_p`."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, df) > 1.0 - level:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_two_sided_p(mid, df) > 1.0 - level:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return 0.5 * (lo + hi)


def mean_ci(
    values: list[float], level: float = 0.95, bounds: tuple[float, float] | None = None
) -> dict[str, Any]:
    """`mean_std` plus the t-interval of the mean: mean ± t*(level, n - 1) sd / sqrt(n) (None for n < 2).

    With `bounds` (lo, hi), the range the quantity cannot leave (an accuracy: (0, 1)), the interval is
    cut to it and "clipped" says whether it had to be (see the module docstring: same coverage).
    """
    out = mean_std(values)
    n = out["n"]
    if n < 2 or out["std"] is None:
        return {**out, "level": level, "lo": None, "hi": None, "clipped": False}
    half = t_quantile(level, n - 1) * out["std"] / math.sqrt(n)
    lo, hi = out["mean"] - half, out["mean"] + half
    if bounds is None:
        return {**out, "level": level, "lo": lo, "hi": hi, "clipped": False}
    a, b = bounds
    return {**out, "level": level, "lo": max(lo, a), "hi": min(hi, b), "clipped": lo < a or hi > b}


def holm(pvalues: dict[str, float | None]) -> dict[str, float | None]:
    """Holm's step-down adjustment of a family of p-values (None entries are left out of the family).

    With the m p-values sorted, p_(1) <= ... <= p_(m): adjusted p_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)).
    Rejecting where the adjusted p < alpha controls the family-wise error rate at alpha.
    """
    tested = sorted((p, k) for k, p in pvalues.items() if p is not None)
    m = len(tested)
    out: dict[str, float | None] = {k: None for k in pvalues}
    running = 0.0
    for j, (p, k) in enumerate(tested):
        running = max(running, min(1.0, (m - j) * p))
        out[k] = running
    return out


def paired_effect(
    x: list[float], y: list[float], level: float = 0.95, bounds: tuple[float, float] | None = None
) -> dict[str, Any]:
    """The paired difference d = x - y over matched seeds: its mean with a t-interval (cut to `bounds`,
    e.g. (-1, 1) for a difference of accuracies, as in `mean_ci`) and Cohen's d_z = mean(d) / sd(d)
    (None for fewer than 2 pairs or no spread)."""
    d = [float(a) - float(b) for a, b in zip(x, y, strict=True)]
    ci = mean_ci(d, level, bounds)
    sd = ci["std"]
    d_z = None if sd is None or sd <= 1e-12 else ci["mean"] / sd
    return {"mean": ci["mean"], "lo": ci["lo"], "hi": ci["hi"], "level": level, "d_z": d_z, "n": ci["n"]}


def curve_area(evals: list[dict[str, Any]], key: str, last_step: int) -> float | None:
    """Sample efficiency: the area under the held-out accuracy curve over steps 0..last_step (trapezoids
    between evaluated steps), divided by last_step, i.e. the mean accuracy over training. None without
    an evaluation at step 0 and at last_step (the area would depend on extrapolation)."""
    pts = sorted((int(e["step"]), float(e[key])) for e in evals if key in e)
    if not pts or pts[0][0] != 0 or pts[-1][0] != last_step or last_step <= 0:
        return None
    area = math.fsum((s1 - s0) * (a0 + a1) / 2.0 for (s0, a0), (s1, a1) in zip(pts, pts[1:]))
    return area / last_step

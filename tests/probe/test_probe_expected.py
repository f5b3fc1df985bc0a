"""`tokencredit.probe.expected`: expected gradients from the dot products of different batches."""

from __future__ import annotations

import math

import pytest
import torch

from tokencredit.probe import expected as ex
from tokencredit.probe import gradients as gr


def _gram(xs, ys):
    return [[float(x.double() @ y.double()) for y in ys] for x in xs]


def _batches(mean, noise, n, seed, shared=None):
    g = torch.Generator().manual_seed(seed)
    out = [mean + noise * torch.randn(mean.shape, generator=g) for _ in range(n)]
    return out if shared is None else [x + s for x, s in zip(out, shared)]


def test_cross_batch_cosine_recovers_the_expected_direction_and_ignores_same_batch_noise():
    """X and Y whose expected gradients are at cosine 0.6, with a noise nine times the signal per batch, and a
    large noise *shared* by X and Y within each batch (the same rollouts): the per-batch cosine is near 1,
    the cross-batch one recovers 0.6."""
    p, b = 40_000, 8
    g = torch.Generator().manual_seed(0)
    mu = torch.randn(p, generator=g)
    nu = 0.6 * mu + 0.8 * torch.randn(p, generator=g)
    want = float(mu @ nu / (mu.norm() * nu.norm()))
    shared = [6 * torch.randn(p, generator=g) for _ in range(b)]
    xs, ys = _batches(mu, 1.0, b, 1, shared), _batches(nu, 1.0, b, 2, shared)
    same_batch = sum(gr.cosine(x, y) for x, y in zip(xs, ys)) / b
    assert same_batch > 0.9
    got = ex.cross_batch_cosine(_gram(xs, xs), _gram(ys, ys), _gram(xs, ys))
    assert got == pytest.approx(want, abs=0.05)
    # the signal share: |E g|^2 / E|g|^2 = 1 / (1 + 1 + 36) here (unit signal, noises of variance 1 and 36)
    assert ex.signal_share(_gram(xs, xs)) == pytest.approx(float(mu @ mu) / float(mu @ mu + 37 * p), abs=0.01)


def test_undefined_below_two_batches_or_without_a_shared_direction():
    one = [[4.0]]
    assert ex.cross_batch_cosine(one, one, one) is None and ex.signal_share(one) is None
    # two batches pointing opposite ways: the off-diagonal sum is negative, no expected direction to measure
    opposite = [[1.0, -1.0], [-1.0, 1.0]]
    assert ex.cross_batch_cosine(opposite, [[1.0, 1.0], [1.0, 1.0]], [[1.0, 1.0], [-1.0, -1.0]]) is None
    assert ex.signal_share(opposite) == pytest.approx(-1.0)  # reported: a share <= 0 says "noise only"
    assert ex.signal_share([[0.0, 0.0], [0.0, 0.0]]) is None
    # not clamped: an estimate past 1 stays visible (with its SE it says "cannot tell apart")
    assert ex.cross_batch_cosine(
        [[1.0, 2.0], [2.0, 1.0]], [[1.0, 1.0], [1.0, 1.0]], [[0.0, 2.0], [2.0, 0.0]]
    ) == (pytest.approx(4 / math.sqrt(8)))


def test_jackknife_by_hand():
    values = [1.0, 2.0, 4.0, 7.0]

    def mean_of(idx):
        idx = list(idx)
        return sum(values[i] for i in idx) / len(idx)

    got = ex.jackknife(mean_of, 4)
    # the jackknife SE of a mean is the usual SE of the mean
    m = sum(values) / 4
    se = math.sqrt(sum((v - m) ** 2 for v in values) / 3 / 4)
    assert got == {"mean": pytest.approx(m), "se": pytest.approx(se)}
    assert ex.jackknife(mean_of, 2) == {"mean": pytest.approx(1.5), "se": None}
    assert ex.jackknife(lambda idx: None, 4) == {"mean": None, "se": None}
    assert ex.jackknife(lambda idx: None if len(list(idx)) < 4 else 1.0, 4) == {"mean": 1.0, "se": None}


def test_expected_gradients_structure_and_headroom():
    p, b = 5_000, 4
    g = torch.Generator().manual_seed(3)
    star = torch.randn(p, generator=g)
    refs = {"oracle": _batches(star, 0.5, b, 4), "grpo": _batches(star, 0.5, b, 5)}
    creds = {"same": refs["oracle"], "neg": [-x for x in refs["oracle"]]}

    def grams(vs):
        return {"self": _gram(vs, vs), **{r: _gram(vs, w) for r, w in refs.items()}}

    out = ex.expected_gradients(
        {r: grams(v) for r, v in refs.items()}, {n: grams(v) for n, v in creds.items()}
    )
    assert out["batches"] == b and set(out["credits"]) == {"same", "neg"}
    assert out["grams"]["credits"]["neg"]["self"] == _gram(creds["neg"], creds["neg"])  # the inputs, kept
    assert out["credits"]["same"]["cos_oracle"]["mean"] == pytest.approx(1.0)
    assert out["credits"]["neg"]["cos_oracle"]["mean"] == pytest.approx(-1.0)
    assert out["references"]["oracle"]["cos_oracle"]["mean"] == pytest.approx(1.0)
    head = out["references"]["grpo"]["cos_oracle"]
    assert out["headroom"] == {"mean": pytest.approx(1.0 - head["mean"]), "se": head["se"]}
    assert abs(out["headroom"]["mean"]) < 0.05 and out["headroom"]["se"] is not None  # same expected gradient
    for row in out["credits"].values():
        assert set(row) == {"cos_oracle", "cos_grpo", "signal_share"}
        assert 0.5 < row["signal_share"]["mean"] < 1.0  # signal 1, noise 0.25 per coordinate: 0.8

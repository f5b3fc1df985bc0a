"""GCPO rank-power token weights (docs/spec/baselines.md#gcpo)."""

from __future__ import annotations

import math

import pytest
import torch

from tokencredit import credit
from tokencredit.batch import RolloutBatch
from tokencredit.credit.gcpo import (
    DEFAULT_POWER,
    divergence,
    negative_prompt,
    rank_power_exponent,
    rank_power_weights,
    ranks,
)
from tokencredit.errors import ConfigError

LOG_P = [-0.1, -2.0, -0.5, -0.05, -1.0]
LOG_Q = [-0.3, -0.5, -0.6, -0.05, -3.0]


def test_spec_vector():
    lp, lq = torch.tensor([LOG_P]), torch.tensor([LOG_Q])
    mask = torch.ones(1, 5, dtype=torch.bool)
    d = divergence(lp, lq, mask)
    assert torch.allclose(
        d[0], torch.tensor([0.01873, 1.98169, 0.00484, 0.0, 1.13534], dtype=torch.float64), atol=1e-5
    )
    assert ranks(d, mask).tolist() == [[3.0, 5.0, 2.0, 1.0, 4.0]]
    w = rank_power_weights(lp, lq, mask)
    assert torch.allclose(w[0], torch.tensor([0.7851, 2.3552, 0.3282, 0.0739, 1.4575]), atol=1e-4)
    assert w.mean().item() == pytest.approx(1.0, abs=1e-6)


def test_default_power():
    assert DEFAULT_POWER == pytest.approx(math.log(0.2) / math.log(0.6) - 1, abs=1e-12)
    assert DEFAULT_POWER == pytest.approx(2.1507, abs=1e-4)
    # top 40% of a long response carries ~80% of the mass
    u = torch.arange(1, 10001, dtype=torch.float64) / 10000
    w = u**DEFAULT_POWER
    assert (w[6000:].sum() / w.sum()).item() == pytest.approx(0.8, abs=1e-3)
    with pytest.raises(ConfigError):
        rank_power_exponent(1.2, 0.8)


def test_mean_one_over_valid_and_masked_zero():
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(4, 9, generator=g, dtype=torch.float64) * 3
    lq = -torch.rand(4, 9, generator=g, dtype=torch.float64) * 3
    mask = torch.arange(9)[None, :] < torch.tensor([[9], [5], [1], [0]])
    lp[~mask] = float("nan")  # padding garbage never leaks
    w = rank_power_weights(lp, lq, mask)
    assert bool(torch.isfinite(w).all())
    assert bool((w[~mask] == 0).all())
    for i, n in enumerate([9, 5, 1]):
        assert w[i, :n].mean().item() == pytest.approx(1.0, abs=1e-12)
    assert w[3].tolist() == [0.0] * 9
    # row with one valid token: weight 1 (rank 1 of 1)
    assert w[2, 0].item() == pytest.approx(1.0)


def test_weights_increase_with_divergence():
    g = torch.Generator().manual_seed(1)
    lp = -torch.rand(3, 20, generator=g) * 3
    lq = -torch.rand(3, 20, generator=g) * 3
    mask = torch.ones(3, 20, dtype=torch.bool)
    d = divergence(lp, lq, mask)
    w = rank_power_weights(lp, lq, mask)
    for i in range(3):
        order = torch.argsort(d[i])
        assert bool((w[i, order].diff() >= 0).all())


def test_tie_rules():
    d = torch.tensor([[3.0, 1.0, 3.0, 0.0, 1.0, 5.0, 10.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, True, True, False, True]])
    assert ranks(d, mask).tolist() == [[4.5, 2.5, 4.5, 1.0, 2.5, 0.0, 6.0]]
    assert ranks(d, mask, ties="first").tolist() == [[4.0, 2.0, 5.0, 1.0, 3.0, 0.0, 6.0]]
    # identical prompts (d = 0 everywhere): average ranks make every weight 1
    lp = torch.tensor([[-0.3, -1.0, -2.0]])
    assert torch.allclose(rank_power_weights(lp, lp, torch.ones(1, 3, dtype=torch.bool)), torch.ones(1, 3))
    with pytest.raises(ConfigError, match="ties"):
        ranks(d, mask, ties="random")


def test_credit_method():
    lp, lq = torch.tensor([LOG_P, LOG_P]), torch.tensor([LOG_Q, LOG_Q])
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    batch = RolloutBatch(
        token_ids=torch.zeros(2, 5, dtype=torch.long),
        mask=mask,
        group_ids=torch.zeros(2, dtype=torch.long),
        scores=torch.tensor([1.0, 0.0]),
        old_log_probs=lp,
        neg_log_probs=lq,
    )
    assert credit.get("gcpo").needs == {"old_log_probs", "neg_log_probs"}
    adv = torch.tensor([0.7, -0.7])
    a_hat = credit.compute("gcpo", batch, adv)
    assert torch.allclose(a_hat[0], 0.7 * torch.tensor([0.7851, 2.3552, 0.3282, 0.0739, 1.4575]), atol=1e-4)
    assert bool((a_hat[1, 3:] == 0).all())
    assert a_hat[1, :3].mean().item() == pytest.approx(-0.7, abs=1e-6)


def test_bad_inputs():
    mask = torch.ones(1, 5, dtype=torch.bool)
    lp = torch.tensor([LOG_P])
    lq = torch.tensor([[-0.3, float("nan"), -0.6, -0.05, -3.0]])
    with pytest.raises(ValueError, match="rollout 0, token 1"):
        rank_power_weights(lp, lq, mask)
    with pytest.raises(ValueError, match="must match"):
        rank_power_weights(lp, lq[:, :4], mask)


def test_negative_prompt():
    text = negative_prompt("  What is 2 + 3?\n")
    assert text.startswith("What is 2 + 3?\n\n")
    assert "incorrect" in text and "\\boxed{}" in text
    with pytest.raises(ValueError):
        negative_prompt("   ")

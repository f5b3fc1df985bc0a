"""GAE, the critic's targets, the clipped value loss and explained variance on hand-checked vectors (no verl)."""

from __future__ import annotations

import math

import pytest
import torch

from tokencredit import advantages
from tokencredit.advantages.gae import critic_targets, gae_advantages, monte_carlo_returns, outcome_rewards
from tokencredit.batch import BatchValidationError, RolloutBatch
from tokencredit.critic import explained_variance, value_loss
from tokencredit.errors import ConfigError

MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]]).bool()  # rows of length 3, 2 and an empty one
SCORES = torch.tensor([1.0, 0.0, 1.0])
VALUES = torch.tensor([[0.5, 0.6, 0.7, 9.0], [0.2, 0.1, 3.0, 3.0], [0.4, 0.4, 0.4, 0.4]])


def batch(**kw) -> RolloutBatch:
    return RolloutBatch(
        torch.zeros(3, 4, dtype=torch.long), MASK, torch.arange(3), SCORES, values=VALUES, **kw
    )


def test_outcome_reward_sits_on_the_last_valid_token():
    r = outcome_rewards(SCORES, MASK)
    assert r.tolist() == [[0, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]]


def test_lambda_one_gamma_one_is_reward_minus_value():
    adv, ret = gae_advantages(outcome_rewards(SCORES, MASK), VALUES, MASK, 1.0, 1.0)
    assert torch.allclose(adv[0, :3], torch.tensor([0.5, 0.4, 0.3], dtype=torch.float64))
    assert torch.allclose(adv[1, :2], torch.tensor([-0.2, -0.1], dtype=torch.float64))
    assert torch.allclose(ret[0, :3], torch.ones(3, dtype=torch.float64))  # R = r: the Monte-Carlo return
    assert adv[0, 3] == 0 and adv[2].abs().sum() == 0  # nothing past the last valid token, an empty row 0


def test_lambda_095_gamma_09_by_hand():
    g, lam = 0.9, 0.95
    adv, ret = gae_advantages(outcome_rewards(SCORES, MASK), VALUES, MASK, g, lam)
    d2 = 1.0 - 0.7
    d1 = g * 0.7 - 0.6
    d0 = g * 0.6 - 0.5
    a2, a1 = d2, d1 + g * lam * d2
    a0 = d0 + g * lam * a1
    assert torch.allclose(adv[0, :3], torch.tensor([a0, a1, a2], dtype=torch.float64))
    assert torch.allclose(ret[0, :3], torch.tensor([a0 + 0.5, a1 + 0.6, a2 + 0.7], dtype=torch.float64))
    e1 = 0.0 - 0.1
    e0 = g * 0.1 - 0.2
    assert torch.allclose(adv[1, :2], torch.tensor([e0 + g * lam * e1, e1], dtype=torch.float64))


def test_a_masked_position_inside_a_row_is_skipped():
    m = torch.tensor([[1, 0, 1]]).bool()
    v = torch.tensor([[0.2, 5.0, 0.4]])
    adv, _ = gae_advantages(outcome_rewards(torch.tensor([1.0]), m), v, m, 0.5, 0.5)
    # token 0's next state is token 2's (0.4); the masked column carries token 2's A
    a2 = 1.0 - 0.4
    assert torch.allclose(adv[0], torch.tensor([0.5 * 0.4 - 0.2 + 0.25 * a2, a2, a2], dtype=torch.float64))


def test_monte_carlo_returns_discount_by_tokens_after():
    g = monte_carlo_returns(SCORES, MASK, 0.5)
    assert g.tolist() == [[0.25, 0.5, 1.0, 0.0], [0, 0, 0, 0], [0, 0, 0, 0]]


def test_estimator_whitens_over_valid_tokens_and_returns_unwhitened():
    b = batch()
    a = advantages.estimate("gae", b)
    raw = advantages.estimate("gae", b, whiten=False)
    valid = raw[MASK].double()
    want = (valid - valid.mean()) / torch.sqrt(valid.var() + 1e-8)
    assert torch.allclose(a[MASK].double(), want, atol=1e-6)
    assert a[~MASK].abs().sum() == 0
    assert torch.allclose(critic_targets(b)[0, :3], torch.ones(3, dtype=torch.float64))


def test_monte_carlo_target_and_bounds():
    b = batch()
    r = critic_targets(b, lam=0.5, target="monte-carlo", value_min=0.0, value_max=1.0)
    assert r[0, :3].tolist() == [1.0, 1.0, 1.0] and r[1, :2].tolist() == [0.0, 0.0]
    r = critic_targets(b, lam=0.5)  # the GAE returns of lam 0.5 differ from the outcome
    assert torch.allclose(r[0, :3], torch.tensor([0.725, 0.85, 1.0], dtype=torch.float64))


def test_length_adaptive_lambda():
    b = batch()
    got = advantages.estimate("gae", b, whiten=False, length_alpha=0.5)
    lam0 = 1 - 1 / (0.5 * 3)  # row 0: L = 3
    want, _ = gae_advantages(outcome_rewards(SCORES, MASK), VALUES, MASK, 1.0, lam0)
    assert torch.allclose(got[0].double(), want[0], atol=1e-6)


def test_bad_parameters_and_missing_values_are_one_line_errors():
    with pytest.raises(ConfigError, match="needs RolloutBatch.values"):
        advantages.estimate(
            "gae", RolloutBatch(torch.zeros(3, 4, dtype=torch.long), MASK, torch.arange(3), SCORES)
        )
    with pytest.raises(ConfigError, match="closest: lam"):
        advantages.estimate("gae", batch(), lamb=0.9)
    with pytest.raises(ConfigError, match="closest: monte-carlo"):
        advantages.estimate("gae", batch(), target="monte-carl")
    with pytest.raises(ConfigError, match="gamma must be in"):
        advantages.estimate("gae", batch(), gamma=1.5)
    with pytest.raises(BatchValidationError, match="RolloutBatch.values: non-finite"):
        RolloutBatch(
            torch.zeros(3, 4, dtype=torch.long), MASK, torch.arange(3), SCORES, values=VALUES * math.nan
        )
    with pytest.raises(BatchValidationError, match=r"RolloutBatch.values: expected shape \(3, 4\)"):
        RolloutBatch(torch.zeros(3, 4, dtype=torch.long), MASK, torch.arange(3), SCORES, values=VALUES[:, :2])


def test_value_loss_by_hand():
    v = torch.tensor([[1.0, 0.0, 2.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0, 0.0]])
    ret = torch.tensor([[0.0, 1.0, 3.0]])
    m = torch.tensor([[1, 1, 1]]).bool()
    loss, clipfrac = value_loss(v, ret, old, m, cliprange_value=0.5)
    # token 0: max((1-0)^2, (0.5-0)^2) = 1; token 1: max(1, 1) = 1; token 2: max(1, (0.5-3)^2 = 6.25)
    assert loss.item() == pytest.approx(0.5 * (1 + 1 + 6.25) / 3)
    assert clipfrac.item() == pytest.approx(1 / 3)
    (grad,) = torch.autograd.grad(loss, v)
    # d/dV: token 0 unclipped (V - R) / 3; token 1 a tie takes the unclipped branch; token 2 clipped: no gradient
    assert torch.allclose(grad, torch.tensor([[1 / 3, -1 / 3, 0.0]]))


def test_explained_variance():
    m = torch.tensor([[1, 1, 1, 0]]).bool()
    r = torch.tensor([[0.0, 1.0, 2.0, 7.0]])
    assert explained_variance(r, r, m) == pytest.approx(1.0, abs=1e-4)
    assert explained_variance(torch.full_like(r, 5.0), r, m) == pytest.approx(0.0, abs=1e-4)
    assert math.isnan(explained_variance(r, r, torch.zeros_like(m)))


def test_outcome_rewards_of_a_rank_without_rollouts() -> None:
    # a data-parallel rank holding no rollout has a [0, 0] batch: zeros, not a reduction over an empty axis
    from tokencredit.advantages.gae import outcome_rewards

    assert outcome_rewards(torch.zeros(0), torch.zeros(0, 0, dtype=torch.bool)).shape == (0, 0)
    assert outcome_rewards(torch.ones(2), torch.zeros(2, 0, dtype=torch.bool)).shape == (2, 0)

"""CW-GRPO's Gaussian-kernel covariance weights (docs/spec/cw-grpo.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tokencredit import advantages, credit
from tokencredit.batch import RolloutBatch
from tokencredit.credit.cw_grpo import covariance_weights
from tokencredit.errors import ConfigError

# docs/spec/cw-grpo.md#test-vectors: two responses (3 and 2 valid tokens), A = [1, -1]
LOG_P = [[-0.1, -2.0, -0.5], [-1.0, -0.2, 0.0]]
MASK = [[True, True, True], [True, True, False]]
W = [[1.035928, 0.464525, 1.354088], [1.294345, 0.851114, 0.0]]


def _batch(log_p: torch.Tensor, mask: torch.Tensor, scores: list[float], groups: list[int] | None = None):
    n, t = mask.shape
    return RolloutBatch(
        token_ids=torch.zeros(n, t, dtype=torch.long),
        mask=mask,
        group_ids=torch.tensor(groups if groups is not None else [0] * n),
        scores=torch.tensor(scores),
        old_log_probs=log_p,
    )


def _reference(log_p: np.ndarray, adv: np.ndarray, mask: np.ndarray) -> np.ndarray:
    lp, a = log_p[mask], np.broadcast_to(adv[:, None], mask.shape)[mask]
    c = (lp - lp.mean()) * (a - a.mean())
    w = np.exp(-(c**2) / (2 * c.var(ddof=1)))
    out = np.zeros(mask.shape)
    out[mask] = w * mask.sum() / w.sum()
    return out


def test_spec_vector():
    lp, mask = torch.tensor(LOG_P), torch.tensor(MASK)
    w = covariance_weights(lp, torch.tensor([1.0, -1.0]), mask)
    torch.testing.assert_close(w, torch.tensor(W, dtype=torch.float64), atol=1e-6, rtol=0)
    assert float(w.sum()) == pytest.approx(5.0, abs=1e-12)
    out = credit.compute("cw-grpo", _batch(lp, mask, [1.0, 0.0]), torch.tensor([1.0, -1.0]))
    torch.testing.assert_close(out, torch.tensor(W) * torch.tensor([[1.0], [-1.0]]) * mask, atol=1e-6, rtol=0)


def test_matches_numpy_and_keeps_the_total_weight():
    gen = torch.Generator().manual_seed(0)
    lp = -torch.rand(8, 11, generator=gen, dtype=torch.float64) * 4
    mask = torch.arange(11)[None] < torch.randint(0, 12, (8, 1), generator=gen)
    mask[2, 5] = False
    adv = torch.randn(8, generator=gen, dtype=torch.float64)
    got = covariance_weights(lp, adv, mask)
    np.testing.assert_allclose(got.numpy(), _reference(lp.numpy(), adv.numpy(), mask.numpy()), atol=1e-12)
    assert float(got.sum()) == pytest.approx(float(mask.sum()), rel=1e-12)
    assert bool((got <= mask.sum()).all()) and bool((got[~mask] == 0).all())


def test_extreme_covariance_is_down_weighted_most():
    lp = torch.tensor([[-0.5, -0.6, -0.4, -9.0], [-0.5, -0.55, -0.45, -0.5]])
    w = covariance_weights(lp, torch.tensor([1.0, -1.0]), torch.ones(2, 4, dtype=torch.bool))
    assert int(w.flatten().argmin()) == 3  # the rare token of the good response: the extreme covariance


def test_padding_never_leaks_and_padding_length_does_not_matter():
    lp, mask = torch.tensor(LOG_P), torch.tensor(MASK)
    lp[1, 2] = float("nan")
    wide = torch.cat([lp, torch.full((2, 3), float("inf"))], 1)
    wide_mask = torch.cat([mask, torch.zeros(2, 3, dtype=torch.bool)], 1)
    adv = torch.tensor([1.0, -1.0])
    w = covariance_weights(wide, adv, wide_mask)
    torch.testing.assert_close(w[:, :3], torch.tensor(W, dtype=torch.float64), atol=1e-6, rtol=0)
    assert bool((w[:, 3:] == 0).all()) and bool(torch.isfinite(w).all())


def test_bf16_log_probs_are_read_as_their_values():
    lp = torch.tensor(LOG_P).bfloat16()
    mask = torch.tensor(MASK)
    adv = torch.tensor([1.0, -1.0])
    torch.testing.assert_close(covariance_weights(lp, adv, mask), covariance_weights(lp.float(), adv, mask))


def test_degenerate_batches_fall_back_to_grpo():
    mask = torch.tensor(MASK)
    lp = torch.tensor(LOG_P)
    # every advantage equal: c = 0 exactly (float32 sums are exact in float64), sigma = 0, w = 1
    for a in (torch.tensor([0.3, 0.3]), torch.tensor([0.0, 0.0])):
        assert torch.equal(covariance_weights(lp, a, mask), mask.double())
    # ties: every log-prob equal
    assert torch.equal(
        covariance_weights(torch.full((2, 3), -0.7), torch.tensor([1.0, -1.0]), mask), mask.double()
    )
    # T = 1 and a single valid token in the batch: no std
    one = torch.tensor([[True], [False]])
    assert covariance_weights(torch.tensor([[-0.3], [-1.0]]), torch.tensor([2.0, -1.0]), one).tolist() == [
        [1.0],
        [0.0],
    ]
    # no valid token at all
    assert covariance_weights(lp, torch.tensor([1.0, -1.0]), torch.zeros(2, 3, dtype=torch.bool)).sum() == 0


def test_every_covariance_far_in_the_tail_stays_finite():
    """c = (K, K, K, K) + tiny spread: every plain exp(-c^2 / 2 sigma^2) underflows; the weights stay mean 1."""
    x = torch.tensor([1.0, -1.0, 2.0, -2.0], dtype=torch.float64)
    lp = (x + torch.tensor([0.0, 0.0, 0.0, 1e-7], dtype=torch.float64))[:, None]
    adv = 1.0 / x
    w = covariance_weights(lp, adv, torch.ones(4, 1, dtype=torch.bool))
    assert bool(torch.isfinite(w).all()) and float(w.sum()) == pytest.approx(4.0)


def test_group_with_equal_rewards_and_token_level_advantages():
    lp = -torch.rand(8, 5, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(8, 5, dtype=torch.bool)
    batch = _batch(lp, mask, [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0], [0, 0, 0, 0, 1, 1, 1, 1])
    adv = advantages.grpo(batch.scores, batch.group_ids)
    out = credit.compute("cw-grpo", batch, adv)
    assert bool((out[4:] == 0).all()) and bool((out[:4] != 0).all())
    assert bool((torch.sign(out[:4]) == torch.sign(adv[:4, None])).all())
    token_adv = adv[:, None] * torch.linspace(0.5, 1.5, 5)
    got = credit.compute("cw-grpo", batch, token_adv)
    want = covariance_weights(lp, token_adv, mask) * token_adv.double()
    torch.testing.assert_close(got, want.float())


def test_unknown_parameter_and_bad_log_probs():
    lp, mask = torch.tensor(LOG_P), torch.tensor(MASK)
    batch = _batch(lp, mask, [1.0, 0.0])
    with pytest.raises(ConfigError, match="no parameter"):
        credit.compute("cw-grpo", batch, torch.tensor([1.0, -1.0]), sigma=1.0)
    with pytest.raises(ConfigError, match="closest: cw-grpo"):
        credit.compute("cw-grp", batch, torch.tensor([1.0, -1.0]))
    lp[0, 1] = float("-inf")  # RolloutBatch refuses it too; the function names the token itself
    with pytest.raises(ValueError, match=r"response 0, position 1"):
        covariance_weights(lp, torch.tensor([1.0, -1.0]), mask)

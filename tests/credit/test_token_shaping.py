"""Per-token advantage shapings: entropy-advantage (Cheng et al. 2025) and advantage-reweighting (Yang et al. 2025)."""

from __future__ import annotations

import pytest
import torch

from tokencredit import advantages, credit
from tokencredit.batch import RolloutBatch
from tokencredit.errors import ConfigError
from tokencredit.recipes import RECIPES, resolve, token_credit


def make_batch() -> RolloutBatch:
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    entropy = torch.tensor(
        [[0.1, 2.0, 0.5, 9.0], [3.0, 0.0, 9.0, 9.0], [1.0, 1.0, 0.2, 4.0], [1.0, 1.0, 1.0, 1.0]]
    )
    logp = torch.log(
        torch.tensor([[0.9, 0.5, 0.1, 0.3], [0.2, 1.0, 0.3, 0.3], [0.6, 0.4, 0.05, 0.7], [0.5] * 4])
    )
    return RolloutBatch(
        torch.zeros(4, 4, dtype=torch.long),
        mask,
        torch.tensor([0, 0, 1, 1]),
        torch.tensor([1.0, 0.0, 1.0, 0.0]),
        entropy=entropy * mask,
        old_log_probs=logp * mask,
        sum_sq_probs=(logp.exp() ** 2) * mask,
    )


A = torch.tensor([0.8, -0.8, 0.5, 0.0])


def test_entropy_advantage_formula_and_sign():
    b = make_batch()
    got = credit.compute("entropy-advantage", b, A, alpha=0.4, kappa=2.0)
    want = A[:, None] + torch.minimum(0.4 * b.entropy, A.abs()[:, None] / 2.0)
    torch.testing.assert_close(got, (want * b.mask).float())
    # the bonus is at most |A| / kappa: the sign never flips, and A = 0 stays 0
    signs = torch.sign(A)[:, None].expand(4, 4)
    assert bool((torch.sign(got) == signs)[b.mask].all())
    assert float(got[1, 0]) == pytest.approx(-0.4) and float(got[0, 0]) == pytest.approx(0.84)
    assert bool((got[3] == 0).all())


def test_advantage_reweighting_formula():
    b = make_batch()
    got = credit.compute("advantage-reweighting", b, A)  # alpha 0.3
    want = (0.3 * b.old_log_probs.exp() + 0.7) * A[:, None]
    torch.testing.assert_close(got, (want * b.mask).float())
    assert float(got[0, 0]) == pytest.approx(0.8 * (0.3 * 0.9 + 0.7))
    assert torch.equal(
        credit.compute("advantage-reweighting", b, A, alpha=0.0), credit.compute("uniform", b, A)
    )


@pytest.mark.parametrize("name", ["uniform", "entropy-advantage", "advantage-reweighting"])
def test_token_level_advantages_are_taken_per_token(name):
    b = make_batch()
    a_tok = advantages.estimate("otb", b)
    assert a_tok.shape == (4, 4)
    got = credit.compute(name, b, a_tok)
    rows = [credit.compute(name, b, a_tok[:, t].contiguous())[:, t] for t in range(4)]
    torch.testing.assert_close(got, torch.stack(rows, -1))  # the same per-token function of each token's A


@pytest.mark.parametrize("name", ["ktae", "entropy-80-20", "delta", "gcpo"])
def test_sequence_methods_refuse_token_level_advantages(name):
    b = make_batch()
    with pytest.raises(ConfigError, match="token-level"):
        credit.compute(name, b, torch.zeros(4, 4))
    with pytest.raises(ConfigError, match="token-level A"):
        resolve("otb", {"credit": name})


def test_recipes_with_token_level_estimators_use_token_level_credit():
    b = make_batch()
    tc = token_credit(resolve("otb", {"credit": "advantage-reweighting"}), b)
    a_tok = advantages.estimate("otb", b)
    torch.testing.assert_close(tc.token_advantages, credit.compute("advantage-reweighting", b, a_tok))
    m = b.mask.float()
    torch.testing.assert_close(tc.seq_advantages, (a_tok * m).sum(-1) / m.sum(-1).clamp(min=1))


def test_bad_parameters():
    b = make_batch()
    with pytest.raises(ConfigError, match="kappa"):
        credit.compute("entropy-advantage", b, A, kappa=1.0)
    with pytest.raises(ConfigError, match="alpha"):
        credit.compute("entropy-advantage", b, A, alpha=0.0)
    with pytest.raises(ConfigError, match="alpha"):
        credit.compute("advantage-reweighting", b, A, alpha=1.5)


def test_recipes_name_their_papers_and_defaults():
    r = RECIPES["entropy-advantage"]
    assert r.credit_params == {"alpha": 0.4, "kappa": 2.0} and "2506.14758" in r.paper and r.eps_high == 0.28
    r = RECIPES["advantage-reweighting"]
    assert r.credit_params == {"alpha": 0.3} and "2505.12929" in r.paper

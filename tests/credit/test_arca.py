"""ARCA and the salience baselines (docs/spec/arca.md): normalisation vectors, scores, credit, paper-loss equivalence."""

from __future__ import annotations

import pytest
import torch

from tokencredit import credit
from tokencredit.advantages import grpo
from tokencredit.batch import BatchValidationError, RolloutBatch
from tokencredit.credit.arca import (
    entropy_reduction,
    normalize_scores,
    policy_divergence,
    residual_norm,
    salience_weights,
    surprisal,
    weighted_advantages,
)
from tokencredit.diagnostics import effective_token_ratio, gini
from tokencredit.errors import ConfigError
from tokencredit.objectives import ObjectiveArgs, policy_loss

ONE_ROW = torch.ones(1, 4, dtype=torch.bool)


def row(values, dtype=torch.float64):
    return torch.tensor([values], dtype=dtype)


# ------------------------------------------------------ docs/spec/arca.md#test-vectors
@pytest.mark.parametrize(
    ("sharpening", "w", "g", "eff"),
    [
        (1.0, [0.1, 0.3, 0.5, 0.1], 0.35, 0.694444),
        (2.0, [0.027778, 0.25, 0.694444, 0.027778], 0.555556, 0.457627),
    ],
)
def test_residual_norm_vector(sharpening, w, g, eff):
    norms = row([0.2, 0.6, 1.0, 0.2])
    # residual norms as they come out of hidden states: put each norm on one hidden coordinate
    base = torch.randn(1, 4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    hidden = base.clone()
    hidden[..., 1] += norms
    alpha = residual_norm(hidden, base, ONE_ROW)
    assert torch.allclose(alpha.double(), norms, atol=1e-6)
    weights = normalize_scores(norms, ONE_ROW, sharpening)
    assert torch.allclose(weights, row(w), atol=1e-6)
    assert weights.sum().item() == pytest.approx(1.0, abs=1e-12)
    assert gini(weights, ONE_ROW).item() == pytest.approx(g, abs=1e-6)
    assert effective_token_ratio(weights, ONE_ROW).item() == pytest.approx(eff, abs=1e-6)


def test_gini_and_effn_by_hand():
    """The docs/spec/arca.md formulas computed here directly, against the same vectors."""
    w = row([0.027778, 0.25, 0.694444, 0.027778])
    x, _ = torch.sort(w[0] / w.sum())
    n = x.numel()
    i = torch.arange(1, n + 1, dtype=torch.float64)
    assert ((2 * i - n - 1) * x).sum().item() / n == pytest.approx(0.555556, abs=1e-5)
    assert 1.0 / (n * (x * x).sum().item()) == pytest.approx(0.457627, abs=1e-5)


@pytest.mark.parametrize(
    ("sharpening", "w"),
    [
        (1.0, [0.037736, 0.754717, 0.188679, 0.018868]),
        (2.0, [0.002346, 0.938416, 0.058651, 0.000587]),
    ],
)
def test_surprisal_vector(sharpening, w):
    alpha = surprisal(row([-0.1, -2.0, -0.5, -0.05]), ONE_ROW)
    assert torch.allclose(normalize_scores(alpha, ONE_ROW, sharpening).double(), row(w), atol=1e-6)


def test_entropy_reduction_vector():
    alpha = entropy_reduction(row([2.0, 0.5, 1.5, 0.2]), ONE_ROW)
    assert torch.allclose(alpha.double(), row([1.5, 0.0, 1.3, 0.0]), atol=1e-6)
    w = normalize_scores(alpha, ONE_ROW)
    assert torch.allclose(w.double(), row([0.535714, 0.0, 0.464286, 0.0]), atol=1e-6)
    assert 0 < w[0, 1].item() < 1e-7  # "~0": eps keeps a sliver of mass


def test_entropy_reduction_last_valid_token_is_zero():
    mask = torch.tensor([[True, True, True, False, False]])
    # the drop into padding (1.0 -> 0.0) must not count
    alpha = entropy_reduction(torch.tensor([[3.0, 2.0, 1.0, 0.0, 0.0]]), mask)
    assert alpha.tolist() == [[1.0, 1.0, 0.0, 0.0, 0.0]]


def test_zero_residual_is_uniform_and_empty_row_is_zero():
    for sharpening in (1.0, 2.0):
        w = normalize_scores(torch.zeros(1, 4), ONE_ROW, sharpening)
        assert torch.allclose(w, torch.full((1, 4), 0.25))
    mask = torch.tensor([[True, True, False], [False, False, False]])
    w = normalize_scores(torch.zeros(2, 3), mask, 2.0)
    assert w.tolist() == [[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]
    assert bool(torch.isfinite(w).all())


def test_rewards_to_advantages():
    a = grpo(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4, dtype=torch.long), eps=1e-8)
    assert torch.allclose(a, torch.tensor([0.866025, -0.866025, -0.866025, 0.866025]), atol=1e-6)


# ---------------------------------------------------------------- masking and bad input
def test_masked_positions_are_zero_and_rows_sum_to_one():
    g = torch.Generator().manual_seed(1)
    mask = torch.arange(7)[None, :] < torch.tensor([[7], [3], [1]])
    scores = torch.rand(3, 7, generator=g) * 5
    scores[~mask] = float("nan")  # garbage on padding never leaks
    for sharpening in (0.0, 1.0, 2.0, 3.5):
        w = normalize_scores(scores, mask, sharpening)
        assert bool((w[~mask] == 0).all())
        assert torch.allclose(w.sum(-1), torch.ones(3))


def test_bad_scores_are_errors():
    with pytest.raises(ValueError, match="rollout 0, token 2"):
        normalize_scores(row([0.1, 0.2, -0.3, 0.0]), ONE_ROW)
    with pytest.raises(ValueError, match="rollout 0, token 1"):
        normalize_scores(row([0.1, float("nan"), 0.3, 0.0]), ONE_ROW)
    with pytest.raises(ConfigError, match="sharpening"):
        normalize_scores(row([0.1, 0.2, 0.3, 0.0]), ONE_ROW, -1.0)
    with pytest.raises(ValueError, match="shapes differ"):
        normalize_scores(torch.zeros(1, 3), ONE_ROW)


def test_policy_divergence_and_surprisal_scores():
    lp = row([-0.1, -2.0, -0.5, 1e-9])  # a rounding-positive log-prob gives surprisal 0, not < 0
    base = row([-0.3, -1.0, -0.5, -0.2])
    assert torch.allclose(policy_divergence(lp, base, ONE_ROW).double(), row([0.2, 1.0, 0.0, 0.2]), atol=1e-6)
    assert surprisal(lp, ONE_ROW)[0, 3].item() == 0.0


# ---------------------------------------------------------------- credit methods
def make_batch(seed=0, n=4, t=6, h=5):
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(t)[None, :] < torch.tensor([[6], [4], [5], [2]])[:n]
    hidden = torch.randn(n, t, h, generator=g)
    return RolloutBatch(
        token_ids=torch.randint(0, 50, (n, t), generator=g),
        mask=mask,
        group_ids=torch.zeros(n, dtype=torch.long),
        scores=torch.tensor([1.0, 0.0, 0.0, 1.0])[:n],
        old_log_probs=-torch.rand(n, t, generator=g) * 3,
        base_log_probs=-torch.rand(n, t, generator=g) * 3,
        entropy=torch.rand(n, t, generator=g) * 2,
        hidden=hidden,
        base_hidden=hidden + 0.1 * torch.randn(n, t, h, generator=g),
    )


METHODS = ["arca", "surprisal", "entropy-reduction", "policy-divergence"]


def test_registration_metadata():
    assert credit.get("arca").requires_lora and credit.get("policy-divergence").requires_lora
    assert not credit.get("surprisal").requires_lora
    assert credit.get("arca").needs == {"hidden", "base_hidden"}
    assert credit.get("entropy-reduction").needs == {"entropy"}
    assert credit.get("policy-divergence").needs == {"old_log_probs", "base_log_probs"}
    assert credit.get("arca").defaults == {"sharpening": 1.0, "form": "mean"}


@pytest.mark.parametrize("name", METHODS)
def test_credit_is_row_mean_preserving(name):
    batch = make_batch()
    adv = grpo(batch.scores, batch.group_ids, eps=1e-8)
    a_hat = credit.compute(name, batch, adv, sharpening=2.0)
    lengths = batch.mask.sum(-1).float()
    assert torch.allclose(a_hat.sum(-1) / lengths, adv, atol=1e-5)
    assert bool((a_hat[~batch.mask] == 0).all())
    w = salience_weights(name, batch, sharpening=2.0)
    assert torch.allclose(a_hat, adv[:, None] * lengths[:, None] * w, atol=1e-6)
    summed = credit.compute(name, batch, adv, sharpening=2.0, form="sum")
    assert torch.allclose(summed.sum(-1), adv, atol=1e-6)


def test_step_zero_lora_is_uniform():
    batch = make_batch()
    batch.base_hidden = batch.hidden.clone()  # LoRA B = 0: no residual anywhere
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0])
    a_hat = credit.compute("arca", batch, adv, sharpening=2.0)
    assert torch.allclose(a_hat, adv[:, None] * batch.mask.float())


def test_missing_signal_and_bad_form():
    batch = make_batch()
    batch.base_hidden = None
    with pytest.raises(BatchValidationError, match="base_hidden"):
        credit.compute("arca", batch, torch.zeros(4))
    with pytest.raises(ConfigError, match="form"):
        credit.compute("surprisal", make_batch(), torch.zeros(4), form="token")


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize(("form", "agg"), [("mean", "seq-mean-token-mean"), ("sum", "seq-mean-token-sum")])
def test_reinforce_reproduces_paper_loss(name, form, agg):
    """With loss="reinforce", Â gives exactly the paper's loss -mean_i A_i sum_t w_t log pi (value and gradient)."""
    batch = make_batch(seed=3)
    adv = grpo(batch.scores, batch.group_ids, eps=1e-8)
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    log_pi = torch.nn.functional.logsigmoid(logits)  # any differentiable per-token log-prob

    w = salience_weights(name, batch, sharpening=2.0).double()
    paper = -(adv.double() * (w * torch.where(batch.mask, log_pi, 0.0)).sum(-1)).mean()
    (paper_grad,) = torch.autograd.grad(paper, logits)

    a_hat = credit.compute(name, batch, adv, sharpening=2.0, form=form).double()
    log_pi = torch.nn.functional.logsigmoid(logits)
    ours, _ = policy_loss(log_pi, None, a_hat, batch.mask, ObjectiveArgs(loss="reinforce", loss_agg_mode=agg))
    (ours_grad,) = torch.autograd.grad(ours, logits)
    assert ours.item() == pytest.approx(paper.item(), abs=1e-6)
    assert torch.allclose(ours_grad, paper_grad, atol=1e-6)


def test_weighted_advantages_direct():
    w = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    out = weighted_advantages(w, torch.tensor([2.0, -1.0]), mask)
    assert torch.allclose(out, torch.tensor([[2.0, 2.0, 0.0], [-0.6, -0.9, -1.5]]))

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokencredit import objectives
from tokencredit.errors import ConfigError

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 99.0, 99.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]]).bool()


def test_aggregation_spec_vectors():
    assert objectives.aggregate(LOSS, MASK, "token-mean").item() == pytest.approx(2.5)
    assert objectives.aggregate(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx(3.0)
    assert objectives.aggregate(LOSS, MASK, "seq-mean-token-sum").item() == pytest.approx(5.0)
    assert objectives.aggregate(
        LOSS, MASK, "seq-mean-token-sum-norm", norm_constant=4
    ).item() == pytest.approx(1.25)
    # default constant = T
    assert objectives.aggregate(LOSS, MASK, "seq-mean-token-sum-norm").item() == pytest.approx(
        (6 / 3 + 4 / 3) / 2
    )
    with pytest.raises(ConfigError, match="closest: token-mean"):
        objectives.aggregate(LOSS, MASK, "token_mean")


def test_empty_rows_are_left_out_and_all_masked_gives_zero():
    loss = torch.tensor([[1.0, 3.0], [5.0, 5.0]])
    mask = torch.tensor([[1, 1], [0, 0]]).bool()
    assert objectives.aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx(2.0)
    assert objectives.aggregate(loss, torch.zeros_like(mask), "token-mean").item() == 0.0


def test_ppo_clip_asymmetric_and_dual_clip():
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 5.0]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    m = torch.ones(1, 4, dtype=torch.bool)
    l = objectives.clipped_token_loss(logp, old, adv, m, eps_low=0.2, eps_high=0.28)
    # A>0, r=1.5 -> clipped at 1.28; A>0, r=0.5 -> max(-0.5, -0.8) = -0.5; A<0 r=1.1 -> 1.1; A<0 r=5 -> 5
    torch.testing.assert_close(l, torch.tensor([[-1.28, -0.5, 1.1, 5.0]]))
    l2 = objectives.clipped_token_loss(logp, old, adv, m, eps_low=0.2, eps_high=0.28, dual_clip=3.0)
    torch.testing.assert_close(l2, torch.tensor([[-1.28, -0.5, 1.1, 3.0]]))
    with pytest.raises(ConfigError):
        objectives.clipped_token_loss(logp, old, adv, m, dual_clip=0.5)


def test_masked_positions_are_exactly_zero_even_with_garbage():
    logp = torch.tensor([[-1.0, float("nan")], [-2.0, -1.0]])
    old = torch.tensor([[-1.0, float("inf")], [-2.5, -1.0]])
    m = torch.tensor([[1, 0], [1, 1]]).bool()
    l = objectives.clipped_token_loss(logp, old, torch.tensor([1.0, -1.0]), m)
    assert l[0, 1].item() == 0.0 and torch.isfinite(l).all()


def test_kl_estimators():
    lp, ref = torch.tensor([[-1.0]]), torch.tensor([[-1.5]])
    assert objectives.kl_penalty(lp, ref, "k1").item() == pytest.approx(0.5)
    assert objectives.kl_penalty(lp, ref, "k2").item() == pytest.approx(0.125)
    assert objectives.kl_penalty(lp, ref, "k3").item() == pytest.approx(math.exp(-0.5) + 0.5 - 1)
    assert objectives.kl_penalty(torch.tensor([[-30.0]]), torch.tensor([[0.0]]), "k3").item() == 10.0
    with pytest.raises(ConfigError):
        objectives.kl_penalty(lp, ref, "k4")


def test_reinforce_is_minus_adv_logp():
    lp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    m = torch.tensor([[1, 1], [1, 0]]).bool()
    loss, _ = objectives.policy_loss(
        lp, None, torch.tensor([2.0, -1.0]), m, objectives.ObjectiveArgs(loss="reinforce")
    )
    assert loss.item() == pytest.approx((2 * 1 + 2 * 2 + (-1) * 0.5) / 3)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-2 / 3, -2 / 3], [1 / 3, 0.0]]))


def test_metrics_and_kl_term():
    lp = torch.tensor([[0.5, -0.5, 0.0]])
    old = torch.zeros(1, 3)
    m = torch.ones(1, 3, dtype=torch.bool)
    loss, met = objectives.policy_loss(
        lp,
        old,
        torch.tensor([[1.0, -1.0, 1.0]]),
        m,
        objectives.ObjectiveArgs(kl_coef=0.1, kl_type="k1"),
        ref_log_prob=torch.zeros(1, 3),
    )
    assert met["clip_high_frac"] == pytest.approx(1 / 3) and met["clip_low_frac"] == pytest.approx(1 / 3)
    assert met["ratio_max"] == pytest.approx(math.exp(0.5))
    assert met["kl_ref"] == pytest.approx(0.0)
    assert met["approx_kl"] == pytest.approx((0.125 + 0.125) / 3)
    with pytest.raises(ConfigError, match="ref_log_prob"):
        objectives.policy_loss(lp, old, torch.ones(1), m, objectives.ObjectiveArgs(kl_coef=0.1))


def _random_case(seed, n=6, t=7):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, t + 1, (n,), generator=g)
    mask = torch.arange(t)[None] < lens[:, None]
    old = -torch.rand(n, t, generator=g) * 3
    logp = (old + 0.3 * torch.randn(n, t, generator=g)).requires_grad_(True)
    adv = torch.randn(n, t, generator=g)
    return logp, old, adv, mask


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 10_000),
    st.integers(1, 5),
    st.sampled_from(list(objectives.AGG_MODES)),
    st.sampled_from(["token", "gspo", "gspo-token"]),
)
def test_microbatch_split_does_not_change_loss_or_grad(seed, parts, mode, kernel):
    logp, old, adv, mask = _random_case(seed)
    args = objectives.ObjectiveArgs(
        loss_params={"eps_low": 0.2, "eps_high": 0.28, "dual_clip": 3.0},
        kernel=kernel,
        loss_agg_mode=mode,
        norm_constant=7,
    )
    full, _ = objectives.policy_loss(logp, old, adv, mask, args)
    (g_full,) = torch.autograd.grad(full, logp)
    n_tok = float(mask.sum())
    n_seq = float((mask.sum(-1) > 0).sum())
    total = 0.0
    g_acc = torch.zeros_like(logp)
    for rows in torch.arange(logp.shape[0]).tensor_split(parts):
        lp = logp.detach()[rows].requires_grad_(True)
        l, _ = objectives.policy_loss(
            lp, old[rows], adv[rows], mask[rows], args, global_tokens=n_tok, global_seqs=n_seq
        )
        (g,) = torch.autograd.grad(l, lp)
        g_acc[rows] = g
        total += l.item()
    assert total == pytest.approx(full.item(), rel=1e-5, abs=1e-6)
    torch.testing.assert_close(g_acc, g_full, atol=1e-6, rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(list(objectives.AGG_MODES)))
def test_gspo_token_equals_gspo_with_constant_advantage(seed, mode):
    logp, old, _, mask = _random_case(seed)
    a = torch.randn(logp.shape[0], generator=torch.Generator().manual_seed(seed + 1))
    adv = a[:, None].expand_as(logp)
    kw = dict(loss_params={"eps_low": 3e-4, "eps_high": 4e-4}, loss_agg_mode=mode)
    l1, _ = objectives.policy_loss(logp, old, adv, mask, objectives.ObjectiveArgs(kernel="gspo", **kw))
    (g1,) = torch.autograd.grad(l1, logp)
    l2, _ = objectives.policy_loss(logp, old, adv, mask, objectives.ObjectiveArgs(kernel="gspo-token", **kw))
    (g2,) = torch.autograd.grad(l2, logp)
    assert l1.item() == pytest.approx(l2.item(), rel=1e-6, abs=1e-7)
    torch.testing.assert_close(g1, g2, atol=1e-6, rtol=1e-5)


def test_gspo_sequence_ratio_value():
    l = torch.tensor([[0.02, -0.01, 0.05, 0.00]])
    m = torch.ones(1, 4, dtype=torch.bool)
    assert objectives.sequence_log_ratio(l, m).item() == pytest.approx(0.015)
    lp = l.clone().requires_grad_(True)
    loss, met = objectives.policy_loss(
        lp,
        torch.zeros(1, 4),
        torch.ones(1),
        m,
        objectives.ObjectiveArgs(kernel="gspo", loss_params={"eps_low": 1, "eps_high": 1}),
    )
    assert met["ratio_mean"] == pytest.approx(1.015113, abs=1e-6)
    loss.backward()  # token-mean of -s: each token's grad = -s/4... times d(mean)/dl_t = 1/4 summed over 4 tokens
    torch.testing.assert_close(lp.grad, torch.full((1, 4), -1.015113 / 4), atol=1e-6, rtol=0)


def test_unknown_kernel_and_kernel_needs_old_logprob():
    m = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ConfigError, match="closest: gspo"):
        objectives.ObjectiveArgs(kernel="gsp")
    with pytest.raises(ConfigError, match="old_log_prob"):
        objectives.policy_loss(torch.zeros(1, 2), None, torch.ones(1), m)

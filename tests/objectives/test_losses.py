"""The loss registry: flags that tell the truth, composition with kernels and credit, errors, bf16.

Equality with verl's and TRL's own functions is in test_vs_verl.py; here are the properties that hold
for every registered loss.
"""

from __future__ import annotations

import pytest
import torch

from tokencredit import objectives
from tokencredit.errors import ConfigError
from tokencredit.objectives import LOSSES, ObjectiveArgs, effective_credit, get_loss, policy_loss

N, T = 6, 8
LENGTHS = torch.tensor([8, 0, 1, 5, 8, 3])
MASK = torch.arange(T)[None] < LENGTHS[:, None]


def batch(seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(N, T, generator=g, dtype=dtype) * 2 - 0.05
    new = (old + 0.3 * torch.randn(N, T, generator=g, dtype=dtype)).clamp(max=-1e-3)
    adv = torch.randn(N, T, generator=g, dtype=dtype)
    return new.requires_grad_(True), old, adv


@pytest.mark.parametrize("name", list(LOSSES))
def test_per_token_flag_is_the_on_policy_gradient(name):
    """At pi = pi_old the gradient weight of token t is Â_t exactly when the loss says per_token (token kernel)."""
    g = torch.Generator().manual_seed(1)
    a_hat = torch.randn(N, T, generator=g, dtype=torch.float64) * MASK
    old = -torch.rand(N, T, generator=g, dtype=torch.float64) * 2 * MASK
    torch.manual_seed(0)
    got = effective_credit(a_hat, MASK, ObjectiveArgs(loss=name), old_log_probs=old)
    if get_loss(name).per_token:
        torch.testing.assert_close(got, a_hat.float(), atol=1e-6, rtol=1e-6)
    else:
        assert not torch.allclose(got, a_hat.float(), atol=1e-3)


@pytest.mark.parametrize("name", [n for n in LOSSES if get_loss(n).uses_ratio])
@pytest.mark.parametrize("kernel", ["token", "gspo", "gspo-token", "ptrace", "grpo-lambda"])
@pytest.mark.parametrize("mode", objectives.AGG_MODES)
def test_every_ratio_loss_composes_with_every_kernel_and_mode(name, kernel, mode):
    log_prob, old, adv = batch(2)
    torch.manual_seed(0)
    loss, metrics = policy_loss(
        log_prob, old, adv, MASK, ObjectiveArgs(loss=name, kernel=kernel, loss_agg_mode=mode)
    )
    (grad,) = torch.autograd.grad(loss, log_prob)
    assert bool(torch.isfinite(loss)) and bool(torch.isfinite(grad).all())
    assert bool((grad[~MASK] == 0).all())
    assert all(v == v for v in metrics.values())


def test_gmpo_puts_one_value_on_each_response():
    log_prob, old, adv = batch(3)
    per_tok, _ = get_loss("gmpo").fn(
        objectives.LossInputs(log_prob, adv, MASK, log_prob - old, log_prob - old, old),
        eps_low=0.4,
        eps_high=0.4,
    )
    for i in range(N):
        row = per_tok[i][MASK[i]]
        assert row.numel() == 0 or bool((row == row[0]).all())
    assert bool((per_tok[~MASK] == 0).all())


def test_clip_cov_is_reproducible_under_a_seed_and_removes_tokens():
    log_prob, old, adv = batch(4)
    args = ObjectiveArgs(loss="clip-cov", loss_params={"clip_cov_ratio": 0.3, "clip_cov_lb": 0.0})
    torch.manual_seed(7)
    a, ma = policy_loss(log_prob, old, adv, MASK, args)
    torch.manual_seed(7)
    b, _ = policy_loss(log_prob, old, adv, MASK, args)
    assert torch.equal(a, b) and ma["cov_frac"] > 0
    plain, _ = policy_loss(
        log_prob, old, adv, MASK, ObjectiveArgs(loss_params={"eps_low": 0.2, "eps_high": 0.2})
    )
    assert not torch.equal(a, plain)


def test_vespo_weight_is_one_on_policy_and_small_far_off_policy():
    log_prob, old, adv = batch(5)
    on, _ = policy_loss(old.clone().requires_grad_(True), old, adv, MASK, ObjectiveArgs(loss="vespo"))
    reinforce, _ = policy_loss(
        old.clone().requires_grad_(True), None, adv, MASK, ObjectiveArgs(loss="reinforce")
    )
    torch.testing.assert_close(on, reinforce)
    far, _ = policy_loss(old + 3.0, old, adv, MASK, ObjectiveArgs(loss="vespo"))
    assert abs(float(far)) < 1e-6  # w = e^(3 L) >> 1: phi = exp(lambda (1 + log w - w)) ~ 0


def test_dppo_needs_old_log_probs_and_masks_tokens_outside_the_region():
    log_prob, old, adv = batch(6)
    inputs = objectives.LossInputs(log_prob, adv, MASK, log_prob - old, log_prob - old, None)
    with pytest.raises(ConfigError, match="old_log_prob"):
        get_loss("dppo-tv").fn(inputs)
    args = ObjectiveArgs(loss="dppo-tv", loss_params={"eps_low": 0.01, "eps_high": 0.01})
    _, metrics = policy_loss(log_prob, old, adv, MASK, args)
    assert metrics["clip_frac"] > 0


@pytest.mark.parametrize(
    ("loss", "params", "match"),
    [
        ("sapo", {"tau_pos": 0.0}, "tau_pos"),
        ("clip-cov", {"clip_cov_ratio": 0.0}, "clip_cov_ratio"),
        ("kl-cov", {"kl_cov_ratio": -1.0}, "kl_cov_ratio"),
        ("kl-cov", {"ppo_kl_coef": -0.1}, "ppo_kl_coef"),
        ("dppo-kl", {"clip_ratio_c": 0.0}, "clip_ratio_c"),
        ("cispo", {"tau_pos": 1.0}, "no parameter .tau_pos.*eps_high, eps_low"),
        ("vespo", {"k_po": 1.0}, "closest: k_pos"),
    ],
)
def test_bad_parameters_are_config_errors(loss, params, match):
    log_prob, old, adv = batch(7)
    with pytest.raises(ConfigError, match=match):
        policy_loss(log_prob, old, adv, MASK, ObjectiveArgs(loss=loss, loss_params=params))


def test_gpg_is_reinforce_and_takes_no_ratio():
    log_prob, _, adv = batch(8)
    a, _ = policy_loss(log_prob, None, adv, MASK, ObjectiveArgs(loss="gpg"))
    b, _ = policy_loss(log_prob, None, adv, MASK, ObjectiveArgs(loss="reinforce"))
    assert torch.equal(a, b) and not get_loss("gpg").uses_ratio
    with pytest.raises(ConfigError, match="no importance ratio"):
        ObjectiveArgs(loss="gpg", kernel="gspo")


@pytest.mark.parametrize("name", [n for n in LOSSES if get_loss(n).uses_ratio])
def test_bf16_inputs_give_finite_losses(name):
    log_prob, old, adv = batch(9)
    lp = log_prob.detach().bfloat16().requires_grad_(True)
    torch.manual_seed(0)
    loss, _ = policy_loss(lp, old.bfloat16(), adv.bfloat16(), MASK, ObjectiveArgs(loss=name))
    loss.backward()
    assert bool(torch.isfinite(loss)) and bool(torch.isfinite(lp.grad).all())

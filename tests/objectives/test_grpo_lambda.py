"""GRPO(lambda)'s trace kernels (docs/spec/strace.md, "GRPO(λ), the baseline S-trace compares against")."""

from __future__ import annotations

import pytest
import torch

from tokencredit.errors import ConfigError
from tokencredit.objectives import (
    ObjectiveArgs,
    effective_credit,
    grpo_lambda_log_weights,
    policy_loss,
    trace_log_weights,
)

L = torch.tensor([[0.02, -0.01, 0.05, 0.00]])
ONE_ROW = torch.ones(1, 4, dtype=torch.bool)


def grpo_lambda(loss_params: dict | None = None, **kernel_args) -> ObjectiveArgs:
    """PPO-clip with the GRPO(lambda) kernel and these kernel arguments."""
    return ObjectiveArgs(loss_params=loss_params or {}, kernel="grpo-lambda", kernel_args=kernel_args)


def naive(log_ratio: torch.Tensor, mask: torch.Tensor, decay: float, trace: str) -> torch.Tensor:
    """sum_{j<=t} tr(t, j) l_j by a double loop over each row's valid tokens (positions count valid tokens)."""
    out = torch.zeros_like(log_ratio, dtype=torch.float64)
    for r in range(log_ratio.shape[0]):
        cols = mask[r].nonzero().flatten().tolist()
        for t, ct in enumerate(cols):
            for j, cj in enumerate(cols[: t + 1]):
                tr = decay ** (t - j) if trace == "recent" else max(decay ** (t - j), decay**j)
                out[r, ct] += tr * float(log_ratio[r, cj])
    return out


def test_spec_vectors():
    torch.testing.assert_close(
        grpo_lambda_log_weights(L, ONE_ROW, 0.5, "recent"), torch.tensor([[0.02, 0.0, 0.05, 0.025]])
    )
    torch.testing.assert_close(
        grpo_lambda_log_weights(L, ONE_ROW, 0.5, "both"), torch.tensor([[0.02, 0.01, 0.065, 0.04]])
    )


def test_on_policy_credit_of_recent_trace():
    # docs/spec/strace.md (GRPO(λ) section): credit k = (1/T) sum_{t>=k} tr(t, k) = [0.46875, 0.4375, 0.375, 0.25]; effective_credit is that x T
    got = effective_credit(torch.ones(1, 4), ONE_ROW, grpo_lambda(gamma=1.0, lam=0.5))
    torch.testing.assert_close(got, torch.tensor([[0.46875, 0.4375, 0.375, 0.25]]) * 4, atol=1e-6, rtol=0)
    both = effective_credit(torch.ones(1, 4), ONE_ROW, grpo_lambda(gamma=0.5, lam=1.0, trace="both"))
    # sum over t >= k of max(0.5^(t-k), 0.5^k): k=0 -> 4, k=1 -> 1 + 0.5 + 0.5, k=2 -> 1 + 0.5, k=3 -> 1
    torch.testing.assert_close(both, torch.tensor([[4.0, 2.0, 1.5, 1.0]]), atol=1e-6, rtol=0)


def _ragged(seed: int, holes: bool):
    g = torch.Generator().manual_seed(seed)
    n, t = 6, 40
    lengths = torch.tensor([40, 0, 1, 17, 33, 5])
    mask = torch.arange(t)[None] < lengths[:, None]
    if holes:
        mask &= torch.rand(n, t, generator=g) > 0.3
    log_ratio = (0.2 * torch.randn(n, t, generator=g, dtype=torch.float64)).requires_grad_(True)
    return log_ratio, mask


@pytest.mark.parametrize("holes", [False, True])
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 0.95), (0.9, 0.7), (1.0, 0.0), (1.0, 1.0)])
def test_accumulating_kernel_is_grpo_lambda_recent(gamma, lam, holes):
    """Today's "accumulating" trace with lam = gamma * lambda is GRPO(lambda)-recent: values and gradients."""
    log_ratio, mask = _ragged(1, holes)
    a = trace_log_weights(log_ratio, mask, gamma * lam, normalized=False, decay="kept")
    b = grpo_lambda_log_weights(log_ratio, mask, gamma * lam, "recent")
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    adv = torch.randn(mask.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    old = torch.zeros_like(log_ratio)
    clip = {"eps_low": 0.2, "eps_high": 0.28}
    accumulating = ObjectiveArgs(loss_params=clip, kernel="accumulating", kernel_args={"lam": gamma * lam})
    acc, _ = policy_loss(log_ratio, old, adv, mask, accumulating)
    (ga,) = torch.autograd.grad(acc, log_ratio)
    grl, _ = policy_loss(log_ratio, old, adv, mask, grpo_lambda(loss_params=clip, gamma=gamma, lam=lam))
    (gb,) = torch.autograd.grad(grl, log_ratio)
    torch.testing.assert_close(acc, grl, atol=1e-12, rtol=0)
    torch.testing.assert_close(ga, gb, atol=1e-12, rtol=0)


@pytest.mark.parametrize("holes", [False, True])
@pytest.mark.parametrize("decay", [0.0, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("trace", ["recent", "both"])
def test_matches_double_loop(trace, decay, holes):
    log_ratio, mask = _ragged(3, holes)
    got = grpo_lambda_log_weights(log_ratio, mask, decay, trace)
    torch.testing.assert_close(
        got.detach(), naive(log_ratio.detach(), mask, decay, trace), atol=1e-10, rtol=0
    )
    assert bool((got[~mask] == 0).all())


def test_both_gradient_matches_double_loop():
    log_ratio, mask = _ragged(4, True)
    w = torch.randn(mask.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    (g,) = torch.autograd.grad((grpo_lambda_log_weights(log_ratio, mask, 0.8, "both") * w).sum(), log_ratio)
    # d/dl_j sum_t w_t sum_{i<=t} tr(t, i) l_i = sum_{t>=j} w_t tr(t, j), again by the double loop
    want = torch.zeros_like(g)
    for r in range(mask.shape[0]):
        cols = mask[r].nonzero().flatten().tolist()
        for t, ct in enumerate(cols):
            for j, cj in enumerate(cols[: t + 1]):
                want[r, cj] += float(w[r, ct]) * max(0.8 ** (t - j), 0.8**j)
    torch.testing.assert_close(g, want, atol=1e-10, rtol=0)


def test_long_responses_stay_finite():
    t = 8192
    log_ratio = 1e-3 * torch.randn(2, t)
    mask = torch.ones(2, t, dtype=torch.bool)
    for trace in ("recent", "both"):
        out = grpo_lambda_log_weights(log_ratio, mask, 0.999, trace)
        assert bool(torch.isfinite(out).all()) and out.dtype == torch.float32


def test_bad_configuration():
    with pytest.raises(ConfigError, match=r"gamma \* lam"):
        grpo_lambda_log_weights(L, ONE_ROW, 1.5)
    with pytest.raises(ConfigError, match="trace"):
        grpo_lambda_log_weights(L, ONE_ROW, 0.5, "old")
    with pytest.raises(ConfigError, match="closest: trace"):
        grpo_lambda(traces="both")

"""GAE and the clipped value loss against verl 0.9.1's own functions (`compute_gae_advantage_return`,
`compute_value_loss` with its `agg_loss`), on random batches: float32 and bf16 inputs (verl is given the
same numbers in float64), masks with padding, an empty row, one-token rows and a hole inside a row, ties
between the clipped and unclipped value losses. Advantages, returns, the loss, its clip fraction and its
gradient with respect to the predicted values agree to 1e-6."""

from __future__ import annotations

import pytest
import torch

from tokencredit import advantages, objectives
from tokencredit.advantages.gae import critic_targets, gae, outcome_rewards
from tokencredit.batch import RolloutBatch
from tokencredit.critic import value_loss

# needs tokencredit[verl]: skipped without it, run by `pytest -m extras`
pytestmark = pytest.mark.extras
ca = pytest.importorskip(
    "verl.trainer.ppo.core_algos", reason="verl is not installed (extra tokencredit[verl])"
)

TOL = 1e-6
LENGTHS = [7, 0, 1, 4, 7, 3, 1, 5, 6, 2, 7, 4]
N, T = len(LENGTHS), max(LENGTHS)
DTYPES = [torch.float32, torch.bfloat16]


def mask_of(hole: bool = False) -> torch.Tensor:
    m = torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]
    if hole:  # verl skips masked tokens inside a row ("observation tokens"); so does tokencredit
        m[0, 3] = False
        m[4, 1] = False
    return m


def inputs(seed: int, dtype: torch.dtype, hole: bool = False):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 2, (N,), generator=g).to(dtype)
    values = torch.rand(N, T, generator=g).to(dtype)
    return scores, values, mask_of(hole)


def assert_close(got, want, what):
    diff = float((got.double() - want.double()).abs().max()) if got.numel() else 0.0
    assert diff <= TOL * max(1.0, float(want.double().abs().max())), f"{what}: max |diff| = {diff:.3g}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hole", [False, True])
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (1.0, 0.95), (0.9, 0.95), (0.99, 0.0)])
def test_gae_matches_verl(dtype, hole, gamma, lam):
    scores, values, mask = inputs(0, dtype, hole)
    rewards = outcome_rewards(scores, mask)
    want_adv, want_ret = ca.compute_gae_advantage_return(
        rewards, values.double(), mask.double(), torch.tensor(gamma), torch.tensor(lam)
    )
    batch = RolloutBatch(
        torch.zeros(N, T, dtype=torch.long), mask, torch.arange(N), scores.float(), values=values
    )
    params = {"gamma": gamma, "lam": lam}
    assert_close(gae(batch, **params)[mask], want_adv[mask], "whitened advantages (float64)")
    assert_close(advantages.estimate("gae", batch, **params)[mask], want_adv[mask], "estimate() (float32)")
    assert_close(critic_targets(batch, **params)[mask], want_ret[mask], "returns")
    # what verl leaves past a row's end is not a valid token's: tokencredit gives 0 there
    assert advantages.estimate("gae", batch, **params)[~mask].abs().sum() == 0
    assert critic_targets(batch, **params)[~mask].abs().sum() == 0
    # the token-level reward verl is handed: one non-zero per non-empty row, on its last valid token
    last = mask.long().cumsum(-1).argmax(-1)
    nonempty = mask.any(-1)
    assert torch.equal(rewards[nonempty, last[nonempty]], scores[nonempty].double())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", objectives.AGG_MODES)
@pytest.mark.parametrize("cliprange", [0.5, 0.05])
def test_value_loss_and_gradient_match_verl(dtype, mode, cliprange):
    g = torch.Generator().manual_seed(3)
    mask = mask_of(hole=True)
    old = torch.rand(N, T, generator=g).to(dtype).double()
    returns = torch.randint(0, 2, (N, T), generator=g).to(dtype).double()
    vpred = (old + 0.6 * torch.randn(N, T, generator=g)).to(dtype).double()
    # ties: V on the clip boundary, V equal to R, the clipped and unclipped errors equal
    vpred[0, :3] = old[0, :3] + cliprange
    vpred[3, 0] = returns[3, 0]
    vpred[7, 1] = old[7, 1]
    ours_v = vpred.clone().requires_grad_(True)
    theirs_v = vpred.clone().requires_grad_(True)
    loss, clipfrac = value_loss(ours_v, returns, old, mask, cliprange, mode)
    want, want_frac = ca.compute_value_loss(
        theirs_v, returns, old, mask.double(), cliprange, loss_agg_mode=mode
    )
    assert_close(loss.detach(), want.detach(), f"value loss ({mode})")
    assert_close(clipfrac, torch.as_tensor(want_frac), "clip fraction")
    (grad,) = torch.autograd.grad(loss, ours_v)
    (want_grad,) = torch.autograd.grad(want, theirs_v)
    assert_close(grad, want_grad, f"d loss / d V ({mode})")

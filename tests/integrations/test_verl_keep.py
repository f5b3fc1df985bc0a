"""The kept (high-entropy) token set through the verl plugin when most entropies are exactly 0.

verl computes the old policy's entropy as logsumexp(z) - sum(softmax(z) z), under bf16 autocast on a
GPU: for a confident policy most tokens get exactly 0 (measured: 92% of the toy model's response
tokens in verl's v1 trainer). The threshold rule "entropy >= the 0.8 quantile" then keeps every
token. Here the plugin's S-trace and 80/20 estimators must keep exactly ceil(0.2 n) tokens of a batch
whose entropies are 90% zeros, in float32 and bf16, the tc_strace loss must train exactly those, and
the actor extension's float32 entropy must replace verl's in forward-only steps.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.extras  # needs tokencredit[verl]: skipped without it, run by `pytest -m extras`
pytest.importorskip(
    "verl", reason="verl is not installed (extra tokencredit[verl]; see docs/integrations.md)"
)
from tensordict import TensorDict  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo import core_algos, ray_trainer  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils import torch_functional as verl_f  # noqa: E402
from verl.workers.config import FSDPActorConfig  # noqa: E402

import tokencredit.integrations.verl  # noqa: E402, F401  (registers the tc_ names)
from tokencredit import advantages  # noqa: E402
from tokencredit.credit.entropy import entropy_from_logits, top_entropy_mask  # noqa: E402
from tokencredit.integrations.verl import actor as tc_actor  # noqa: E402

N, T, G = 10, 20, 5


def _batch(dtype: torch.dtype) -> tuple[DataProto, torch.Tensor, torch.Tensor]:
    """2 groups x 5 responses, every response with a non-zero group advantage; 200 valid tokens, of
    which 180 (90%) have entropy exactly 0."""
    mask = torch.ones(N, T, dtype=torch.long)
    ent = torch.zeros(N, T)
    for i in range(N):
        ent[i, 2 + i % 5] = 2 * i + 1  # distinct, exact in bf16
        ent[i, 12 - i % 3] = 2 * i + 2
    assert (ent == 0).sum() == 180
    scores = torch.tensor([1.0, 0, 0, 0, 1, 0, 1, 1, 1, 0])
    rewards = torch.zeros(N, T)
    rewards[:, -1] = scores
    data = DataProto.from_dict(
        tensors={
            "responses": torch.randint(3, 90, (N, T), generator=torch.Generator().manual_seed(0)),
            "response_mask": mask,
            "token_level_rewards": rewards,
            "tc_entropy": ent.to(dtype),
        },
        non_tensors={"uid": np.array([f"g{i // G}" for i in range(N)], dtype=object)},
    )
    return data, ent, scores


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["tc_strace", "tc_entropy_80_20"])
def test_estimators_keep_exactly_keep_ratio_of_the_tokens(name, dtype):
    data, ent, scores = _batch(dtype)
    mask = data.batch["response_mask"].bool()
    adv = ray_trainer.compute_advantage(
        data, adv_estimator=name, config=AlgoConfig(adv_estimator=name)
    ).batch["advantages"]
    kept = adv != 0
    assert int(kept.sum()) == math.ceil(0.2 * 200) == 40  # not 200, as entropy >= quantile would give
    assert (ent[kept] > 0).sum() == 20  # every non-zero entropy, then the 20 earliest zeros
    gids = torch.arange(N) // G
    want = advantages.grpo(scores, gids)[:, None] * top_entropy_mask(ent, mask, 0.2, "batch")
    torch.testing.assert_close(adv, want, rtol=0, atol=1e-6)


def test_strace_loss_trains_exactly_the_kept_tokens():
    data, _, _ = _batch(torch.bfloat16)
    name = "tc_strace"
    adv = ray_trainer.compute_advantage(
        data, adv_estimator=name, config=AlgoConfig(adv_estimator=name)
    ).batch["advantages"]
    mask = data.batch["response_mask"]
    old = -torch.rand(N, T, generator=torch.Generator().manual_seed(1)) - 0.1
    new = (old + 0.01 * torch.randn(N, T, generator=torch.Generator().manual_seed(2))).requires_grad_()
    cfg = FSDPActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_high=0.28)
    loss, _ = core_algos.get_policy_loss_fn(name)(old, new, adv, mask, "token-mean", cfg, None)
    (grad,) = torch.autograd.grad(loss, new)
    assert int((grad != 0).sum()) == 40


# ---------------------------------------------------------------------------------------------- actor extension
class _Engine:
    """Stands in for verl's FSDPEngineWithLMHead: its forward step computes entropy through both of
    verl's call sites (the engine attribute, remove-padding layout; the module function, padded layout)."""

    def __init__(self) -> None:
        self.compute_entropy_from_logits = verl_f.entropy_from_logits

    def forward_step(self, micro_batch, loss_function, forward_only):
        logits = micro_batch["logits"]
        return None, {
            "model_output": {
                "entropy": (self.compute_entropy_from_logits(logits), verl_f.entropy_from_logits(logits))
            }
        }


def _confident_logits() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    z = torch.randn(6, 40, generator=g)
    z[:, 3] += torch.linspace(8, 30, 6)  # from H ~ 1e-2 down to H ~ 1e-11
    return z.to(torch.bfloat16)


@pytest.mark.parametrize("forward_only", [True, False])
def test_actor_extension_entropy_is_float32_in_forward_only_steps(forward_only):
    logits = _confident_logits()
    verls = verl_f.entropy_from_logits(logits)
    assert (verls == 0).sum() >= 3  # verl's formula: the confident rows come out exactly 0 in bf16
    batch = TensorDict({"logits": logits}, batch_size=[6])
    tu.assign_non_tensor(batch, calculate_entropy=True)
    engine = _Engine()
    step = tc_actor.wrap_forward_step(_Engine.forward_step)
    got = step(engine, batch, None, forward_only)[1]["model_output"]["entropy"]
    want = entropy_from_logits(logits) if forward_only else verls
    for value in got:
        assert value.dtype == want.dtype and torch.equal(value, want)
    if forward_only:
        assert (got[0] > 0).all()
    # verl's functions are back in place afterwards
    assert engine.compute_entropy_from_logits is verl_f.entropy_from_logits
    assert torch.equal(verl_f.entropy_from_logits(logits), verls)


def test_actor_extension_leaves_steps_without_entropy_alone():
    batch = TensorDict({"logits": _confident_logits()}, batch_size=[6])
    tu.assign_non_tensor(batch, calculate_entropy=False)
    engine = _Engine()
    with tc_actor.float32_entropy(engine, batch):
        assert engine.compute_entropy_from_logits is verl_f.entropy_from_logits

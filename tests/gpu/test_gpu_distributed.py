"""DelTA / ARCA statistics and the global top-k through torch.distributed on the device: nccl on CUDA
(gloo with TOKENCREDIT_TEST_DEVICE=cpu), world size 1, in this process.

tests/test_distributed.py checks the layout invariance with 2 gloo ranks on the CPU; here the same core
runs with its collectives on the device's backend. The one rank holds every rollout in a shuffled order
(`Shard.rows` a permutation), so the global-order tie-breaking is exercised; each result must equal the
one-process result on the CPU without a shard, and the collectives must really have been called.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from _gpu import BACKEND, DEVICE, MARKS, free_port

from tokencredit.batch import RolloutBatch
from tokencredit.credit.arca import residual_norm
from tokencredit.credit.delta import discriminate
from tokencredit.credit.entropy import top_entropy_mask
from tokencredit.distributed import Shard, global_top_k
from tokencredit.recipes import token_credit

pytestmark = MARKS

N_GROUPS, G, T, H = 6, 4, 11, 16
N = N_GROUPS * G
RECIPES = ("grpo", "dapo+ktae", "delta", "arca", "entropy-80-20", "strace")


@pytest.fixture(scope="module")
def group() -> Iterator[None]:
    assert not dist.is_initialized(), "a process group is already open in this process"
    if DEVICE.type == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group(BACKEND, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def collectives(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the collectives called (all_reduce, all_gather) while the test runs."""
    calls: list[str] = []
    for name in ("all_reduce", "all_gather"):
        plain = getattr(dist, name)

        def counted(*args, _plain=plain, _name=name, **kwargs):
            calls.append(_name)
            return _plain(*args, **kwargs)

        monkeypatch.setattr(dist, name, counted)
    return calls


def _full() -> dict[str, torch.Tensor]:
    """One batch on the CPU, entropies drawn from a few values (many ties at every top-k boundary)."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, T + 1, (N,), generator=gen)
    lengths[2] = T
    mask = torch.arange(T)[None, :] < lengths[:, None]
    levels = torch.tensor([0.0, 0.0, 0.125, 0.5, 0.5, 1.0, 2.0])
    hidden = torch.randn(N, T, H, generator=gen)
    scores = (torch.rand(N, generator=gen) > 0.5).float()
    scores[:G] = torch.tensor([1.0, 0.0, 0.0, 1.0])
    return {
        "token_ids": torch.randint(0, 7, (N, T), generator=gen),
        "mask": mask,
        "group_ids": torch.arange(N) // G * 5 + 2,
        "scores": scores,
        "old_log_probs": -torch.rand(N, T, generator=gen) * 3 * mask,
        "entropy": levels[torch.randint(0, len(levels), (N, T), generator=gen)] * mask,
        "hidden": hidden,
        "base_hidden": hidden + 0.3 * torch.randn(N, T, H, generator=gen),
    }


PERM = torch.randperm(N, generator=torch.Generator().manual_seed(1))


def _on_device(full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch's rows in PERM's order, on the device."""
    return {k: v[PERM].to(DEVICE) for k, v in full.items()}


def _shard() -> Shard:
    return Shard(PERM.to(DEVICE), N)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("iters", [0, 2])
def test_delta_coefficients(group, collectives, dtype, iters):
    full = _full()
    adv = torch.linspace(-1.5, 1.5, N) * torch.tensor([1.0, 0.0, 1.0, -1.0]).repeat(N_GROUPS)
    scale = (-torch.expm1(full["old_log_probs"])).clamp(0, 1)
    ref = discriminate(full["hidden"].to(dtype), scale, adv, full["mask"], refine_iters=iters).coefficients
    dev = _on_device(full)
    got = discriminate(
        dev["hidden"].to(dtype), scale[PERM].to(DEVICE), adv[PERM].to(DEVICE), dev["mask"], refine_iters=iters,
        shard=_shard(),
    ).coefficients  # fmt: skip
    assert got.device.type == DEVICE.type
    assert "all_reduce" in collectives
    torch.testing.assert_close(got.cpu(), ref[PERM], atol=1e-5, rtol=1e-5)


def test_arca_residual_norm():
    full = _full()
    for dtype in (torch.float32, torch.bfloat16):
        ref = residual_norm(full["hidden"].to(dtype), full["base_hidden"].to(dtype), full["mask"])
        dev = _on_device(full)
        got = residual_norm(dev["hidden"].to(dtype), dev["base_hidden"].to(dtype), dev["mask"])
        torch.testing.assert_close(got.cpu(), ref[PERM], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("ratio", [0.2, 0.37, 0.5])
def test_global_top_k_is_the_one_process_set(group, collectives, ratio):
    full = _full()
    ref = top_entropy_mask(full["entropy"], full["mask"], ratio)
    dev = _on_device(full)
    got = top_entropy_mask(dev["entropy"], dev["mask"], ratio, shard=_shard())
    assert "all_reduce" in collectives
    assert torch.equal(got.cpu(), ref[PERM])
    boundary = full["entropy"][ref].min()
    assert int(((full["entropy"] == boundary) & full["mask"] & ~ref).sum()) > 0, (
        "no tie left out at the boundary"
    )


def test_global_top_k_every_k(group):
    full = _full()
    valid, values = full["mask"], full["entropy"]
    order = torch.sort(torch.where(valid, values, -1.0).reshape(-1), descending=True, stable=True).indices
    dev = _on_device(full)
    for k in (0, 1, 7, 40, int(valid.sum()) - 1, int(valid.sum()) + 3):
        expect = torch.zeros(N * T, dtype=torch.bool)
        expect[order[: min(k, int(valid.sum()))]] = True
        got = global_top_k(dev["entropy"], dev["mask"], k, _shard())
        assert torch.equal(got.cpu(), expect.reshape(N, T)[PERM]), k


@pytest.mark.parametrize("recipe", RECIPES)
def test_credit_pipeline(group, collectives, recipe):
    full = _full()
    ref = token_credit(recipe, RolloutBatch(**full)).token_advantages
    got = token_credit(recipe, RolloutBatch(**_on_device(full), shard=_shard())).token_advantages
    assert got.device.type == DEVICE.type
    assert collectives, "the sharded pipeline made no collective"
    torch.testing.assert_close(got.cpu(), ref[PERM], atol=1e-5, rtol=1e-5)

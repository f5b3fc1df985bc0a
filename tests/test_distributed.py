"""Layout invariance of the core under torch.distributed: 2 gloo processes on the CPU.

The same batch on one process and split over 2 ranks (each rank holding only its rollouts, padded to
its own longest response) must give every rank its rows of the single-process result, to 1e-5, for
the credit pipeline (`token_credit`) of grpo, delta, arca, entropy-80-20, strace and ktae (and a few
more), and for the sharded core functions themselves: DelTA's coefficients (float32 and bf16 hidden
states, 0 and 2 refinements), the exact top-k kept set with heavy ties at the boundary, KTAE's key
values. Splits: contiguous with a prompt's responses on both ranks, interleaved (every prompt on both
ranks, rows out of order), and everything on one rank (the other holds no rollout and still joins
every collective). One launch of 2 processes covers every case (a few seconds of start-up).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tokencredit.batch import RolloutBatch
from tokencredit.credit.delta import discriminate
from tokencredit.credit.entropy import top_entropy_mask
from tokencredit.credit.ktae import key_token_values
from tokencredit.recipes import token_credit

HERE = Path(__file__).resolve().parent
# The five (delta, arca, entropy-80-20, strace, ktae), GRPO, every estimator that reads more than
# scores (reinforce++, remax, opo, gpg, grpo-passk, otb), PEPO (per response) and its 80/20 and S-trace frames (a
# global top-k of proximal entropies), CW-GRPO (whole-batch covariance statistics), and the learned critic's GAE (ppo:
# its A whitened over every rank's tokens; bpco: unwhitened, VAPO's per-row lam) on the batch's critic values.
RECIPES = (
    "grpo",
    "delta",
    "arca",
    "entropy-80-20",
    "strace",
    "grpo+ktae",
    "dapo+ktae",
    "gcpo",
    "policy-divergence",
    "reinforce++",
    "remax",
    "opo",
    "gpg",
    "grpo-passk",
    "otb",
    "rloo",
    "pepo",
    "entropy-80-20-proximal",
    "strace-proximal",
    "cw-grpo",
    "ppo",
    "bpco",
)
SPECIAL_IDS = (0,)
N_GROUPS, G, T, H = 5, 4, 9, 6


def full_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    n = N_GROUPS * G
    lengths = torch.randint(1, T + 1, (n,), generator=gen)
    lengths[3] = T
    mask = torch.arange(T)[None, :] < lengths[:, None]
    # Entropies from a few values (exact zeros, bf16-rounded repeats): many ties at every boundary.
    levels = torch.tensor([0.0, 0.0, 0.125, 0.5, 0.5, 1.0, 2.0]).bfloat16().float()
    entropy = levels[torch.randint(0, len(levels), (n, T), generator=gen)]
    hidden = torch.randn(n, T, H, generator=gen)
    old = -torch.rand(n, T, generator=gen) * 3
    scores = (torch.rand(n, generator=gen) > 0.5).float()
    scores[:G] = torch.tensor([1.0, 0.0, 0.0, 1.0])  # group 0 mixed for sure
    return {
        "token_ids": torch.randint(0, 6, (n, T), generator=gen),  # a small vocabulary: ids shared across rows
        "mask": mask,
        "group_ids": torch.arange(n) // G * 7 + 3,  # global prompt ids, not 0..n-1
        "scores": scores,
        "old_log_probs": old,
        "entropy": entropy,
        "hidden": hidden,
        "base_hidden": hidden + 0.3 * torch.randn(n, T, H, generator=gen),
        "base_log_probs": old - torch.rand(n, T, generator=gen),
        "neg_log_probs": old - torch.rand(n, T, generator=gen),
        "sum_sq_probs": torch.rand(n, T, generator=gen) * 0.5,
        "baseline_scores": (torch.arange(n) // G % 2).float(),
        # a critic's V in [0, 1] (bpco's bounds), 0 off the mask as the value model gives them
        "values": torch.rand(n, T, generator=gen) * mask,
    }


def cases(n: int) -> dict[str, list[torch.Tensor]]:
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    return {
        "contiguous": [torch.arange(0, 10), torch.arange(10, n)],  # prompt 2 (rows 8-11) on both ranks
        "interleaved": [perm[: n // 2 - 3], perm[n // 2 - 3 :]],  # unequal halves, out of order
        "one-rank": [torch.arange(n), torch.arange(0)],
    }


def single(full: dict[str, torch.Tensor]) -> dict[str, object]:
    batch = RolloutBatch(**full)
    out: dict[str, object] = {}
    for name in RECIPES:
        tc = token_credit(name, batch, special_ids=SPECIAL_IDS)
        out[name] = {"tok": tc.token_advantages, "seq": tc.seq_advantages, "loss_mask": tc.loss_mask}
    for ratio in (0.2, 0.5, 0.37):
        out[f"top-{ratio}"] = top_entropy_mask(batch.entropy, batch.mask, ratio)
    scale = (-torch.expm1(batch.old_log_probs)).clamp(0, 1)
    for iters in (0, 2):
        out[f"delta-{iters}"] = discriminate(
            batch.hidden, scale, ADV, batch.mask, refine_iters=iters
        ).coefficients
    out["delta-bf16"] = discriminate(batch.hidden.bfloat16(), scale, ADV, batch.mask).coefficients
    out["ktae-k"] = key_token_values(batch.token_ids, batch.mask, batch.scores > 0.5, batch.group_ids)
    return out


ADV = torch.linspace(-1.5, 1.5, N_GROUPS * G) * torch.tensor([1.0, 0.0, 1.0, -1.0]).repeat(N_GROUPS)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, list]:
    tmp = tmp_path_factory.mktemp("dist")
    full = full_batch()
    splits = cases(full["mask"].shape[0])
    torch.save(
        {
            "batch": full,
            "cases": splits,
            "recipes": RECIPES,
            "special_ids": SPECIAL_IDS,
            "advantages": ADV,
        },
        tmp / "fixture.pt",
    )
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "tc_distributed_worker.py"),
                str(tmp / "fixture.pt"),
                str(tmp),
                str(r),
                "2",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log
    ranks = [torch.load(tmp / f"rank{r}.pt") for r in range(2)]
    return single(full), ranks, splits


def _rows(reference: torch.Tensor, rows: torch.Tensor, width: int) -> torch.Tensor:
    return reference[rows][:, :width]


def _compare(ref: torch.Tensor, got: torch.Tensor, rows: torch.Tensor, what: str) -> None:
    if ref.dim() == 1:
        expect = ref[rows]
    else:
        expect = _rows(ref, rows, got.shape[1])
        assert not bool(ref[rows][:, got.shape[1] :].any()), f"{what}: non-zero past the rank's padding"
    if expect.dtype == torch.bool:
        assert torch.equal(expect, got), f"{what}: kept sets differ"
    else:
        torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-5, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("case", ["contiguous", "interleaved", "one-rank"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_credit_pipeline_is_layout_invariant(two_ranks, case: str, recipe: str) -> None:
    ref, ranks, splits = two_ranks
    for rank, rows in enumerate(splits[case]):
        for field in ("tok", "seq", "loss_mask"):
            _compare(
                ref[recipe][field],
                ranks[rank][case][recipe][field],
                rows,
                f"{recipe} {field} rank {rank} ({case})",
            )


@pytest.mark.parametrize("case", ["contiguous", "interleaved", "one-rank"])
@pytest.mark.parametrize(
    "what", ["top-0.2", "top-0.5", "top-0.37", "delta-0", "delta-2", "delta-bf16", "ktae-k"]
)
def test_sharded_core_functions_match_one_process(two_ranks, case: str, what: str) -> None:
    ref, ranks, splits = two_ranks
    for rank, rows in enumerate(splits[case]):
        _compare(ref[what], ranks[rank][case][what], rows, f"{what} rank {rank} ({case})")


def test_the_fixture_exercises_the_hard_cases(two_ranks) -> None:
    """Ties straddle the kept-set boundary, prompts sit on both ranks, KTAE and DelTA are not trivial."""
    ref, _, splits = two_ranks
    full = full_batch()
    valid = full["mask"]
    for ratio in (0.2, 0.5, 0.37):
        kept = ref[f"top-{ratio}"]
        boundary = full["entropy"][kept].min()
        assert bool((valid & ~kept & (full["entropy"] == boundary)).any()), "no tie at the boundary"
    for case in ("contiguous", "interleaved"):
        prompts = [set(full["group_ids"][rows].tolist()) for rows in splits[case]]
        assert prompts[0] & prompts[1], f"{case}: no prompt on both ranks"
    assert bool((ref["ktae-k"] != 0).any())
    assert float(ref["delta-2"][valid].std()) > 1e-3


def test_a_bad_shard_is_refused_with_its_reason(two_ranks) -> None:
    _, ranks, _ = two_ranks
    for got in ranks:
        assert len(got["errors"]) == 2, got["errors"]
        assert "must lie in [0, 10)" in got["errors"][0]
        assert "exactly once" in got["errors"][1]

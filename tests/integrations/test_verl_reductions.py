"""The actor extension's hidden-state reductions: only [bs, T] values leave a worker, and Â is the core's.

- ARCA: the workers' residual norms -> the estimator's Â equals the core pipeline on the hidden states;
- DelTA: the workers' coefficients (2 gloo processes, rows split unevenly, a prompt's responses on
  both ranks, ranks padded to their own lengths, a rank without valid tokens, bf16 hidden states)
  equal single-process DelTA on the concatenated batch, and the estimator's Â = A c~ equals the core
  pipeline; the A the driver sends is the A the estimator computes, and a change in between is refused;
- the credit diagnostics reach verl's step metrics (legacy: compute_data_metrics; v1: its metrics dict);
- tokencredit's verl losses under 2 data-parallel ranks x 2 micro-batches each (verl's global-batch
  normalisers, gradient accumulation and FSDP's gradient average) equal the single-process loss.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.extras  # needs tokencredit[verl]: skipped without it, run by `pytest -m extras`
pytest.importorskip(
    "verl", reason="verl is not installed (extra tokencredit[verl]; see docs/integrations.md)"
)
from verl import DataProto  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo import core_algos, ray_trainer  # noqa: E402
from verl.workers.config import FSDPActorConfig  # noqa: E402

import tokencredit.integrations.verl as tc_verl  # noqa: E402
from tokencredit import advantages, credit  # noqa: E402
from tokencredit.batch import RolloutBatch  # noqa: E402
from tokencredit.credit.delta import discriminate  # noqa: E402
from tokencredit.errors import ConfigError  # noqa: E402
from tokencredit.integrations.verl import actor as tc_actor  # noqa: E402
from tokencredit.integrations.verl.actor import reductions  # noqa: E402
from tokencredit.recipes import token_credit  # noqa: E402

HERE = Path(__file__).resolve().parent
G, GROUPS, T, H = 4, 4, 9, 6
N = G * GROUPS
TOL = 1e-5


def _fixture(seed: int = 0) -> dict:
    """4 prompts x 4 responses: mixed, mixed, all-correct and mixed groups; lengths 1..9; every signal."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor([9, 4, 7, 1, 9, 6, 3, 8, 5, 9, 2, 7, 6, 3, 8, 4])
    mask = torch.arange(T)[None, :] < lens[:, None]
    scores = torch.tensor([1.0, 0, 0, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 0, 0])
    hidden = torch.randn(N, T, H, generator=g) * mask[..., None]
    return {
        "lens": lens,
        "mask": mask,
        "scores": scores,
        "uid": np.array([f"p{i // G}" for i in range(N)], dtype=object),
        "gids": torch.arange(N) // G,
        "token_ids": torch.randint(3, 40, (N, T), generator=g),
        "hidden": hidden,
        "base_hidden": (hidden + 0.3 * torch.randn(N, T, H, generator=g)) * mask[..., None],
        "old_log_probs": (-torch.rand(N, T, generator=g) * 3 - 0.01) * mask,
        "entropy": torch.rand(N, T, generator=g) * 2 * mask,
    }


def _rewards(f: dict) -> torch.Tensor:
    return torch.zeros(N, T).scatter(1, (f["lens"] - 1)[:, None], f["scores"][:, None])


def _dataproto(f: dict, extra: dict[str, torch.Tensor]) -> DataProto:
    tensors = {
        "responses": f["token_ids"],
        "response_mask": f["mask"].long(),
        "token_level_rewards": _rewards(f),
        "tc_entropy": f["entropy"],
        "old_log_probs": f["old_log_probs"],
        **extra,
    }
    return DataProto.from_dict(tensors=tensors, non_tensors={"uid": f["uid"]})


def _core_batch(f: dict, mask: torch.Tensor | None = None) -> RolloutBatch:
    m = f["mask"] if mask is None else mask
    return RolloutBatch(
        f["token_ids"],
        m,
        f["gids"],
        f["scores"],
        hidden=f["hidden"],
        base_hidden=f["base_hidden"],
        old_log_probs=f["old_log_probs"],
        entropy=f["entropy"],
    )


def _jagged(padded: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    return torch.nested.as_nested_tensor(
        [padded[i, : int(n)] for i, n in enumerate(lens)], layout=torch.jagged
    )


def _advantage(name: str, data: DataProto) -> torch.Tensor:
    out = ray_trainer.compute_advantage(data, adv_estimator=name, config=AlgoConfig(adv_estimator=name))
    assert not any(k in out.batch.keys() for k in tc_actor.ADDED_KEYS)  # dropped after the advantage step
    return out.batch["advantages"]


# ---------------------------------------------------------------------------------------------- ARCA
@pytest.mark.parametrize("sharpening", [1.0, 2.0])
def test_arca_from_the_workers_residual_norms_equals_the_core(sharpening):
    f = _fixture()
    rows = reductions.adapter_residual(
        f["hidden"][f["mask"]], f["base_hidden"][f["mask"]]
    )  # what workers return
    residual = torch.zeros(N, T).masked_scatter(f["mask"], rows)
    name = "tc_arca" if sharpening == 1.0 else "tc_test_arca_sharp2"
    if name != "tc_arca":
        tc_verl.register_estimator(name, "arca", credit_params={"sharpening": sharpening})
    try:
        got = _advantage(name, _dataproto(f, {"tc_adapter_residual": residual}))
        want = token_credit(tc_verl.estimator_spec(name), _core_batch(f)).token_advantages
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        assert (got[~f["mask"]] == 0).all() and got.abs().sum() > 0
        # the same as the estimator on the hidden states themselves (a DataProto that carries them)
        hid = _advantage(name, _dataproto(f, {"tc_hidden": f["hidden"], "tc_base_hidden": f["base_hidden"]}))
        torch.testing.assert_close(got, hid, rtol=0, atol=1e-6)
    finally:
        if (
            name != "tc_arca"
        ):  # leave verl's registry as the plugin made it (test_verl_entry_point.py compares)
            tc_verl.ESTIMATORS.pop(name)
            core_algos.ADV_ESTIMATOR_REGISTRY.pop(name)


# ---------------------------------------------------------------------------------------------- DelTA
def test_delta_from_the_workers_coefficients_equals_the_core_and_checks_the_advantages():
    f = _fixture()
    before = _dataproto(f, {"rm_scores": _rewards(f)})  # the batch at the old-log-prob step
    seq_adv = tc_verl.estimators.worker_advantages("tc_delta", before, AlgoConfig(adv_estimator="tc_delta"))
    torch.testing.assert_close(seq_adv, advantages.grpo(f["scores"], f["gids"]), rtol=0, atol=0)
    params = tc_actor.REDUCTIONS["delta"].worker_params(tc_verl.estimator_spec("tc_delta").credit_params)
    coef_rows = reductions.delta_coefficients(  # one worker holding the whole batch
        _jagged(f["hidden"], f["lens"]), _jagged(f["old_log_probs"], f["lens"]), seq_adv, f["mask"], **params
    )
    coef = torch.nested.to_padded_tensor(coef_rows, 0.0, output_size=(N, T))
    got = _advantage("tc_delta", _dataproto(f, {"tc_delta_coef": coef, "tc_seq_adv": seq_adv}))
    want = token_credit(tc_verl.estimator_spec("tc_delta"), _core_batch(f)).token_advantages
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert len({float(x) for x in got[f["mask"]]}) > N  # non-uniform within rows

    wrong = seq_adv.clone()
    wrong[0] += 0.5  # the rewards changed after the old-log-prob step
    with pytest.raises(ConfigError, match="differ from the ones the workers"):
        _advantage("tc_delta", _dataproto(f, {"tc_delta_coef": coef, "tc_seq_adv": wrong}))
    with pytest.raises(ConfigError, match="use_kl_in_reward"):
        tc_verl.estimators.worker_advantages(
            "tc_delta", before, AlgoConfig(adv_estimator="tc_delta", use_kl_in_reward=True)
        )


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_delta_coefficients_on_two_ranks_equal_one_process(tmp_path):
    f = _fixture(1)
    seq_adv = advantages.grpo(f["scores"], f["gids"])
    params = {"lam_min": 0.8, "lam_max": 1.2, "refine_iters": 2}
    perm = torch.tensor([0, 5, 9, 13, 2, 7, 11, 1, 4, 8, 12, 14, 3, 6, 10, 15])  # every prompt on both ranks
    no_tokens = f["mask"].clone()
    no_tokens[perm[10:]] = False  # rank 1 holds rows without a valid token
    cases = {
        "even": {"rows": [perm[:8], perm[8:]], "response_mask": f["mask"], "dtype": torch.float32},
        "uneven": {"rows": [perm[:11], perm[11:]], "response_mask": f["mask"], "dtype": torch.float32},
        "rank-without-tokens": {
            "rows": [perm[:10], perm[10:]],
            "response_mask": no_tokens,
            "dtype": torch.float32,
        },
        "bf16": {"rows": [perm[:8], perm[8:]], "response_mask": f["mask"], "dtype": torch.bfloat16},
    }
    fixture = tmp_path / "fixture.pt"
    tensors = {k: v for k, v in f.items() if isinstance(v, torch.Tensor)}
    torch.save(
        {**tensors, "seq_adv": seq_adv, "params": params, "cases": cases, "response_mask": f["mask"]}, fixture
    )
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "tc_verl_ranks.py"), str(fixture), str(tmp_path), str(r), "2"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    scale = (-torch.expm1(f["old_log_probs"])).clamp(0, 1)
    for case, spec in cases.items():
        order = torch.cat(spec["rows"])
        got = torch.zeros(N, T)
        for r, rows in enumerate(spec["rows"]):
            assert [len(x) for x in ranks[r][case]] == f["lens"][rows].tolist()  # [r_i] rows, no H
            for i, row in zip(rows.tolist(), ranks[r][case]):
                got[i, : len(row)] = row
        mask = spec["response_mask"]
        # one process, rows in the ranks' order, hidden states in the same dtype
        whole = discriminate(
            f["hidden"][order].to(spec["dtype"]), scale[order], seq_adv[order], mask[order], **params
        ).coefficients
        want = torch.zeros(N, T)
        want[order] = whole
        torch.testing.assert_close(got * mask, want, rtol=0, atol=TOL, msg=case)
        if case == "even":  # Â = A c~ is the core credit method on the whole batch
            core = credit.compute("delta", _core_batch(f), seq_adv, **params)
            torch.testing.assert_close(seq_adv[:, None] * got * mask, core, rtol=0, atol=TOL)
        if case == "rank-without-tokens":
            assert (got[perm[10:]] == 0).all() and got[perm[:10]].abs().sum() > 0


# ---------------------------------------------------------------------------------------------- diagnostics
def test_credit_diagnostics_reach_verl_step_metrics():
    f = _fixture()
    data = _dataproto(f, {})
    out = ray_trainer.compute_advantage(
        data, adv_estimator="tc_ktae", config=AlgoConfig(adv_estimator="tc_ktae")
    )
    metrics = out.meta_info[tc_verl.estimators.METRICS_KEY]
    names = {
        "credit_gini",
        "credit_eff_ratio",
        "credit_sign_flip",
        "credit_high_entropy_share",
        "adv_min",
        "adv_max",
    }
    assert {f"tokencredit/{n}" for n in names} <= set(metrics)
    adv = out.batch["advantages"][f["mask"]]
    assert metrics["tokencredit/adv_min"] == pytest.approx(float(adv.min()))
    assert metrics["tokencredit/adv_max"] == pytest.approx(float(adv.max()))
    assert 0 < metrics["tokencredit/credit_gini"] < 1 and 0 < metrics["tokencredit/credit_eff_ratio"] <= 1
    # legacy trainer: fit's compute_data_metrics (hooked in ray_trainer) adds them to the step's metrics
    assert getattr(ray_trainer.compute_data_metrics, "tokencredit_hook", False)
    hooked = tc_verl.hooks._wrap_compute_data_metrics(lambda batch, use_critic=False: {"verl/x": 1.0})
    step = hooked(batch=out, use_critic=False)
    assert step["verl/x"] == 1.0 and step["tokencredit/credit_gini"] == metrics["tokencredit/credit_gini"]
    assert tc_verl.estimators.METRICS_KEY not in out.meta_info  # consumed once
    assert hooked(batch=_dataproto(f, {}), use_critic=False) == {
        "verl/x": 1.0
    }  # verl's own estimators: unchanged


# ---------------------------------------------------------------------------------------------- losses
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("loss_name", ["tc_ptrace", "tc_strace", "tc_vespo", "tc_grpo_lambda"])
def test_losses_under_two_ranks_and_two_micro_batches_equal_one_process(loss_name, agg):
    """verl (FSDP engine, forward_backward_batch): each rank's mini-batch is split into micro-batches; the
    loss of each micro-batch gets global_batch_info = {dp_size, batch_num_tokens (all-reduced over the
    data-parallel group), global_batch_size (the mini-batch's responses)}; gradients are summed over the
    micro-batches and averaged over the ranks. So (1/dp) x the sum of all micro-batch losses (and
    gradients) must be the value of one process holding the whole mini-batch in one micro-batch."""
    f = _fixture(2)
    mask = f["mask"]
    g = torch.Generator().manual_seed(4)
    old = f["old_log_probs"]
    new = (old + 0.3 * torch.randn(N, T, generator=g)) * mask
    est = "tc_strace" if loss_name == "tc_strace" else "tc_grpo"
    adv = _advantage(est, _dataproto(f, {}))
    fn = core_algos.get_policy_loss_fn(loss_name)

    def cfg(**info):
        c = FSDPActorConfig(
            strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_high=0.28
        )
        c.global_batch_info.update(info)
        return c

    tokens = int(mask.sum())
    whole = new.clone().requires_grad_(True)
    one = {"dp_size": 1, "batch_num_tokens": tokens, "global_batch_size": N, "loss_scale_factor": None}
    want, _ = fn(old, whole, adv, mask.long(), agg, cfg(**one), None)
    (want_grad,) = torch.autograd.grad(want, whole)

    ranks = [torch.arange(0, 9), torch.arange(9, N)]  # uneven tokens per rank
    micro = [[r[: len(r) // 2], r[len(r) // 2 :]] for r in ranks]
    two = {"dp_size": 2, "batch_num_tokens": tokens, "global_batch_size": N, "loss_scale_factor": None}
    split = new.clone().requires_grad_(True)
    total = torch.zeros(())
    for rank in micro:
        for rows in rank:
            loss, _ = fn(old[rows], split[rows], adv[rows], mask[rows].long(), agg, cfg(**two), None)
            total = total + loss
    got = total / 2  # FSDP's average over the data-parallel ranks
    (got_grad,) = torch.autograd.grad(got, split)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-7)
    assert want_grad.abs().sum() > 0

    # ... and that is the core objective on the whole batch (tokencredit's trainer), except where verl's
    # counts are not the core's: S-trace's loss tokens are its kept set, verl counts every response token.
    core, _ = fn(old, new, adv, mask.long(), agg, cfg(), None)  # no global info: the batch's own counts
    keep = mask & (adv != 0)
    if loss_name != "tc_strace":
        torch.testing.assert_close(got, core, rtol=1e-6, atol=1e-7)
    elif agg == "token-mean":
        torch.testing.assert_close(got, core * keep.sum() / tokens, rtol=1e-6, atol=1e-7)


def test_token_mean_needs_verl_global_token_count():
    """What verl's global token count fixes: ranks normalising by their own tokens give another loss."""
    f = _fixture(2)
    mask, old = f["mask"], f["old_log_probs"]
    new = old + 0.1
    adv = _advantage("tc_grpo", _dataproto(f, {}))
    fn = core_algos.get_policy_loss_fn("tc_ptrace")
    c = FSDPActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1)
    want, _ = fn(old, new, adv, mask.long(), "token-mean", c, None)
    rows = [torch.arange(0, 9), torch.arange(9, N)]
    local = sum(fn(old[r], new[r], adv[r], mask[r].long(), "token-mean", c, None)[0] for r in rows) / 2
    assert abs(float(local) - float(want)) > 1e-4  # so the test above checks something

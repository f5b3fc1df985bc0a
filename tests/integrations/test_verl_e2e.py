"""verl's real trainer, end to end on the CPU, with tokencredit's estimators: 2 GRPO steps per case.

Each case runs ``python -m tokencredit.integrations.verl.local --toy DIR ...``, i.e. verl's own
``verl.trainer.main_ppo`` (hydra config, Ray, TransferQueue on the v1 trainer, FSDP2 engine, agent
loop with the hf rollout backend, reward loop) on the embedded toy model and toy arithmetic data:

- ``v1-ktae``: the v1 trainer (verl's default) with ``algorithm.adv_estimator=tc_ktae``, one FSDP worker;
- ``legacy-arca-lora``: the legacy trainer with ``tc_arca`` on a LoRA actor and the actor extension:
  the worker returns ARCA's residual norms ||h - h_base|| per token (one more forward under
  ``disable_adapter()``), never the hidden states;
- ``legacy-delta-2dp``: the legacy trainer (``trainer.use_v1=False``) with ``tc_delta`` and the actor
  extension switched on, on TWO data-parallel FSDP workers (2 micro-batches each, in the old-log-prob
  step and in the update): each worker computes DelTA's coefficients of its own rows from its own
  hidden states, with the batch statistics all-reduced over the two (gloo), and returns only [r_i] rows.

No tokencredit module is named in VERL_USE_EXTERNAL_MODULES: the estimators must come from the
``verl.plugins`` entry point, inside Ray workers. A probe (tc_verl_probe.py) records every batch an
estimator saw and the Â it returned; each must equal tokencredit's core on that batch, and some
response must get non-uniform token advantages. For DelTA the probe also records, in each worker,
the rank's hidden states, old log-probs, sequence advantages and returned coefficients: DelTA on one
process over both ranks' rows concatenated must give the same coefficients and Â (layout invariance),
and the run must have split prompt groups over the ranks (verl's balance_batch reorders the rows by
length before the split). verl's step log (console logger) must
carry tokencredit's credit diagnostics.

verl's launcher needs hydra-core, whose antlr 4.9 pin cannot share an environment with
math-verify's antlr 4.13 (see .ci/run): the runs use the interpreter in TOKENCREDIT_VERL_PYTHON
(.ci/run builds one with hydra), else this interpreter if it has hydra, else they are skipped.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.extras  # needs tokencredit[verl]: skipped without it, run by `pytest -m extras`
pytest.importorskip(
    "verl", reason="verl is not installed (extra tokencredit[verl]; see docs/integrations.md)"
)
from tc_verl_support import child_env, entry_point_dir  # noqa: E402

import tokencredit.integrations.verl as tc_verl  # noqa: E402
from tokencredit import advantages, credit  # noqa: E402
from tokencredit.batch import RolloutBatch  # noqa: E402
from tokencredit.credit.delta import discriminate  # noqa: E402
from tokencredit.integrations.verl import actor as tc_actor  # noqa: E402
from tokencredit.models import TOY_ASSET_DIR  # noqa: E402

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 900
# case -> (main_ppo overrides, extra environment, tokencredit credit method, verl's trainer actor)
CASES = {
    "v1-ktae": (["algorithm.adv_estimator=tc_ktae"], {}, "ktae", "TaskRunnerV1"),
    "legacy-delta-2dp": (
        [
            "algorithm.adv_estimator=tc_delta",
            "trainer.use_v1=False",
            "trainer.n_gpus_per_node=2",  # two FSDP workers: data parallel over 2 ranks
            "+ray_kwargs.ray_init.num_gpus=2",  # their logical Ray GPUs
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",  # 8 rows per rank: 2 micro-batches
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",  # and 2 accumulation steps in the update
        ],
        {tc_actor.SWITCH: "1"},
        "delta",
        "TaskRunner",
    ),
    "legacy-arca-lora": (
        [
            "algorithm.adv_estimator=tc_arca",
            "trainer.use_v1=False",
            "actor_rollout_ref.model.lora_rank=4",  # ARCA compares the policy with and without its adapter
            "actor_rollout_ref.model.lora_alpha=8",
            "actor_rollout_ref.model.lora.merge=True",  # the hf rollout backend takes merged weights
            "actor_rollout_ref.actor.optim.lr=1e-3",  # B = 0 at init: step 2 needs an adapter that moved
        ],
        {tc_actor.SWITCH: "1"},
        "arca",
        "TaskRunner",
    ),
}
SIGNAL_KEYS = {"old_log_probs": "old_log_probs", "hidden": "tc_hidden", "entropy": "tc_entropy"}
DIAGNOSTICS = ("credit_gini", "credit_eff_ratio", "credit_high_entropy_share", "adv_min", "adv_max")


def _python() -> str:
    explicit = os.environ.get("TOKENCREDIT_VERL_PYTHON")
    if explicit:
        if not Path(explicit).exists():
            pytest.fail(f"TOKENCREDIT_VERL_PYTHON={explicit} does not exist")
        return explicit
    found = subprocess.run([sys.executable, "-c", "import hydra"], capture_output=True).returncode == 0
    if not found:
        pytest.skip(
            "verl's launcher needs hydra-core, which cannot share this environment with math-verify's antlr 4.13: "
            "set TOKENCREDIT_VERL_PYTHON to an interpreter with hydra-core (.ci/run builds .venv-verl)"
        )
    return sys.executable


def _run(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, float]:
    """Run in its own process group, so a timeout also ends the Ray cluster the run started; `cwd` gets
    hydra's outputs/ folder."""
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        cwd=cwd,
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += f"\n[killed after {TIMEOUT_S} s]"
    return proc.returncode, out, time.monotonic() - start


def _core(record: dict, method: str, special_ids: tuple[int, ...]) -> torch.Tensor:
    """tokencredit's Â on the recorded batch: verl's GRPO baseline (eps 1e-6), then the credit method."""
    from tokencredit.integrations.verl.batch import group_ids_from_labels

    mask = record["response_mask"].bool()
    scores = record["token_level_rewards"].float().sum(-1)
    gids = group_ids_from_labels(record["uid"])
    needs = credit.get(method).needs
    signals = {name: record[SIGNAL_KEYS[name]].float() for name in needs}
    batch = RolloutBatch(record["responses"], mask, gids, scores, **signals)
    params = {"ignore_token_ids": special_ids} if "ignore_token_ids" in credit.get(method).defaults else {}
    return credit.compute(method, batch, advantages.grpo(scores, gids), **params)


def _check_arca(records: list[dict]) -> None:
    """ARCA's residual norms came back as [bs, T] (no hidden state): 0 at step 1 (LoRA's B starts at 0, so
    the adapter changes nothing and the credit is uniform), > 0 once the adapter trained. The estimator's Â is
    the core's salience credit on them (the worker's norms equal the core's residual_norm on the same model:
    the actor extension's end-to-end test)."""
    from tokencredit.credit.arca import normalize_scores, weighted_advantages
    from tokencredit.integrations.verl.batch import group_ids_from_labels

    spec = tc_verl.estimator_spec("tc_arca")
    params = {**credit.get("arca").defaults, **spec.credit_params}
    for step, record in enumerate(records):
        assert "tc_hidden" not in record and record["tc_adapter_residual"].dim() == 2
        mask = record["response_mask"].bool()
        residual = record["tc_adapter_residual"]
        assert (residual >= 0).all() and (residual[~mask] == 0).all()
        # The adapter moves only after a step with a non-zero advantage (a group of mixed rewards): before
        # that the residual is exactly 0, after it every token's is > 0. The toy's rewards are sampled, so
        # step 1 may have no mixed group.
        trained = any(bool((r["advantages"] != 0).any()) for r in records[:step])
        if trained:
            assert (residual[mask] > 0).all(), f"step {step + 1}: the adapter trained, yet a residual is 0"
        else:
            assert (residual[mask] == 0).all(), (
                f"step {step + 1}: residual {residual[mask].max()} with an untrained adapter"
            )
        scores = record["token_level_rewards"].float().sum(-1)
        batch = RolloutBatch(record["responses"], mask, group_ids_from_labels(record["uid"]), scores)
        seq = advantages.estimate(spec.advantage, batch, **spec.advantage_params)
        want = weighted_advantages(
            normalize_scores(residual, mask, params["sharpening"]), seq, mask, params["form"]
        )
        torch.testing.assert_close(record["advantages"], want, rtol=0, atol=1e-6)


def _check_delta_workers(records: list[dict], probe: Path) -> None:
    """Each worker held only its own rows and returned [r_i] coefficients; they equal DelTA on one process.

    Adds the concatenated hidden states to each record as ``tc_hidden``, so `_core` recomputes Â with the
    core credit method on the whole batch."""
    workers: dict[int, list[dict]] = {}
    for path in probe.glob("worker-rank*.pt"):
        rec = torch.load(path)
        workers.setdefault(rec["rank"], []).append(rec)
    assert sorted(workers) == [0, 1], sorted(workers)  # two data-parallel ranks
    split_groups = 0
    for step, record in enumerate(records):
        ranks = [sorted(workers[r], key=lambda w: w["n"])[step] for r in (0, 1)]
        assert all(w["world"] == 2 for w in ranks)
        params = tc_verl.estimator_spec("tc_delta").credit_params  # the recipe's, sent with the request
        assert all(
            w["params"] == {k: params[k] for k in ("lam_min", "lam_max", "refine_iters")} for w in ranks
        )
        mask = record["response_mask"].bool()
        n, t = mask.shape
        h = ranks[0]["hidden"].shape[-1]
        hidden, old_lp, coef = torch.zeros(n, t, h), torch.zeros(n, t), torch.zeros(n, t)
        start = 0
        for w in ranks:  # verl's dispatch: rank r gets the r-th contiguous chunk of the batch
            rows = slice(start, start + len(w["lens"]))
            width = w["hidden"].shape[1]
            hidden[rows, :width], old_lp[rows, :width], coef[rows, :width] = (
                w["hidden"],
                w["old_log_probs"],
                w["coefficients"],
            )
            assert torch.equal(w["response_mask"].bool(), mask[rows, : w["response_mask"].shape[1]])
            torch.testing.assert_close(w["seq_adv"], record["tc_seq_adv"][rows], rtol=0, atol=0)
            start = rows.stop
        assert start == n
        torch.testing.assert_close(old_lp * mask, record["old_log_probs"] * mask, rtol=0, atol=1e-6)
        # DelTA on one process over both ranks' rows: the same coefficients and Â
        scale = (-torch.expm1(old_lp)).clamp(0, 1)
        single = discriminate(hidden, scale, record["tc_seq_adv"], mask, **ranks[0]["params"]).coefficients
        torch.testing.assert_close(coef * mask, single, rtol=0, atol=1e-5)
        torch.testing.assert_close(record["tc_delta_coef"], single, rtol=0, atol=1e-5)
        torch.testing.assert_close(
            record["advantages"], record["tc_seq_adv"][:, None] * single, rtol=0, atol=1e-5
        )
        record["tc_hidden"] = hidden
        # the layout: balance_batch spreads each prompt's responses over both ranks (and, with this toy
        # model's near-equal lengths, equalises the token counts; unequal counts, ranks padded to different
        # lengths and a rank without valid tokens: test_verl_reductions.py)
        half = len(ranks[0]["lens"])
        shared = len(set(record["uid"][:half]) & set(record["uid"][half:]))
        split_groups += shared
        print(
            f"step {step + 1}: tokens per rank {int(mask[:half].sum())} / {int(mask[half:].sum())}, "
            f"padded lengths {ranks[0]['hidden'].shape[1]} / {ranks[1]['hidden'].shape[1]}, "
            f"prompt groups on both ranks {shared} of {len(set(record['uid']))}"
        )
    assert split_groups > 0


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_main_ppo_runs_tokencredit_estimators_end_to_end(tmp_path, case):
    from transformers import AutoTokenizer

    python = _python()
    overrides, extra_env, method, runner = CASES[case]
    probe = tmp_path / "probe"
    env = child_env(
        pythonpath=[entry_point_dir(tmp_path / "ep"), HERE],
        drop=("VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS", tc_actor.SWITCH),
        VERL_USE_EXTERNAL_MODULES="tc_verl_probe",
        TC_VERL_PROBE_DIR=str(probe),
        OMP_NUM_THREADS="1",
        PYTHONWARNINGS="ignore",
        **extra_env,
    )
    cmd = [
        python,
        "-m",
        "tokencredit.integrations.verl.local",
        "--toy",
        str(tmp_path / "data"),
        *overrides,
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
    ]
    rc, log, seconds = _run(cmd, env, tmp_path)
    print(f"{case}: main_ppo exit {rc} after {seconds:.0f} s")
    assert rc == 0, log[-10000:]
    assert sorted(set(re.findall(r"\bstep:(\d+) - ", log))) == ["1", "2"], log[-4000:]
    assert set(re.findall(r"\((TaskRunner\w*) pid=", log)) == {runner}  # the v1 or the legacy trainer
    for line in re.findall(r"\bstep:\d+ - .*", log):  # verl's step log carries the credit diagnostics
        values = {k: float(v) for k, v in re.findall(r"tokencredit/(\w+):([-+0-9.eE]+)", line)}
        assert set(DIAGNOSTICS) <= set(values), line[:2000]
        assert values["adv_min"] <= 0 <= values["adv_max"] and 0 <= values["credit_gini"] < 1
        print(f"{case}: {line[:6]} {values}")

    estimator = overrides[0].split("=", 1)[1]
    assert tc_verl.estimator_spec(estimator).credit == method
    records = sorted((torch.load(p) for p in probe.glob(f"{estimator}-*.pt")), key=lambda r: r["n"])
    assert len(records) == 2  # one advantage step per training step, in the trainer's Ray actor
    if method == "delta":
        _check_delta_workers(records, probe)
    if method == "arca":
        _check_arca(records)
    tok = AutoTokenizer.from_pretrained(TOY_ASSET_DIR)
    special = tuple(sorted(tok.all_special_ids))
    nonuniform = 0
    for record in records:
        mask = record["response_mask"].bool()
        texts = tok.batch_decode(record["responses"] * mask)
        assert sum("\\boxed{" in t for t in texts) >= len(texts) // 2  # the toy model's own rollouts
        adv = record["advantages"]
        if method != "arca":  # ARCA's hidden states never reach the driver (checked in _check_arca)
            torch.testing.assert_close(adv, _core(record, method, special), rtol=0, atol=1e-5)
        assert (adv[~mask] == 0).all()
        nonuniform += sum(int(row[m].unique().numel() > 1) for row, m in zip(adv, mask))
        if extra_env:  # the actor extension's entropy: float32 from the logits, no exact zeros
            assert not (record["tc_entropy"][mask] == 0).any()
    assert nonuniform > 0

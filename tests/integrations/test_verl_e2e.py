"""verl's real trainer, end to end on the CPU, with tokencredit's estimators: 2 GRPO steps per case.

Each case runs ``python -m tokencredit.integrations.verl_local --toy DIR ...``, i.e. verl's own
``verl.trainer.main_ppo`` (hydra config, Ray, TransferQueue on the v1 trainer, FSDP2 engine, agent
loop with the hf rollout backend, reward loop) on the embedded toy model and toy arithmetic data:

- ``v1-ktae``: the v1 trainer (verl's default) with ``algorithm.adv_estimator=tc_ktae``;
- ``legacy-delta``: the legacy trainer (``trainer.use_v1=False``) with ``tc_delta`` and the actor
  extension switched on (it supplies DelTA's hidden states and float32 entropies).

No tokencredit module is named in VERL_USE_EXTERNAL_MODULES: the estimators must come from the
``verl.plugins`` entry point, inside Ray workers. A probe (tc_verl_probe.py) records every batch an
estimator saw and the Â it returned; each must equal tokencredit's core on that batch, and some
response must get non-uniform token advantages.

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
from tokencredit.integrations import verl_actor  # noqa: E402
from tokencredit.models import TOY_ASSET_DIR  # noqa: E402

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 900
# case -> (main_ppo overrides, extra environment, tokencredit credit method, verl's trainer actor)
CASES = {
    "v1-ktae": (["algorithm.adv_estimator=tc_ktae"], {}, "ktae", "TaskRunnerV1"),
    "legacy-delta": (
        ["algorithm.adv_estimator=tc_delta", "trainer.use_v1=False"],
        {verl_actor.SWITCH: "1"},
        "delta",
        "TaskRunner",
    ),
}
SIGNAL_KEYS = {"old_log_probs": "old_log_probs", "hidden": "tc_hidden", "entropy": "tc_entropy"}


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
    from tokencredit.integrations._common import group_ids_from_labels

    mask = record["response_mask"].bool()
    scores = record["token_level_rewards"].float().sum(-1)
    gids = group_ids_from_labels(record["uid"])
    needs = credit.get(method).needs
    signals = {name: record[SIGNAL_KEYS[name]].float() for name in needs}
    batch = RolloutBatch(record["responses"], mask, gids, scores, **signals)
    params = {"ignore_token_ids": special_ids} if "ignore_token_ids" in credit.get(method).defaults else {}
    return credit.compute(method, batch, advantages.grpo(scores, gids), **params)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_main_ppo_runs_tokencredit_estimators_end_to_end(tmp_path, case):
    from transformers import AutoTokenizer

    python = _python()
    overrides, extra_env, method, runner = CASES[case]
    probe = tmp_path / "probe"
    env = child_env(
        pythonpath=[entry_point_dir(tmp_path / "ep"), HERE],
        drop=("VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS", verl_actor.SWITCH),
        VERL_USE_EXTERNAL_MODULES="tc_verl_probe", TC_VERL_PROBE_DIR=str(probe), OMP_NUM_THREADS="1",
        PYTHONWARNINGS="ignore", **extra_env,
    )  # fmt: skip
    cmd = [python, "-m", "tokencredit.integrations.verl_local", "--toy", str(tmp_path / "data"), *overrides,
           f"trainer.default_local_dir={tmp_path / 'ckpt'}"]  # fmt: skip
    rc, log, seconds = _run(cmd, env, tmp_path)
    print(f"{case}: main_ppo exit {rc} after {seconds:.0f} s")
    assert rc == 0, log[-10000:]
    assert sorted(set(re.findall(r"\bstep:(\d+) - ", log))) == ["1", "2"], log[-4000:]
    assert set(re.findall(r"\((TaskRunner\w*) pid=", log)) == {runner}  # the v1 or the legacy trainer

    estimator = overrides[0].split("=", 1)[1]
    assert tc_verl.estimator_spec(estimator).credit == method
    records = [torch.load(p) for p in sorted(probe.glob(f"{estimator}-*.pt"))]
    assert len(records) == 2  # one advantage step per training step, in the trainer's Ray actor
    tok = AutoTokenizer.from_pretrained(TOY_ASSET_DIR)
    special = tuple(sorted(tok.all_special_ids))
    nonuniform = 0
    for record in records:
        mask = record["response_mask"].bool()
        texts = tok.batch_decode(record["responses"] * mask)
        assert sum("\\boxed{" in t for t in texts) >= len(texts) // 2  # the toy model's own rollouts
        adv = record["advantages"]
        torch.testing.assert_close(adv, _core(record, method, special), rtol=0, atol=1e-6)
        assert (adv[~mask] == 0).all()
        nonuniform += sum(int(row[m].unique().numel() > 1) for row, m in zip(adv, mask))
        if extra_env:  # the actor extension's entropy: float32 from the logits, no exact zeros
            assert not (record["tc_entropy"][mask] == 0).any()
    assert nonuniform > 0

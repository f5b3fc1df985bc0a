"""`tokencredit compare` stopped by SIGTERM (issue 22), in-process (sequential) and with `--jobs 2`
(subprocesses, to which compare forwards the signal): the runs in progress finish their step and
checkpoint it, compare exits 143 with one line saying where each unfinished run stands and the command
that continues, writes no report, and the same command then finishes the comparison exactly as an
uninterrupted one (the same compare.json figures, timing aside, and the same per-step metrics).

Real processes, the real CLI, the micro configuration on the tiny model. The moment of the signal is
random; a failure prints the seed, and TOKENCREDIT_CRASH_SEED=<seed> replays the same choice of moment.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tokencredit.commands import compare as compare_cmd

STEPS, EVERY = 6, 2
REWARDS_DIR = Path(__file__).resolve().parent  # `_compare_rewards` (imported by the trainer by name)
TIMING_KEYS = {"time_generate", "time_signals", "time_update", "tokens_per_s", "wall_time", "seconds"}
PROGRESS_BAR = re.compile(r"\d+%\|")


def _argv(model_dir: str, out: Path, jobs: int) -> list[str]:
    sets = [
        f"model.name={model_dir}",
        f"run.steps={STEPS}",
        "run.progress=false",
        "run.threads=1",
        "rollout.prompts_per_step=2",
        "rollout.group_size=4",
        "rollout.max_new_tokens=12",
        "data.train_size=40",
        "data.eval_size=3",
        "data.difficulty=1",
        "eval.every=0",
        "eval.samples=0",
        "eval.at_start=false",
        "eval.save_groups=1",
        f"checkpoint.every={EVERY}",
        "reward.function=_compare_rewards:has_digit_seven",
        "optim.lr=1e-2",
        "optim.warmup_steps=0",
    ]
    argv = ["--recipes", "grpo", "--seeds", "0,1", "--target", "0.0", "--out", str(out), "--jobs", str(jobs)]
    return argv + [a for s in sets for a in ("--set", s)]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REWARDS_DIR), env.get("PYTHONPATH", "")) if p)
    env["OMP_WAIT_POLICY"] = "PASSIVE"  # no OpenMP spin-waiting on a shared 2-core machine
    return env


def _compare(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tokencredit.cli", "compare", *argv],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str], what: str) -> str:
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, f"{what} failed (exit {proc.returncode}):\n{out[-3000:]}\n{err[-3000:]}"
    return out


def _strip(value: object) -> object:
    """`value` without timing fields, at any depth."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]  # a torn line fails


def _figures(out: Path) -> list[dict]:
    """compare.json's per-recipe figures (accuracy, credit, lengths, curves, per-run numbers), timing aside."""
    recipes = json.loads((out / "compare.json").read_text())["recipes"]
    for g in recipes:
        for r in g["runs"]:
            r["run_dir"] = Path(r["run_dir"]).name
    return _strip(recipes)  # type: ignore[return-value]


def _wait_for_first_checkpoint(proc: subprocess.Popen[str], runs: Path) -> None:
    first, t_end = runs / "grpo-s0" / "checkpoints" / f"step_{EVERY:06d}.json", time.monotonic() + 300
    while not first.exists():
        assert proc.poll() is None, (
            f"compare exited (code {proc.returncode}) early:\n{proc.communicate()[1][-3000:]}"
        )
        assert time.monotonic() < t_end, "no checkpoint after 300 s"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def reference(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """(OUT of an uninterrupted compare, seconds from its first checkpoint to its end)."""
    out = tmp_path_factory.mktemp("compare-stop") / "uninterrupted"
    proc = _compare(_argv(tiny_model_dir, out, jobs=1))
    _wait_for_first_checkpoint(proc, out / "runs")
    t0 = time.monotonic()
    _finish(proc, "uninterrupted compare")
    return out, time.monotonic() - t0


def _nearly_done(runs: Path) -> bool:
    """Every run has logged all but its last two steps: signal now, or the comparison may end first."""
    for s in (0, 1):
        path = runs / f"grpo-s{s}" / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.is_file() else []
        if sum('"type": "eval"' not in x for x in lines) < STEPS - 2:
            return False
    return True


def _sigterm_at_random(proc: subprocess.Popen[str], runs: Path, delay: float) -> None:
    """After the first checkpoint of the first run, wait `delay` seconds (less when the runs are nearly
    done), then SIGTERM compare."""
    _wait_for_first_checkpoint(proc, runs)
    deadline = time.monotonic() + delay
    while time.monotonic() < deadline and not _nearly_done(runs):
        time.sleep(0.005)
    assert proc.poll() is None, "the comparison ended before the signal"
    os.kill(proc.pid, signal.SIGTERM)


@pytest.mark.slow
@pytest.mark.parametrize("jobs", [1, 2], ids=["in-process", "jobs-2"])
def test_sigterm_then_the_same_command_equals_uninterrupted(jobs, tiny_model_dir, reference, tmp_path):
    seed = int(os.environ.get("TOKENCREDIT_CRASH_SEED", time.time_ns() % 2**31))
    ref, span = reference
    out = tmp_path / "cmp"
    argv = _argv(tiny_model_dir, out, jobs)
    proc = _compare(argv)
    _sigterm_at_random(proc, out / "runs", random.Random(seed).uniform(0.0, span))
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 143, f"seed {seed}: exit {proc.returncode}\n{stdout[-3000:]}\n{stderr[-3000:]}"
    lines = [x for x in stderr.splitlines() if x.strip() and not PROGRESS_BAR.search(x)]
    parsed = argparse.ArgumentParser()
    compare_cmd.add_arguments(parsed)
    command = compare_cmd.command_line(parsed.parse_args(argv))
    assert re.fullmatch(
        r"tokencredit compare: stopped by SIGTERM \(\d of 2 runs to train finished; .*\); continue with: "
        + re.escape(command)
        + r" \(finished runs are skipped, the others resume from their checkpoints\)",
        lines[-1],
    ), f"seed {seed}: {lines[-3:]}"
    assert not (out / "compare.json").exists()
    for s in (
        0,
        1,
    ):  # every unfinished run: whole metrics lines, its last finished step checkpointed and named
        run = out / "runs" / f"grpo-s{s}"
        if not (run / "metrics.jsonl").exists() or (run / "summary.json").exists():
            continue
        done = [r["step"] for r in _records(run) if r.get("type") != "eval"]
        newest = max((int(p.stem[5:]) for p in (run / "checkpoints").glob("step_*.pt")), default=0)
        assert newest == (done[-1] if done else 0), f"seed {seed}: steps {done}, newest checkpoint {newest}"
        assert f"grpo seed {s} at checkpoint step {newest}" in lines[-1] or not done, lines[-1]
        if jobs > 1:
            assert f"stopped grpo seed {s} (newest checkpoint: {newest or 'none'})" in stdout
    print(f"seed {seed} ({jobs} job(s)): {lines[-1]}")

    _finish(_compare(argv), f"seed {seed}: the same command again")
    assert _figures(out) == _figures(ref), f"seed {seed}: the continued comparison differs"
    for s in (0, 1):
        got, want = (_records(d / "runs" / f"grpo-s{s}") for d in (out, ref))
        assert _strip(got) == _strip(want), f"seed {seed}: run grpo-s{s} differs from the uninterrupted one"

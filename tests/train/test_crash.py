"""Crash safety of `tokencredit train` (issue 10): SIGKILL at a random moment, `--resume`, and the run
ends exactly as an uninterrupted one with the same seed: no torn or duplicate metrics lines, the same
per-step records (timing fields aside). Real processes, the real CLI, a micro config on the tiny model.
Graceful stops (issue 22): SIGTERM or Ctrl-C (SIGINT) at a random moment finish the step in progress,
checkpoint it, exit 143 / 130 with the resume command; a second Ctrl-C abandons the step at once;
`--resume` then also equals the uninterrupted run.

The moment of the kill is random; a failure prints the seed, and TOKENCREDIT_CRASH_SEED=<seed>
replays the same choice of moment.
"""

from __future__ import annotations

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
import torch

from conftest import TOY_REWARDS_DIR, _micro_sets
from tokencredit.train.checkpoint import verify_checkpoint
from tokencredit.train.rundir import RunDir

STEPS = 10
# Not every step: a kill then usually lands after steps that were logged but not checkpointed, which
# the resume must drop and redo (with a checkpoint every step there is almost never such a line).
EVERY = 3
TIMING_KEYS = {"time_generate", "time_signals", "time_update", "tokens_per_s", "wall_time", "critic/time"}


def _env(toy_rewards: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (toy_rewards, env.get("PYTHONPATH", "")) if p)
    env["OMP_WAIT_POLICY"] = "PASSIVE"  # no OpenMP spin-waiting on a shared 2-core CI machine
    # rich wraps piped output at 80 columns; an xdist worker's long tmp path would break the line
    env["COLUMNS"] = "400"
    return env


def _train(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tokencredit.cli", "train", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(proc: subprocess.Popen[str], what: str) -> str:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"{what} failed (exit {proc.returncode}):\n{out[-3000:]}"
    return out


def _records(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]  # raises on a torn line


def _strip(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 180.0) -> None:
    t_end = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, (
            f"trainer exited (code {proc.returncode}) before {path.name}:\n{proc.communicate()[0][-3000:]}"
        )
        assert time.monotonic() < t_end, f"no {path.name} after {timeout:.0f} s"
        time.sleep(0.01)


def _sets(model_dir: str, recipe: str = "strace") -> list[str]:
    # S-trace (its own pre-update signals pass) by default; `ppo` adds a learned critic, whose weights and
    # optimiser live in the same checkpoint. One thread: the toy ops are too small to split.
    extra = {"run.threads": 1, "checkpoint.every": EVERY}
    return ["--recipe", recipe] + [
        a for s in _micro_sets(model_dir, steps=STEPS, **extra) for a in ("--set", s)
    ]


def _uninterrupted(model_dir: str, out: Path, recipe: str) -> tuple[list[dict], float]:
    """(records, seconds per step) of the uninterrupted run every interrupted one must equal."""
    _finish(
        _train(["--out", str(out), *_sets(model_dir, recipe)], _env(str(TOY_REWARDS_DIR))),
        "uninterrupted run",
    )
    ref = _records(out)
    step_times = [r["wall_time"] for r in ref if r.get("type") != "eval"]
    return ref, (step_times[-1] - step_times[0]) / (len(step_times) - 1)


@pytest.fixture(scope="module")
def reference(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], float]:
    """The uninterrupted S-trace run (records, seconds per step)."""
    return _uninterrupted(tiny_model_dir, tmp_path_factory.mktemp("crash") / "uninterrupted", "strace")


def _seed() -> int:
    return int(os.environ.get("TOKENCREDIT_CRASH_SEED", time.time_ns() % 2**31))


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["strace", "ppo"])
def test_sigkill_then_resume_equals_uninterrupted(recipe, tiny_model_dir, toy_rewards, reference, tmp_path):
    """SIGKILL at a random moment after the first checkpoint, then --resume: the same records as an
    uninterrupted run, and with `ppo` the same final critic (its weights are checkpointed with the policy's)."""
    seed = _seed()
    rng = random.Random(seed)
    env = _env(toy_rewards)
    sets = _sets(tiny_model_dir, recipe)
    ref_dir = tmp_path / "uninterrupted"
    ref, per_step = reference if recipe == "strace" else _uninterrupted(tiny_model_dir, ref_dir, recipe)
    run = tmp_path / "killed"

    proc = _train(["--out", str(run), *sets], env)
    ckdir = run / "checkpoints"
    _wait_for(
        ckdir / f"step_{EVERY:06d}.json", proc
    )  # the first checkpoint is complete (digest written last)
    # A random moment from here to about one step before the end; the checkpoint of step STEPS-1
    # appearing ends the wait early, so the kill always lands before the run has finished.
    deadline = time.monotonic() + rng.uniform(0.0, per_step * (STEPS - EVERY - 1))
    while time.monotonic() < deadline and not (ckdir / f"step_{STEPS - 1:06d}.json").exists():
        time.sleep(0.005)
    assert proc.poll() is None, f"seed {seed}: the run ended before the kill"
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (run / "summary.json").exists()
    killed_at = [r["step"] for r in _records_tolerant(run)]
    last_checkpoint = max(int(p.stem.split("_")[1]) for p in ckdir.glob("step_*.json"))
    # A kill can land mid-write of a metrics line; make sure that case is exercised every time.
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 99, "reward": 0.')

    out = _finish(_train(["--resume", str(run)], env), f"seed {seed}: resume")
    print(f"seed {seed}: killed after steps {killed_at}, resuming from step {last_checkpoint}")
    resumed = re.search(r"resumed\s+\S+\s+at\s+step (\d+)", out)  # rich may wrap the line
    assert resumed and int(resumed.group(1)) == last_checkpoint >= 1, out[-2000:]
    got = _records(run)
    keys = [(r["step"], r.get("type", "step")) for r in got]
    assert len(keys) == len(set(keys)), f"seed {seed}: duplicate records {keys} (killed after {killed_at})"
    assert [r["step"] for r in got if r.get("type") != "eval"] == list(range(1, STEPS + 1))
    assert _strip(got) == _strip(ref), f"seed {seed}: resumed run differs from the uninterrupted one"
    assert not list(ckdir.glob(".*tmp*")), "temporary checkpoint files left behind"
    assert json.loads((run / "summary.json").read_text())["steps"] == STEPS
    if recipe == "ppo":  # the critic's metrics above already match; its final weights too, exactly
        got_critic = torch.load(RunDir(run).final_critic_path, weights_only=True)["model"]
        ref_critic = torch.load(RunDir(ref_dir).final_critic_path, weights_only=True)["model"]
        assert got_critic.keys() == ref_critic.keys()
        assert all(torch.equal(got_critic[k], ref_critic[k]) for k in ref_critic), (
            f"seed {seed}: critic differs"
        )


def _stop_at_random(proc: subprocess.Popen[str], run: Path, signum: int, delay: float) -> None:
    """After the first metrics line (the trainer's handlers are installed), wait `delay` seconds (less
    if the checkpoint of step STEPS-1 appears, so the signal lands before the run ends), then send it."""
    _wait_for(run / "metrics.jsonl", proc)
    deadline = time.monotonic() + delay
    while time.monotonic() < deadline and not (run / "checkpoints" / f"step_{STEPS - 1:06d}.json").exists():
        time.sleep(0.005)
    assert proc.poll() is None, "the run ended before the signal"
    os.kill(proc.pid, signum)


def _check_resume(run: Path, env: dict[str, str], ref: list[dict], newest: int, seed: int) -> None:
    out = _finish(_train(["--resume", str(run)], env), f"seed {seed}: resume")
    assert re.search(rf"resumed\s+\S+\s+at\s+step {newest}\b", out), out[-2000:]
    assert _strip(_records(run)) == _strip(ref), (
        f"seed {seed}: resumed run differs from the uninterrupted one"
    )
    assert json.loads((run / "summary.json").read_text())["steps"] == STEPS


def _newest_checkpoint(run: Path) -> int:
    newest = max(int(p.stem.split("_")[1]) for p in (run / "checkpoints").glob("step_*.pt"))
    assert verify_checkpoint(run / "checkpoints" / f"step_{newest:06d}.pt") == (True, "")
    assert not (run / "summary.json").exists() and not list(run.rglob("*tmp*"))
    return newest


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stop_signal_then_resume_equals_uninterrupted(
    signum, tiny_model_dir, toy_rewards, reference, tmp_path
):
    """SIGTERM / Ctrl-C at a random moment: the step in progress finishes and is checkpointed, exit
    128 + the signal with the resume command; --resume then equals the uninterrupted run."""
    seed = _seed()
    env, sets = _env(toy_rewards), _sets(tiny_model_dir)
    ref, per_step = reference
    run = tmp_path / "stopped"
    proc = _train(["--out", str(run), *sets], env)
    _stop_at_random(proc, run, signum, random.Random(seed).uniform(0.0, per_step * (STEPS - 2)))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, f"seed {seed}: exit {proc.returncode}\n{out[-3000:]}"
    done = [r["step"] for r in _records(run) if r.get("type") != "eval"]  # every line whole
    assert (
        done == list(range(1, done[-1] + 1)) and _newest_checkpoint(run) == done[-1]
    )  # the last finished step, saved
    assert (
        f"stopped by {signal.Signals(signum).name} after step {done[-1]}; continue with: tokencredit train --resume {run}"
        in out
    )
    print(f"seed {seed}: {signal.Signals(signum).name} after step {done[-1]}")
    _check_resume(run, env, ref, done[-1], seed)


SIGNALLING_REWARD = """
import os, signal, time
calls = 0


def has_digit_seven(completions, golds, **_):
    # Ctrl-C twice while step N's rollouts are scored (N from the environment; 0 = never)
    global calls
    if len(completions) <= 2:  # the trainer's start-up check of the function, not a step's rollouts
        return [0.0] * len(completions)
    calls += 1
    if calls == int(os.environ.get("CTRL_C_TWICE_AT_STEP", "0")):
        # a user reward runs in a worker process of the trainer's: signal the trainer, twice, apart
        # (two signals sent back to back from another process can arrive as one)
        os.kill(os.getppid(), signal.SIGINT)
        time.sleep(0.5)
        os.kill(os.getppid(), signal.SIGINT)
    return [1.0 if "7" in c else 0.0 for c in completions]
"""


@pytest.mark.slow
def test_ctrl_c_twice_abandons_the_step_and_resume_equals_uninterrupted(
    tiny_model_dir, toy_rewards, reference, tmp_path
):
    """The second Ctrl-C stops at once (here while a step's rollouts are scored, a random step): that
    step is abandoned, exit 130, and --resume from the newest checkpoint equals the uninterrupted run."""
    seed = _seed()
    at = random.Random(seed).randint(EVERY + 1, STEPS)
    (tmp_path / "signalling_rewards.py").write_text(SIGNALLING_REWARD)
    env = _env(toy_rewards)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    sets = _sets(tiny_model_dir) + ["--set", "reward.function=signalling_rewards:has_digit_seven"]
    run = tmp_path / "stopped"
    proc = _train(["--out", str(run), *sets], {**env, "CTRL_C_TWICE_AT_STEP": str(at)})
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, f"seed {seed}: exit {proc.returncode}\n{out[-3000:]}"
    newest = _newest_checkpoint(run)
    assert newest == (at - 1) // EVERY * EVERY
    assert (
        f"stopped by SIGINT during step {at}, which is abandoned (the newest checkpoint is step {newest}); "
        f"continue with: tokencredit train --resume {run}"
    ) in out, out[-2000:]
    assert [r["step"] for r in _records(run) if r.get("type") != "eval"] == list(range(1, at))
    _check_resume(run, env, reference[0], newest, seed)


def _records_tolerant(run: Path) -> list[dict]:
    """The complete records of a killed run (its last line may be torn)."""
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out

"""Training the unfinished runs of a comparison (`plan.plan_runs` / `plan.plan_state`), one after another
in this process or `jobs` at a time as `tokencredit train` subprocesses. Nothing here aggregates: what the
runs wrote is read back by `runs.read_run`.

SIGINT (Ctrl-C) / SIGTERM stop a comparison as they stop one run (`tokencredit.train.stop`): in this
process the trainer finishes its step, checkpoints it and ends; subprocesses (each in its own process
group, so a terminal's Ctrl-C reaches them only through compare) get the signal forwarded and do the
same, and compare waits for them. No new run starts; `execute` then raises `Interrupted` saying where
each unfinished run stopped, and the same `tokencredit compare` command continues (finished runs are
skipped, the others resume from their checkpoints). A second signal is forwarded too: the steps in
progress are abandoned and the runs resume from their previous checkpoints."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import IO

from rich.console import Console

from tokencredit.compare.plan import PlannedRun, plan_state
from tokencredit.compare.runs import RunData, read_run
from tokencredit.errors import ConfigError, Interrupted, TrainingError
from tokencredit.train.rundir import RunDir
from tokencredit.train.stop import StopNow, StopSignals, signal_name
from tokencredit.train.trainer import Trainer

__all__ = ["execute", "finished_runs"]

# A child these signals end exits with 128 + s (-s when one lands before its handlers are set).
_STOP_CODES = (signal.SIGINT, signal.SIGTERM)


# ------------------------------------------------------------------------------------------ stopping
def _stopping(console: Console, signum: int) -> None:
    name = signal_name(signum)
    console.print(f"[yellow]{name}: stopping after the steps in progress ({name} again stops at once)")


def _finished(plan: PlannedRun) -> bool:
    summary = RunDir(plan.run_dir).read_summary()
    return summary is not None and int(summary.get("steps", -1)) >= plan.cfg.run.steps


def _stopped(signum: int, todo: list[tuple[PlannedRun, bool]]) -> Interrupted:
    """`Interrupted` saying where each planned run that has not finished stands on disk."""
    where, waiting, done = [], 0, 0
    for plan, _ in todo:
        if _finished(plan):
            done += 1
            continue
        run = RunDir(plan.run_dir)
        if not run.metrics.path.is_file():
            waiting += 1  # counted, not listed: a long plan would fill the screen
            continue
        steps = run.checkpoint_steps()
        where.append(
            f"{plan.name} at " + (f"checkpoint step {steps[-1]}" if steps else "step 0 (no checkpoint yet)")
        )
    if waiting:
        where.append(f"{waiting} not started")
    return Interrupted(
        f"stopped by {signal_name(signum)} ({done} of {len(todo)} runs to train finished; "
        f"{', '.join(where) or 'none left'})",
        signum,
    )


# ------------------------------------------------------------------------------------------ in this process
def _train_in_process(plan: PlannedRun, resume: bool, console: Console, stop: StopSignals) -> None:
    """Train one plan; a stop signal the trainer received after its last step (while it wrote the
    summary, so the run finished) is passed on to `stop`, so that the next run does not start."""
    trainer = Trainer(plan.cfg, plan.run_dir, resume=resume, console=console)
    try:
        if not stop.requested:  # a signal while the model loaded: do not start the run
            trainer.fit()
            stop.signum = stop.signum or trainer.stopped_by
    finally:
        trainer.reward_fn.close()
        del trainer
        gc.collect()


def _run_sequential(todo: list[tuple[PlannedRun, bool]], console: Console) -> dict[str, str]:
    """Train the plans one after another in this process; {run_dir: error} for the failures. A stop
    signal ends the run in progress after its step (the trainer's own handling) and raises `Interrupted`."""
    failed = {}
    with StopSignals(lambda signum: _stopping(console, signum)) as stop:
        try:
            for i, (plan, resume) in enumerate(todo, 1):
                if stop.requested:
                    break
                console.rule(
                    f"[{i}/{len(todo)}] {plan.name}{' (resuming)' if resume else ''} -> {plan.run_dir}"
                )
                t0 = time.perf_counter()
                try:
                    _train_in_process(plan, resume, console, stop)
                except Interrupted as e:  # the trainer's handlers caught the signal and saved the step
                    stop.signum = e.signum
                    break
                except (TrainingError, RuntimeError, ValueError) as e:
                    if isinstance(e, ConfigError):
                        raise
                    failed[str(plan.run_dir)] = f"{type(e).__name__}: {e}"
                    console.print(f"[red]FAILED {plan.name}: {failed[str(plan.run_dir)]}")
                    continue
                if _finished(plan):
                    console.print(f"finished {plan.name} in {time.perf_counter() - t0:.0f} s")
        except StopNow as e:  # a second signal outside a trainer's loop
            stop.signum = e.signum
    if stop.signum is not None:
        raise _stopped(stop.signum, todo)
    return failed


# ------------------------------------------------------------------------------------------ subprocesses
@dataclass
class _Child:
    plan: PlannedRun
    proc: subprocess.Popen
    log: IO[str]
    t0: float
    signals: int = 0  # stop signals forwarded to it


def _child_command(plan: PlannedRun, resume: bool) -> list[str]:
    run = RunDir(plan.run_dir)
    cmd = [sys.executable, "-m", "tokencredit.cli", "train"]
    return cmd + (
        ["--resume", str(run.path)] if resume else ["--config", str(run.config_path), "--out", str(run.path)]
    )


def _child_env() -> dict[str, str]:
    """This environment with this process's import path (so `module:function` rewards resolve in the child)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [p or os.getcwd() for p in sys.path] + [env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    return env


def _start(plan: PlannedRun, resume: bool, env: dict[str, str]) -> _Child:
    """Write the planned config into the run directory and start `tokencredit train` on it, logging to RunDir.log_path."""
    RunDir(plan.run_dir).write_config(plan.cfg)
    log = open(RunDir(plan.run_dir).log_path, "a")  # noqa: SIM115 - closed when the child ends
    # its own process group: a terminal's Ctrl-C reaches it only once, forwarded by compare
    proc = subprocess.Popen(
        _child_command(plan, resume), stdout=log, stderr=subprocess.STDOUT, env=env, process_group=0
    )
    return _Child(plan, proc, log, time.perf_counter())


def _finish(child: _Child, console: Console, stopping: bool) -> str | None:
    """Close an ended child's log and report it; its error (exit status, last log line) or None. While
    compare stops, a child that a stop signal ended is reported as stopped, not failed."""
    child.log.close()
    plan, code = child.plan, child.proc.returncode
    if code == 0:
        console.print(f"finished {plan.name} in {time.perf_counter() - child.t0:.0f} s")
        return None
    if stopping and code in {128 + s for s in _STOP_CODES} | {-s for s in _STOP_CODES}:
        steps = RunDir(plan.run_dir).checkpoint_steps()
        console.print(f"[yellow]stopped {plan.name} (newest checkpoint: {steps[-1] if steps else 'none'})")
        return None
    log = RunDir(plan.run_dir).log_path
    tail = log.read_text().strip().splitlines()[-1:] or [""]
    error = f"exit status {code}: {tail[0]} (see {log})"
    console.print(f"[red]FAILED {plan.name}: {error}")
    return error


def _forward(running: list[_Child], signum: int, times: int) -> None:
    """Send `signum` to every running child that has had fewer than `times` (each stops as `tokencredit
    train` does: the first finishes the step, the second abandons it)."""
    for child in list(running):
        if child.signals < times and child.proc.poll() is None:
            child.proc.send_signal(signum)
            child.signals += 1


class _Eta:
    """Steps done over all planned runs, read from their metrics, and the time the rest will take at the
    rate measured since this compare started: `tokencredit compare --jobs N` prints it as it goes."""

    def __init__(self, plans: list[PlannedRun]) -> None:
        self.plans = plans
        self.total = sum(p.cfg.run.steps for p in plans)
        self.t0 = time.perf_counter()
        self.done0 = self.done()
        self.last_print = 0.0

    def done(self) -> int:
        steps = 0
        for p in self.plans:
            recs = RunDir(p.run_dir).metrics.read()
            steps += min(p.cfg.run.steps, sum(1 for r in recs if r.get("type") != "eval"))
        return steps

    def line(self, running: int) -> str:
        done, elapsed = self.done(), time.perf_counter() - self.t0
        rate = (done - self.done0) / elapsed if elapsed > 0 else 0.0
        left = self.total - done
        eta = f"ETA {_clock(left / rate)}" if rate > 0 else "ETA: after the first steps"
        return f"progress: {done}/{self.total} steps, {running} running, {_clock(elapsed)} elapsed, {eta}"

    def maybe_print(self, console: Console, running: int, every: float = 60.0) -> None:
        if time.perf_counter() - self.last_print >= every:
            self.last_print = time.perf_counter()
            console.print(self.line(running))


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _run_parallel(todo: list[tuple[PlannedRun, bool]], jobs: int, console: Console) -> dict[str, str]:
    """Run plans as `tokencredit train` subprocesses, `jobs` at a time (a new one starts as soon as one
    ends, so `jobs` cores stay busy); {run_dir: error} for the failures. Each child reads the planned
    config from its run directory (written here first). A stop signal is forwarded to the children,
    which finish their step and checkpoint it; compare waits for them and raises `Interrupted`. On any
    other exception here the running children are stopped the same way; their checkpoints let them resume."""
    env = _child_env()
    pending, running, failed = list(todo), [], {}
    total, started = len(todo), 0
    eta = _Eta([p for p, _ in todo])

    def on_signal(signum: int) -> None:
        _stopping(console, signum)
        _forward(running, signum, 1)

    with StopSignals(on_signal) as stop:
        try:
            while running or (pending and not stop.requested):
                while pending and len(running) < jobs and not stop.requested:
                    child = _start(*pending.pop(0), env)
                    running.append(child)
                    started += 1
                    console.print(
                        f"[{started}/{total}] started {child.plan.name} (pid {child.proc.pid}) -> {child.plan.run_dir}"
                    )
                if stop.signum is not None:
                    _forward(running, stop.signum, 1)  # a child started while the signal was handled
                time.sleep(0.5)
                for child in [c for c in running if c.proc.poll() is not None]:
                    running.remove(child)
                    error = _finish(child, console, stop.requested)
                    if error is not None:
                        failed[str(child.plan.run_dir)] = error
                    eta.last_print = 0.0  # a run ended: print the progress now
                eta.maybe_print(console, len(running))
        except StopNow as e:  # a second signal: the children abandon their steps at once
            stop.signum = e.signum
            _forward(running, e.signum, 2)
        finally:
            if not stop.requested:  # an error here: stop the children as a signal would
                _forward(running, signal.SIGTERM, 1)
            for child in running:
                child.proc.wait()
                child.log.close()
    if stop.signum is not None:
        raise _stopped(stop.signum, todo)
    return failed


# ------------------------------------------------------------------------------------------ both
def _share_cores(todo: list[tuple[PlannedRun, bool]], jobs: int) -> None:
    """Children print plain lines and, unless run.threads is set, get an equal share of this process's cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    for p, _ in todo:
        p.cfg.run.progress = False
        if p.cfg.run.threads <= 0:
            p.cfg.run.threads = max(1, cores // jobs)


def execute(plans: list[PlannedRun], jobs: int, console: Console) -> dict[str, str]:
    """Train the plans that are not finished (sequentially in this process, or `jobs` subprocesses);
    returns {run_dir: error} for runs that failed. Configuration errors stop everything."""
    states = [(p, plan_state(p)) for p in plans]
    done = [p for p, s in states if s == "finished"]
    if done:
        console.print(f"{len(done)} of {len(plans)} runs already finished: {', '.join(p.name for p in done)}")
    todo = [(p, s == "resume") for p, s in states if s != "finished"]
    if not todo:
        return {}
    if jobs > 1:
        _share_cores(todo, jobs)
        return _run_parallel(todo, jobs, console)
    return _run_sequential(todo, console)


def finished_runs(plans: list[PlannedRun], failed: dict[str, str]) -> tuple[list[RunData], dict[str, str]]:
    """The runs of `plans` that finished, read back from their directories; `failed` with each run that
    neither failed nor finished added as "did not finish"."""
    runs, failed = [], dict(failed)
    for p in plans:
        if str(p.run_dir) in failed:
            continue
        r = read_run(p.run_dir)
        if r.finished:
            runs.append(r)
        else:
            failed[str(p.run_dir)] = "did not finish"
    return runs, failed

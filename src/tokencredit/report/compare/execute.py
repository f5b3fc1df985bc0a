"""Planning and running the trainer runs of a comparison: one `PlannedRun` per (recipe, seed), its
state on disk (new, resume, finished), and training the unfinished ones, one after another in this
process or `jobs` at a time as `tokencredit train` subprocesses. Nothing here aggregates: what the
runs wrote is read back by `runs.read_run`."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from rich.console import Console

from tokencredit.errors import ConfigError, TrainingError
from tokencredit.recipes import requires_lora, resolve
from tokencredit.report.compare.runs import RUNTIME_KEYS, RunData, flat_config, read_run, read_summary
from tokencredit.train.config import TrainConfig, load_config
from tokencredit.train.rundir import RunDir
from tokencredit.train.trainer import Trainer, resolve_recipe

__all__ = [
    "DEFAULT_RECIPES", "DEFAULT_SEEDS", "PlanOptions", "PlannedRun", "execute", "finished_runs", "plan_runs",
    "plan_state",
]  # fmt: skip

DEFAULT_RECIPES = "grpo,dapo,dapo+ktae,delta,strace,arca"
DEFAULT_SEEDS = "0,1,2"
# The child's stdout and stderr in its run directory (a file of compare's, not the trainer's).


class PlanOptions(Protocol):
    """What planning reads: the parsed `tokencredit compare` arguments (an argparse.Namespace) or any
    object with these attributes. `recipes` / `seeds` are comma-separated; None means the defaults."""

    recipes: str | None
    seeds: str | None
    config: str | None
    set: list[str]
    lora_rank: int | None
    lora_only_rank: int
    out: str


@dataclass
class PlannedRun:
    recipe: str
    seed: int
    run_dir: Path
    cfg: TrainConfig

    @property
    def name(self) -> str:
        return f"{self.recipe} seed {self.seed}"


def _split(text: str, what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ConfigError(f"--{what}: empty list")
    if len(set(items)) != len(items):
        raise ConfigError(f"--{what}: duplicate entries in {text!r}")
    return items


def _check_recipes(names: list[str]) -> None:
    """Each --recipes name read by the project's one name rule (`tokencredit.recipes.resolve`): an unknown
    name, or two names of the same recipe (`grpo` and `recipe:grpo`), is an error before anything runs."""
    seen: dict[str, str] = {}
    for name in names:
        key = json.dumps(resolve(name).to_dict(), sort_keys=True)
        if key in seen:
            raise ConfigError(f"--recipes: {seen[key]!r} and {name!r} name the same recipe")
        seen[key] = name


def _seeds(text: str) -> list[int]:
    try:
        return [int(s) for s in _split(text, "seeds")]
    except ValueError:
        raise ConfigError(f"--seeds expects comma-separated integers, got {text!r}") from None


def plan_runs(args: PlanOptions) -> list[PlannedRun]:
    """One TrainConfig per (recipe, seed): the config file, then --set, then the seed, the recipe and the LoRA rank."""
    recipes = _split(args.recipes or DEFAULT_RECIPES, "recipes")
    seeds = _seeds(args.seeds or DEFAULT_SEEDS)
    for s in args.set:
        key = s.split("=", 1)[0].strip()
        if key in ("run.seed", "algo.recipe"):
            raise ConfigError(
                f"--set {key}=...: compare sets it per run; use --{'seeds' if 'seed' in key else 'recipes'}"
            )
    _check_recipes(recipes)
    if (args.lora_rank is not None and args.lora_rank < 0) or args.lora_only_rank < 1:
        raise ConfigError("--lora-rank must be >= 0 and --lora-only-rank >= 1")
    runs = Path(args.out) / "runs"
    plans = []
    for r in recipes:
        for s in seeds:
            cfg = load_config(args.config, [*args.set, f"run.seed={s}"], recipe=r)
            if args.lora_rank is not None:
                cfg.model.lora_rank = args.lora_rank
            if cfg.model.lora_rank <= 0 and requires_lora(resolve_recipe(cfg)):
                cfg.model.lora_rank = args.lora_only_rank
            cfg.run.name = f"{r}-s{s}"
            cfg.run.out_dir = str(runs)
            plans.append(PlannedRun(r, s, runs / cfg.run.name, cfg))
    return plans


def plan_state(plan: PlannedRun) -> str:
    """'new', 'finished' or 'resume'; a run directory made with other settings is an error."""
    run = RunDir(plan.run_dir)
    if not run.config_path.is_file():
        return "new"
    old = flat_config(run.read_config())
    new = flat_config(plan.cfg)
    free = RUNTIME_KEYS | {"run.steps"}  # run.steps may grow: the run is extended from its last checkpoint
    diff = [k for k in sorted(set(old) | set(new)) if k not in free and old.get(k) != new.get(k)]
    if diff:
        shown = "; ".join(f"{k}: {old.get(k)!r} there, {new.get(k)!r} now" for k in diff[:4])
        raise ConfigError(
            f"{run.path} was made with other settings ({shown}); use another --out or remove that run directory"
        )
    if int(old["run.steps"]) > plan.cfg.run.steps:
        raise ConfigError(
            f"{run.path} was planned for run.steps={old['run.steps']}, more than {plan.cfg.run.steps} now; "
            "use another --out or the same run.steps"
        )
    summary = read_summary(run)
    if summary is not None and int(summary.get("steps", -1)) >= plan.cfg.run.steps:
        return "finished"
    return "resume"


# ------------------------------------------------------------------------------------------ in this process
def _train_in_process(plan: PlannedRun, resume: bool, console: Console) -> None:
    trainer = Trainer(plan.cfg, plan.run_dir, resume=resume, console=console)
    try:
        trainer.fit()
    finally:
        trainer.reward_fn.close()
        del trainer
        gc.collect()


def _run_sequential(todo: list[tuple[PlannedRun, bool]], console: Console) -> dict[str, str]:
    """Train the plans one after another in this process; {run_dir: error} for the failures."""
    failed = {}
    for i, (plan, resume) in enumerate(todo, 1):
        console.rule(f"[{i}/{len(todo)}] {plan.name}{' (resuming)' if resume else ''} -> {plan.run_dir}")
        t0 = time.perf_counter()
        try:
            _train_in_process(plan, resume, console)
        except (TrainingError, RuntimeError, ValueError) as e:
            if isinstance(e, ConfigError):
                raise
            failed[str(plan.run_dir)] = f"{type(e).__name__}: {e}"
            console.print(f"[red]FAILED {plan.name}: {failed[str(plan.run_dir)]}")
            continue
        console.print(f"finished {plan.name} in {time.perf_counter() - t0:.0f} s")
    return failed


# ------------------------------------------------------------------------------------------ subprocesses
@dataclass
class _Child:
    plan: PlannedRun
    proc: subprocess.Popen
    log: IO[str]
    t0: float


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
    proc = subprocess.Popen(_child_command(plan, resume), stdout=log, stderr=subprocess.STDOUT, env=env)
    return _Child(plan, proc, log, time.perf_counter())


def _finish(child: _Child, console: Console) -> str | None:
    """Close an ended child's log and report it; its error (exit status, last log line) or None."""
    child.log.close()
    plan = child.plan
    if child.proc.returncode == 0:
        console.print(f"finished {plan.name} in {time.perf_counter() - child.t0:.0f} s")
        return None
    log = RunDir(plan.run_dir).log_path
    tail = log.read_text().strip().splitlines()[-1:] or [""]
    error = f"exit status {child.proc.returncode}: {tail[0]} (see {log})"
    console.print(f"[red]FAILED {plan.name}: {error}")
    return error


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
    config from its run directory (written here first). On any exception here (Ctrl-C included) the
    running children are stopped; their checkpoints let them resume."""
    env = _child_env()
    pending, running, failed = list(todo), [], {}
    total, started = len(todo), 0
    eta = _Eta([p for p, _ in todo])
    try:
        while pending or running:
            while pending and len(running) < jobs:
                child = _start(*pending.pop(0), env)
                running.append(child)
                started += 1
                console.print(
                    f"[{started}/{total}] started {child.plan.name} (pid {child.proc.pid}) -> {child.plan.run_dir}"
                )
            time.sleep(0.5)
            for child in [c for c in running if c.proc.poll() is not None]:
                running.remove(child)
                error = _finish(child, console)
                if error is not None:
                    failed[str(child.plan.run_dir)] = error
                eta.last_print = 0.0  # a run ended: print the progress now
            eta.maybe_print(console, len(running))
    finally:
        for child in running:
            if child.proc.poll() is None:
                child.proc.terminate()
                child.proc.wait()
            child.log.close()
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

"""`tokencredit compare`: the method shoot-out, recipes x seeds on equal terms (see
`tokencredit.compare`). Parses the flags, plans and trains the runs (or collects existing
ones), aggregates them, writes compare.md / compare.json / the plots into --out and prints the table.
With --tune-lr the learning-rate sweep on the validation split runs first (`compare.tune`)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from rich.console import Console

from tokencredit.compare import (
    DEFAULT_RECIPES,
    DEFAULT_SEEDS,
    METRICS,
    RunData,
    aggregate,
    collect_runs,
    damaged_parts,
    execute,
    few_seeds_warning,
    finished_runs,
    placebo_table,
    plan_runs,
    rich_table,
    write_report,
)
from tokencredit.compare.plan import PLACEBO_ARMS, PlannedRun, parse_seeds
from tokencredit.compare.tune import (
    DEFAULT_TUNE_SEED,
    TUNE_DIR,
    check_tune_options,
    parse_lrs,
    plan_tune,
    tune_result,
    tune_scores,
    tune_seeds,
)
from tokencredit.errors import ConfigError, Interrupted
from tokencredit.train.lock import RunLock


def _add_fair_arguments(parser: argparse.ArgumentParser) -> None:
    """--arm (rows with their own overrides) and --tune-lr / --tune-seeds (a learning rate per row)."""
    parser.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="NAME=RECIPE:KEY=VALUE[,KEY=VALUE...]",
        help="a row NAME that trains RECIPE with these trainer overrides after --set (repeatable), e.g. "
        "grpo-matched=grpo:rollout.group_size=96",
    )
    parser.add_argument(
        "--placebo",
        nargs="?",
        const=",".join(PLACEBO_ARMS),
        metavar="PLACEBO,...",
        help="for each --recipes entry that places credit, add rows RECIPE.PLACEBO that keep its update size "
        f"but not its placement ({', '.join(PLACEBO_ARMS)}; default: all three), at its learning rate, and "
        "test the recipe against each (Holm)",
    )
    parser.add_argument(
        "--tune-lr",
        metavar="LR,LR,...",
        help="choose a learning rate per row among these on the validation split (data.eval_split=validation, "
        "tune runs in OUT/tune/runs) before the main runs, which then train with it",
    )
    parser.add_argument(
        "--tune-seeds",
        metavar="SEED,SEED,...",
        help=f"seeds of the --tune-lr runs, none of --seeds (default: the first two from {DEFAULT_TUNE_SEED} not in --seeds)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--recipes", help=f"comma-separated recipes (default: {DEFAULT_RECIPES}; see `tokencredit recipes`)"
    )
    parser.add_argument("--seeds", help=f"comma-separated run seeds (default: {DEFAULT_SEEDS})")
    parser.add_argument(
        "--baseline", help="recipe the others are tested against (default: grpo if compared, else the first)"
    )
    parser.add_argument(
        "--target",
        type=float,
        default=0.5,
        help="held-out accuracy for the 'steps to target' column (default 0.5)",
    )
    parser.add_argument(
        "--metric",
        choices=sorted(METRICS),
        default="greedy",
        help="held-out accuracy: greedy (eval_greedy_accuracy, default) or avg (avg@k of eval.samples samples)",
    )
    parser.add_argument("--config", help="TOML trainer config shared by every run (see `tokencredit train`)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="trainer config override for every run, e.g. run.steps=40 (repeatable; algo.<field>=... "
        "overrides that field of every recipe)",
    )
    _add_fair_arguments(parser)
    parser.add_argument(
        "--lora-rank",
        type=int,
        help="train every recipe with a LoRA adapter of this rank (0 = full fine-tuning; default: the config's)",
    )
    parser.add_argument(
        "--lora-only-rank",
        type=int,
        default=8,
        help="LoRA rank for recipes that need an adapter (arca, policy-divergence) when the others run "
        "without one (default 8)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs in parallel, as subprocesses with run.threads = cores / jobs (default 1: one after another)",
    )
    parser.add_argument(
        "--out", default="runs/compare", help="output directory (default runs/compare); runs go to OUT/runs"
    )
    parser.add_argument(
        "--collect",
        nargs="+",
        metavar="RUN_DIR",
        help="only aggregate existing run directories (or directories of them), grouped by recipe",
    )
    parser.add_argument(
        "--band",
        choices=("std", "ci", "minmax"),
        default="std",
        help="accuracy band: ±1 std (default), the 95%% CI of the mean, or min-max over seeds",
    )
    parser.add_argument(
        "--smooth", type=int, default=5, help="moving-average window of the concentration plot (default 5)"
    )


def command_line(args: argparse.Namespace) -> str:
    """The canonical `tokencredit compare` command for these arguments (written into compare.md)."""
    parts = ["tokencredit", "compare"]
    if args.collect:
        parts += ["--collect", *args.collect]
    else:
        parts += ["--recipes", args.recipes or DEFAULT_RECIPES, "--seeds", args.seeds or DEFAULT_SEEDS]
        if args.config:
            parts += ["--config", args.config]
        for s in args.set:
            parts += ["--set", s]
        for a in args.arm:
            parts += ["--arm", a]
        if args.placebo:
            parts += ["--placebo", args.placebo]
        if args.tune_lr:
            seeds = tune_seeds(args.tune_seeds, parse_seeds(args.seeds or DEFAULT_SEEDS))
            parts += ["--tune-lr", args.tune_lr, "--tune-seeds", ",".join(map(str, seeds))]
        if args.lora_rank is not None:
            parts += ["--lora-rank", str(args.lora_rank)]
        if args.lora_only_rank != 8:
            parts += ["--lora-only-rank", str(args.lora_only_rank)]
        if args.jobs != 1:
            parts += ["--jobs", str(args.jobs)]
    if args.baseline:
        parts += ["--baseline", args.baseline]
    parts += ["--target", f"{args.target:g}"]
    if args.metric != "greedy":
        parts += ["--metric", args.metric]
    if args.band != "std":
        parts += ["--band", args.band]
    parts += ["--out", args.out]
    return shlex.join(parts)


def _check(args: argparse.Namespace) -> None:
    """Flag values that argparse's types cannot check, and flags that do not apply with --collect."""
    if args.jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {args.jobs}")
    if args.smooth < 1:
        raise ConfigError(f"--smooth must be >= 1, got {args.smooth}")
    if not 0.0 <= args.target <= 1.0:
        raise ConfigError(f"--target is an accuracy in [0, 1], got {args.target}")
    if args.collect:
        flags = ("recipes", "seeds", "config", "lora_rank", "tune_lr", "tune_seeds", "placebo")
        given = [n for n in flags if getattr(args, n) is not None]
        given += ["set"] * bool(args.set) + ["arm"] * bool(args.arm) + ["jobs"] * (args.jobs != 1)
        if given:
            raise ConfigError(
                f"--collect only aggregates existing runs; --{given[0].replace('_', '-')} does not apply"
            )
    if args.tune_seeds is not None and not args.tune_lr:
        raise ConfigError("--tune-seeds applies only with --tune-lr")


def _execute(
    plans: list[PlannedRun], args: argparse.Namespace, console: Console
) -> tuple[list[RunData], dict[str, str]]:
    """Train the planned runs that are not finished; (the finished runs, {run_dir: error} of the others).
    Stopped by a signal, the runs in progress checkpoint their last step and the same command continues them."""
    try:
        failed = execute(plans, args.jobs, console)
    except Interrupted as e:
        raise Interrupted(
            f"{e}; continue with: {command_line(args)} (finished runs are skipped, the others resume from "
            "their checkpoints)",
            e.signum,
        ) from None
    return finished_runs(plans, failed)


def _tune(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    """The --tune-lr sweep on the validation split (`tokencredit.compare.tune`); compare.json's "tune"."""
    check_tune_options(args)
    lrs = parse_lrs(args.tune_lr)
    seeds = tune_seeds(args.tune_seeds, parse_seeds(args.seeds or DEFAULT_SEEDS))
    plans = plan_tune(args, lrs, seeds)
    console.rule(
        f"learning-rate sweep on the validation split: {len(plans)} tune runs -> {Path(args.out) / TUNE_DIR}"
    )
    runs, failed = _execute(plans, args, console)
    for d, why in failed.items():
        console.print(f"[yellow]tune run {Path(d).name} not counted: {why}")
    tune = tune_result(tune_scores(plans, runs, args.metric), failed, metric=args.metric, seeds=seeds)
    console.print(_chosen_line(tune), highlight=False, soft_wrap=True)
    return tune


def _chosen_line(tune: dict[str, Any]) -> str:
    chosen = ", ".join(f"{label} {lr:g}" for label, lr in tune["chosen"].items())
    return f"learning rate chosen on the validation split (tune seeds {', '.join(map(str, tune['seeds']))}): {chosen}"


def _train(
    args: argparse.Namespace, console: Console
) -> tuple[list[RunData], dict[str, str], dict[str, Any] | None]:
    """The --tune-lr sweep if asked (its result, else None), then the main runs with the chosen rates:
    (the finished main runs, {run_dir: error} of the others, the sweep's result)."""
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out {out}: cannot create it ({e.strerror or e})") from None
    lock = RunLock(out)  # one comparison per --out; each of its runs also locks its own directory
    try:
        tune = _tune(args, console) if args.tune_lr else None
        plans = plan_runs(args, tune["chosen"] if tune else None)
        runs, failed = _execute(plans, args, console)
    finally:
        lock.release()
    return runs, failed, tune


def run(args: argparse.Namespace) -> int:
    console = Console()
    _check(args)
    failed: dict[str, str] = {}
    left_out: list[dict[str, str]] = []
    tune = None
    if args.collect:
        runs, left_out = collect_runs(args.collect)
    else:
        runs, failed, tune = _train(args, console)
    for d in left_out:
        console.print(f"[yellow]left out {d['run_dir']}: {d['reason']}")
    damaged = damaged_parts(runs)
    for d in damaged:
        console.print(d["reason"], style="yellow", markup=False, soft_wrap=True)
    result = aggregate(runs, baseline=args.baseline, target=args.target, metric=args.metric)
    result["failed"] = [{"run_dir": d, "reason": why} for d, why in failed.items()]
    result["left_out"] = left_out
    result["damaged"] = damaged
    result["command"] = command_line(args)
    if tune is not None:
        result["tune"] = tune
    paths = write_report(result, args.out, band=args.band, smooth=args.smooth)
    console.print(rich_table(result, width=console.width))
    if result.get("placebo"):
        console.print(placebo_table(result["placebo"]))
    warning = few_seeds_warning(result)
    if warning:
        console.print(f"warning: {warning}", style="yellow", markup=False, soft_wrap=True)
    if tune is not None:
        console.print(_chosen_line(tune), highlight=False, soft_wrap=True)
    console.print(
        f"table: {paths['markdown']}   plots: {paths['accuracy']}, {paths['differences']}, {paths['concentration']}"
    )
    if failed:
        console.print(f"[red]{len(failed)} run(s) failed: " + ", ".join(failed))
        return 1
    return 0

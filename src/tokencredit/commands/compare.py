"""`tokencredit compare`: the method shoot-out, recipes x seeds on equal terms (see
`tokencredit.report.compare`). Parses the flags, plans and trains the runs (or collects existing
ones), aggregates them, writes compare.md / compare.json / the plots into --out and prints the table."""

from __future__ import annotations

import argparse
import shlex

from rich.console import Console

from tokencredit.errors import ConfigError, Interrupted
from tokencredit.report.compare import (
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
    plan_runs,
    rich_table,
    write_report,
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
        "--metric", choices=sorted(METRICS), default="greedy",
        help="held-out accuracy: greedy (eval_greedy_accuracy, default) or avg (avg@k of eval.samples samples)",
    )  # fmt: skip
    parser.add_argument("--config", help="TOML trainer config shared by every run (see `tokencredit train`)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="trainer config override for every run, e.g. run.steps=40 (repeatable; algo.<field>=... "
        "overrides that field of every recipe)",
    )  # fmt: skip
    parser.add_argument(
        "--lora-rank", type=int,
        help="train every recipe with a LoRA adapter of this rank (0 = full fine-tuning; default: the config's)",
    )  # fmt: skip
    parser.add_argument(
        "--lora-only-rank", type=int, default=8,
        help="LoRA rank for recipes that need an adapter (arca, policy-divergence) when the others run "
        "without one (default 8)",
    )  # fmt: skip
    parser.add_argument(
        "--jobs", type=int, default=1,
        help="runs in parallel, as subprocesses with run.threads = cores / jobs (default 1: one after another)",
    )  # fmt: skip
    parser.add_argument(
        "--out", default="runs/compare", help="output directory (default runs/compare); runs go to OUT/runs"
    )
    parser.add_argument(
        "--collect", nargs="+", metavar="RUN_DIR",
        help="only aggregate existing run directories (or directories of them), grouped by recipe",
    )  # fmt: skip
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
        given = [n for n in ("recipes", "seeds", "config", "lora_rank") if getattr(args, n) is not None]
        given += ["set"] * bool(args.set) + ["jobs"] * (args.jobs != 1)
        if given:
            raise ConfigError(
                f"--collect only aggregates existing runs; --{given[0].replace('_', '-')} does not apply"
            )


def _train(args: argparse.Namespace, console: Console) -> tuple[list[RunData], dict[str, str]]:
    """Train the planned runs that are not finished; (the finished runs, {run_dir: error} of the others).
    Stopped by a signal, the runs in progress checkpoint their last step and the same command continues them."""
    plans = plan_runs(args)
    try:
        failed = execute(plans, args.jobs, console)
    except Interrupted as e:
        raise Interrupted(
            f"{e}; continue with: {command_line(args)} (finished runs are skipped, the others resume from "
            "their checkpoints)",
            e.signum,
        ) from None
    return finished_runs(plans, failed)


def run(args: argparse.Namespace) -> int:
    console = Console()
    _check(args)
    failed: dict[str, str] = {}
    left_out: list[dict[str, str]] = []
    if args.collect:
        runs, left_out = collect_runs(args.collect)
    else:
        runs, failed = _train(args, console)
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
    paths = write_report(result, args.out, band=args.band, smooth=args.smooth)
    console.print(rich_table(result, width=console.width))
    warning = few_seeds_warning(result)
    if warning:
        console.print(f"warning: {warning}", style="yellow", markup=False, soft_wrap=True)
    console.print(
        f"table: {paths['markdown']}   plots: {paths['accuracy']}, {paths['differences']}, {paths['concentration']}"
    )
    if failed:
        console.print(f"[red]{len(failed)} run(s) failed: " + ", ".join(failed))
        return 1
    return 0

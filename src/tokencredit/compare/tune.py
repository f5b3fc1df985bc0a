"""`tokencredit compare --tune-lr`: a learning rate per row (recipe or --arm), chosen on a validation split.

Before the main runs, every row trains once per learning rate and tune seed, with ``optim.lr`` = that
rate and ``data.eval_split = "validation"`` (problems disjoint from the training problems and from the
held-out test set; `tokencredit.tasks.load_problems_for`), in ``OUT/tune/runs/LABEL-lrLR-sSEED``. Per
row the rate with the highest mean final validation accuracy over the tune seeds (the --metric
quantity) is chosen; ties go to the higher mean accuracy AUC, then to the smaller rate. A rate with a
tune run that failed (diverged, crashed) is not a candidate. The main runs then train on the held-out
split with the chosen rate.

Planning, execution and reading are compare's own (`plan.plan_run`, `execute.execute`,
`execute.finished_runs`, `aggregate.final_accuracy`); this module holds the sweep's parts: parsing
the flags, planning the tune runs, scoring them and the choice (`choose_lrs`, a pure function).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tokencredit.compare.aggregate import METRICS, final_accuracy
from tokencredit.compare.plan import PlannedRun, PlanOptions, parse_seeds, plan_arms, plan_run
from tokencredit.compare.runs import RunData
from tokencredit.compare.stats import curve_area, mean_std
from tokencredit.errors import ConfigError, TrainingError
from tokencredit.tasks import load_problems_for

__all__ = [
    "DEFAULT_TUNE_SEED",
    "RULE",
    "TUNE_DIR",
    "TuneScore",
    "check_tune_options",
    "choose_lrs",
    "lr_text",
    "parse_lrs",
    "plan_tune",
    "tune_result",
    "tune_scores",
    "tune_seeds",
]

TUNE_DIR = "tune"  # OUT/tune/runs holds the tune runs
DEFAULT_TUNE_SEED = 1000  # the default tune seeds: the first two from here not among --seeds
RULE = (
    "highest mean final validation accuracy over the tune seeds; ties: the higher mean accuracy AUC, then "
    "the smaller learning rate; a learning rate with a failed tune run is not chosen"
)
_SET_BY_TUNE = ("optim.lr", "data.eval_split")  # keys the sweep sets per run


@dataclass(frozen=True)
class TuneScore:
    """One tune run: its row label, learning rate, seed, final validation accuracy and accuracy AUC
    (`final` None: the run failed or did not finish; `auc` None: no area, see `stats.curve_area`)."""

    label: str
    lr: float
    seed: int
    final: float | None
    auc: float | None = None
    run_dir: str = ""


def lr_text(lr: float) -> str:
    """A learning rate as written in run directory names and tables (exact: repr)."""
    return repr(float(lr))


def parse_lrs(text: str) -> list[float]:
    """--tune-lr: comma-separated learning rates > 0, no value twice."""
    try:
        lrs = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--tune-lr expects comma-separated learning rates, got {text!r}") from None
    if not lrs:
        raise ConfigError("--tune-lr: empty list")
    bad = [x for x in lrs if not (math.isfinite(x) and x > 0)]
    if bad:
        raise ConfigError(f"--tune-lr: learning rates must be finite and > 0, got {bad[0]!r}")
    if len(set(lrs)) != len(lrs):
        raise ConfigError(f"--tune-lr: a learning rate is given twice in {text!r}")
    return lrs


def tune_seeds(text: str | None, main: list[int]) -> list[int]:
    """--tune-seeds, or by default the first two seeds from `DEFAULT_TUNE_SEED` not among the main
    seeds; a tune seed that is also a main seed is an error (tuning and testing would share a run)."""
    if text is None:
        free = (s for s in range(DEFAULT_TUNE_SEED, DEFAULT_TUNE_SEED + len(main) + 2) if s not in main)
        return [next(free), next(free)]
    seeds = parse_seeds(text, "tune-seeds")
    shared = sorted(set(seeds) & set(main))
    if shared:
        raise ConfigError(f"--tune-seeds {text}: seed {shared[0]} is also in --seeds; tune on other seeds")
    return seeds


def check_tune_options(args: PlanOptions) -> None:
    """--set and --arm must leave optim.lr and data.eval_split to the sweep."""
    arms = plan_arms(args)
    given = [(f"--set {s}", s) for s in args.set] + [(f"--arm {a.label}", s) for a in arms for s in a.sets]
    for flag, s in given:
        key = s.split("=", 1)[0].strip()
        if key in _SET_BY_TUNE:
            raise ConfigError(
                f"{flag}: --tune-lr sets {key} per run (optim.lr: each rate of the sweep, then the chosen one; "
                "data.eval_split: validation for the sweep, heldout for the main runs); leave it out"
            )


def plan_tune(args: PlanOptions, lrs: list[float], seeds: list[int]) -> list[PlannedRun]:
    """One tune run per (row, learning rate, tune seed) in OUT/tune/runs/LABEL-lrLR-sSEED, evaluated on
    the validation split; a data.eval that has no validation split is an error here, before any run."""
    runs = Path(args.out) / TUNE_DIR / "runs"
    plans = [
        plan_run(
            args,
            arm,
            seed,
            runs,
            (f"optim.lr={lr!r}", "data.eval_split=validation"),
            name=f"{arm.label}-lr{lr_text(lr)}-s{seed}",
        )
        for arm in plan_arms(args)
        if not arm.placebo_of  # a placebo row trains at its recipe's chosen rate
        for lr in lrs
        for seed in seeds
    ]
    for p in plans:
        p.variant = f"lr {lr_text(p.cfg.optim.lr)}"
    checked: set[str] = set()
    for p in plans:
        key = json.dumps(asdict(p.cfg.data), sort_keys=True)
        if key not in checked:
            checked.add(key)
            try:
                load_problems_for(p.cfg.data.eval, p.cfg.data, "validation")
            except ConfigError as e:
                raise ConfigError(f"--tune-lr ({p.label}): {e}") from None
    return plans


def tune_scores(plans: list[PlannedRun], runs: list[RunData], metric: str = "greedy") -> list[TuneScore]:
    """A `TuneScore` per planned tune run, from the finished `runs` (`execute.finished_runs`); a plan
    without a finished run scores None."""
    key = METRICS[metric]
    done = {str(r.run_dir): r for r in runs}
    out = []
    for p in plans:
        r = done.get(str(p.run_dir))
        final = final_accuracy(r, key) if r is not None else None
        last = int((r.summary or {}).get("steps", p.cfg.run.steps)) if r is not None else 0
        auc = curve_area(r.evals, key, last) if r is not None else None
        out.append(TuneScore(p.label or p.recipe, float(p.cfg.optim.lr), p.seed, final, auc, str(p.run_dir)))
    return out


def _lr_entry(lr: float, scores: list[TuneScore]) -> dict[str, Any]:
    finals = [s.final for s in scores if s.final is not None]
    aucs = [s.auc for s in scores if s.final is not None and s.auc is not None]
    return {
        "lr": lr,
        "final_accuracy": mean_std(finals),
        "accuracy_auc": mean_std(aucs),
        "seeds": sorted(s.seed for s in scores if s.final is not None),
        "failed_seeds": sorted(s.seed for s in scores if s.final is None),
    }


def _rank(entry: dict[str, Any]) -> tuple[float, float, float]:
    auc = entry["accuracy_auc"]["mean"]
    return (entry["final_accuracy"]["mean"], -math.inf if auc is None else auc, -entry["lr"])


def choose_lrs(scores: Iterable[TuneScore]) -> list[dict[str, Any]]:
    """Per label (in order of first appearance): {"label", "chosen", "lrs"} with "lrs" one entry per
    learning rate (ascending: mean ± std of the final accuracy and of the AUC over its seeds, the seeds
    that finished, the seeds that failed) and "chosen" the rate of `RULE` (None: every rate had a failed run)."""
    by_label: dict[str, dict[float, list[TuneScore]]] = {}
    for s in scores:
        by_label.setdefault(s.label, {}).setdefault(float(s.lr), []).append(s)
    rows = []
    for label, by_lr in by_label.items():
        entries = [_lr_entry(lr, by_lr[lr]) for lr in sorted(by_lr)]
        eligible = [e for e in entries if e["seeds"] and not e["failed_seeds"]]
        chosen = max(eligible, key=_rank)["lr"] if eligible else None
        rows.append({"label": label, "chosen": chosen, "lrs": entries})
    return rows


def tune_result(
    scores: list[TuneScore], failed: dict[str, str], *, metric: str, seeds: list[int]
) -> dict[str, Any]:
    """compare.json's "tune": the rows of `choose_lrs`, {label: chosen rate}, the rule and the failed tune
    runs; a row with no rate whose tune runs all finished is a TrainingError naming them."""
    rows = choose_lrs(scores)
    for row in rows:
        if row["chosen"] is None:
            bad = [s.run_dir for s in scores if s.label == row["label"] and s.final is None]
            why = "; ".join(f"{Path(d).name}: {failed.get(d, 'did not finish')}" for d in bad[:3])
            raise TrainingError(
                f"--tune-lr: no learning rate of {row['label']!r} finished all its tune runs ({why}); lower the "
                "rates or fix the runs, then run the same command again"
            )
    return {
        "split": "validation",
        "metric": METRICS[metric],
        "lrs": sorted({s.lr for s in scores}),
        "seeds": seeds,
        "rule": RULE,
        "chosen": {row["label"]: row["chosen"] for row in rows},
        "rows": rows,
        "failed": [{"run_dir": d, "reason": why} for d, why in failed.items()],
    }

"""Benchmarks x seeds for ``tokencredit eval``: loading a benchmark, `evaluate_benchmarks`, the Markdown table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from tokencredit.data import load_problems, math_benchmarks, reasoning_gym
from tokencredit.errors import ConfigError, closest
from tokencredit.evaluation.run import evaluate
from tokencredit.evaluation.settings import EvalSettings
from tokencredit.models import TOY_VARIANTS
from tokencredit.tasks import load_problems_for

__all__ = ["BENCHMARKS", "evaluate_benchmarks", "load_benchmark", "markdown_table"]

BENCHMARKS: tuple[str, ...] = (*TOY_VARIANTS, *math_benchmarks.NAMES)
"""The benchmark names: the embedded synthetic tasks' held-out problems, then the shipped math benchmarks."""


def load_benchmark(name: str, limit: int | None, data: Any = None) -> list[Any]:
    """The problems of one benchmark: a name of `BENCHMARKS`, reasoning-gym data
    (``reasoning-gym:NAME[?params]``, its held-out split, `limit` problems) or a data file (.jsonl /
    .json / .parquet / datasets directory); the first `limit` problems when given.

    "toy" and "toy-hard" are the held-out problems the trainer evaluates on with ``data.eval`` of that
    name, read from `data` (a DataConfig: a run's, or the trainer's defaults): the task's difficulty
    and digits, and ``data.eval_size`` problems unless `limit` is given. An unknown name is a
    ConfigError listing the names, with the closest ones.
    """
    if name in TOY_VARIANTS:
        if data is None:
            raise ConfigError(
                f"benchmark {name!r}: the embedded task's settings are needed (data: a DataConfig)"
            )
        return load_problems_for(name, replace(data, eval_size=limit or data.eval_size), split="heldout")
    if reasoning_gym.is_spec(name):
        return reasoning_gym.load(name, split="heldout", size=limit)
    if name in math_benchmarks.NAMES:
        return math_benchmarks.load(name, limit=limit)
    p = Path(name)
    if p.suffix.lower() in (".jsonl", ".json", ".ndjson", ".parquet", ".pq") or p.is_dir():
        return load_problems(p, limit=limit)
    raise ConfigError(
        f"unknown benchmark {name!r}; available: {', '.join(BENCHMARKS)}, reasoning-gym:NAME[?params], or a "
        ".jsonl / .parquet file or datasets directory" + closest(name, BENCHMARKS)
    )


def evaluate_benchmarks(
    model: Any,
    tokenizer: Any,
    data: dict[str, list[Any]],
    seeds: Sequence[int],
    settings: EvalSettings | None = None,
    *,
    verifier: Any,
    progress: bool = True,
) -> dict[str, dict[str, Any]]:
    """{benchmark: {"metrics": mean over seeds, "per_seed": [...], "std": sample std (2+ seeds),
    "verify_timeouts": timed-out verifications summed over seeds}}.

    Each benchmark is evaluated with `settings` (default `EvalSettings()`) once per seed of `seeds`
    (which replace `settings.seed`). The greedy answer does not depend on the seed: with
    `settings.greedy` it is computed once, with the first seed (with no samples, only that seed runs).
    """
    settings = EvalSettings() if settings is None else settings
    if not settings.samples:  # greedy only: the answer does not depend on the seed, so one pass is all
        seeds = list(seeds)[:1]
    results: dict[str, dict[str, Any]] = {}
    for b, problems in data.items():
        per_seed = []
        greedy_keys: dict[str, float] = {}
        for i, s in enumerate(seeds):
            m = evaluate(
                model,
                tokenizer,
                problems,
                replace(settings, seed=s, greedy=settings.greedy and i == 0),
                verifier=verifier,
                progress=progress,
                description=f"{b} seed {s}",
            )
            if i == 0:
                greedy_keys = {k: v for k, v in m.items() if k == "greedy_acc"}
            m.update(greedy_keys)
            per_seed.append(m)
        keys = [k for k in per_seed[0] if k != "verify_timeouts"]  # a count: summed below, not averaged
        entry: dict[str, Any] = {
            "metrics": {k: float(np.mean([m[k] for m in per_seed])) for k in keys},
            "per_seed": per_seed,
            "verify_timeouts": int(sum(m.get("verify_timeouts", 0) for m in per_seed)),
        }
        if len(seeds) > 1:
            entry["std"] = {
                k: float(np.std([m[k] for m in per_seed], ddof=1))
                for k in keys
                if k not in ("num_problems", "greedy_acc")
            }
        results[b] = entry
    return results


def _fmt(mean: float, std: float | None, pct: bool) -> str:
    if pct:
        s = f"{100 * mean:.1f}"
        return s if std is None else f"{s} ± {100 * std:.1f}"
    s = f"{mean:.1f}"
    return s if std is None else f"{s} ± {std:.1f}"


def markdown_table(results: dict[str, dict[str, Any]]) -> str:
    """A Markdown table: one row per benchmark, accuracies in percent (mean ± std over seeds)."""
    cols: list[str] = []
    for r in results.values():
        for key in r["metrics"]:
            if key not in cols and key != "num_problems":
                cols.append(key)
    order = {"greedy_acc": 0}
    for key in cols:
        order.setdefault(key, {"avg": 1, "pass": 2, "maj": 3}.get(key.split("@")[0], 4))

    def sort_key(c: str) -> tuple[int, int]:
        return order[c], int(c.split("@")[1]) if "@" in c else 0

    cols.sort(key=sort_key)
    header = ["benchmark", "n"] + [
        c.replace("greedy_acc", "greedy").replace("mean_response_length", "len") for c in cols
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, r in results.items():
        cells = [name, str(int(r["metrics"]["num_problems"]))]
        for c in cols:
            if c not in r["metrics"]:
                cells.append("")
                continue
            std = r.get("std", {}).get(c)
            cells.append(_fmt(r["metrics"][c], std, pct=c != "mean_response_length"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)

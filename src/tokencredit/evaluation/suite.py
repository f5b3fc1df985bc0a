"""Benchmarks x seeds for ``tokencredit eval``: loading a benchmark, `evaluate_benchmarks`, the Markdown table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from tokencredit.data import load_problems, math_benchmarks, reasoning_gym
from tokencredit.evaluation.run import evaluate
from tokencredit.evaluation.settings import EvalSettings

__all__ = ["evaluate_benchmarks", "load_benchmark", "markdown_table"]


def load_benchmark(name: str, limit: int | None) -> list[Any]:
    """A shipped benchmark by name, reasoning-gym data (``reasoning-gym:NAME[?params]``, its held-out split,
    `limit` problems), or problems from a data file (.jsonl / .json / .parquet / datasets dir)."""
    if reasoning_gym.is_spec(name):
        return reasoning_gym.load(name, split="heldout", size=limit)
    p = Path(name)
    if name not in math_benchmarks.COUNTS and (p.suffix in (".jsonl", ".json", ".parquet") or p.is_dir()):
        return load_problems(p, limit=limit)
    return math_benchmarks.load(name, limit=limit)


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
                model, tokenizer, problems, replace(settings, seed=s, greedy=settings.greedy and i == 0),
                verifier=verifier, progress=progress, description=f"{b} seed {s}",
            )  # fmt: skip
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

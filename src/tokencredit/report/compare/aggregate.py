"""From runs to the comparison: group the runs by recipe, and per group the statistics over seeds,
the per-run numbers, the curves and the paired test against the baseline, as one JSON-ready dict."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from tokencredit.errors import ConfigError, closest
from tokencredit.report.compare.runs import RUNTIME_KEYS, RunData, flat_config
from tokencredit.report.compare.stats import mean_std, paired_t_test, steps_to_target
from tokencredit.train.config import TrainConfig

__all__ = ["METRICS", "Group", "aggregate", "final_accuracy", "group_runs"]

METRICS = {"greedy": "eval_greedy_accuracy", "avg": "eval_avg_at_k"}
_FREE_KEYS = RUNTIME_KEYS | {"run.seed", "algo.recipe"}
# Always listed in compare.md's settings, default or not.
_KEY_SETTINGS = (
    "model.name", "run.steps", "rollout.prompts_per_step", "rollout.group_size", "rollout.max_new_tokens",
    "rollout.temperature", "optim.lr", "data.train", "data.eval", "data.eval_size", "eval.every", "eval.samples",
    "reward.function",
)  # fmt: skip
# Per-run means over training steps, then mean ± std over seeds.
_STEP_MEANS = ("response_length", "credit_gini", "credit_eff_ratio", "gen_rounds")
_OVER_SEEDS = ("response_length", "tokens_per_s", "credit_gini", "credit_eff_ratio", "gen_rounds", "seconds")


@dataclass
class Group:
    """The runs of one recipe (one LoRA rank, one set of recipe hyperparameters), over seeds."""

    label: str
    recipe: str
    lora_rank: int
    runs: list[RunData] = field(default_factory=list)


def group_runs(runs: list[RunData]) -> list[Group]:
    """Group by (recipe name, LoRA rank, recipe fields), in order of first appearance; labels are the
    recipe names, with the LoRA rank or a variant number added where a name would be ambiguous."""
    keyed: dict[tuple[str, int, str], Group] = {}
    for r in runs:
        key = (r.recipe, r.lora_rank, json.dumps(r.recipe_dict, sort_keys=True))
        keyed.setdefault(key, Group(r.recipe, r.recipe, r.lora_rank)).runs.append(r)
    groups = list(keyed.values())
    for name in {g.recipe for g in groups}:
        same = [g for g in groups if g.recipe == name]
        if len(same) == 1:
            continue
        ranks = {g.lora_rank for g in same}
        for i, g in enumerate(same, 1):
            parts = [f"LoRA r={g.lora_rank}" if g.lora_rank else "full"] if len(ranks) > 1 else []
            if len([h for h in same if h.lora_rank == g.lora_rank]) > 1:
                parts.append(f"variant {i}")
            g.label = f"{name} [{', '.join(parts)}]"
    for g in groups:
        seeds = [r.seed for r in g.runs]
        dup = sorted({s for s in seeds if seeds.count(s) > 1})
        if dup:
            dirs = [str(r.run_dir) for r in g.runs if r.seed == dup[0]]
            raise ConfigError(f"recipe {g.label!r} has seed {dup[0]} twice: {', '.join(dirs)}")
        g.runs.sort(key=lambda r: r.seed)
    return groups


def _curve(runs: list[RunData], records: str, key: str) -> dict[str, list[Any]]:
    """Per step over seeds: mean, std (n - 1; 0 for one seed), min, max, seeds counted."""
    by_step: dict[int, list[float]] = {}
    for r in runs:
        for rec in getattr(r, records):
            if key in rec and rec[key] is not None:
                by_step.setdefault(int(rec["step"]), []).append(float(rec[key]))
    out: dict[str, list[Any]] = {"step": [], "mean": [], "std": [], "min": [], "max": [], "n": []}
    for step in sorted(by_step):
        s = mean_std(by_step[step])
        out["step"].append(step)
        out["mean"].append(s["mean"])
        out["std"].append(s["std"] or 0.0)
        out["min"].append(min(by_step[step]))
        out["max"].append(max(by_step[step]))
        out["n"].append(s["n"])
    return out


def _step_mean(run: RunData, key: str) -> float | None:
    vals = [float(s[key]) for s in run.steps if key in s]
    return math.fsum(vals) / len(vals) if vals else None


def final_accuracy(run: RunData, key: str) -> float:
    """The metric at the run's last held-out evaluation (summary.json's "final", else the last eval record)."""
    final = (run.summary or {}).get("final") or (run.evals[-1] if run.evals else None)
    if not final or key not in final:
        raise ConfigError(
            f"{run.run_dir}: no held-out evaluation with {key!r} (summary.json 'final' / metrics.jsonl eval records)"
        )
    return float(final[key])


def _run_entry(r: RunData, final: float, key: str, target: float) -> dict[str, Any]:
    """One run's row of the result: its final accuracy, steps to `target` and per-step means."""
    summary = r.summary or {}
    means = {k: _step_mean(r, k) for k in _STEP_MEANS}
    return {
        "run_dir": str(r.run_dir),
        "seed": r.seed,
        "steps": int(summary.get("steps", len(r.steps) + r.skipped_steps)),
        "final_accuracy": final,
        "steps_to_target": steps_to_target(r.evals, key, target),
        "response_length": means["response_length"],
        "tokens_per_s": float(summary.get("tokens_per_s") or 0.0) or _step_mean(r, "tokens_per_s"),
        "credit_gini": means["credit_gini"],
        "credit_eff_ratio": means["credit_eff_ratio"],
        "gen_rounds": means["gen_rounds"],
        "skipped_steps": r.skipped_steps,
        "seconds": summary.get("seconds"),
        "final_mean_length": (summary.get("final") or {}).get("eval_mean_length"),
    }


def _vs_baseline(finals: dict[int, float], base: dict[int, float]) -> dict[str, Any]:
    """Paired t-test of the final accuracies against the baseline's over the seeds both have."""
    matched = sorted(set(base) & set(finals))
    test = paired_t_test([finals[s] for s in matched], [base[s] for s in matched]).to_dict()
    test["seeds"] = matched
    return test


def _group_entry(
    g: Group, finals: dict[int, float], test: dict[str, Any] | None, key: str, target: float
) -> dict[str, Any]:
    """One recipe's entry of the result: statistics over seeds, per-run rows, curves."""
    per_run = [_run_entry(r, finals[r.seed], key, target) for r in g.runs]
    reached = [p["steps_to_target"] for p in per_run if p["steps_to_target"] is not None]
    return {
        "label": g.label,
        "recipe": g.recipe,
        "lora_rank": g.lora_rank,
        "credit": g.runs[0].recipe_dict.get("credit"),
        "seeds": [r.seed for r in g.runs],
        "final_accuracy": mean_std([p["final_accuracy"] for p in per_run]),
        "steps_to_target": {**mean_std(reached), "reached": len(reached), "of": len(per_run)},
        **{k: mean_std([p[k] for p in per_run if p[k] is not None]) for k in _OVER_SEEDS},
        "vs_baseline": test,
        "runs": per_run,
        "curves": {
            "accuracy": _curve(g.runs, "evals", key),
            "credit_gini": _curve(g.runs, "steps", "credit_gini"),
            "credit_eff_ratio": _curve(g.runs, "steps", "credit_eff_ratio"),
        },
    }


def _pick_baseline(labels: list[str], baseline: str | None) -> str:
    if baseline is None:
        return "grpo" if "grpo" in labels else labels[0]
    if baseline not in labels:
        raise ConfigError(
            f"baseline {baseline!r} is not among the recipes compared ({', '.join(labels)}){closest(baseline, labels)}"
        )
    return baseline


def aggregate(
    runs: list[RunData], *, baseline: str | None = None, target: float = 0.5, metric: str = "greedy"
) -> dict[str, Any]:
    """The comparison as a JSON-ready dict: per recipe (baseline first) the statistics over seeds, the
    per-run numbers, the curves, and the paired test of the final held-out accuracy against `baseline`."""
    if metric not in METRICS:
        raise ConfigError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    key = METRICS[metric]
    groups = group_runs(runs)
    if not groups:
        raise ConfigError("no finished runs to compare")
    baseline = _pick_baseline([g.label for g in groups], baseline)
    groups.sort(key=lambda g: g.label != baseline)  # baseline first, the others in the order given
    finals = {g.label: {r.seed: final_accuracy(r, key) for r in g.runs} for g in groups}
    entries = []
    for g in groups:
        test = None if g.label == baseline else _vs_baseline(finals[g.label], finals[baseline])
        entries.append(_group_entry(g, finals[g.label], test, key, target))
    common, differing = _settings(runs)
    return {
        "metric": key,
        "target": target,
        "baseline": baseline,
        "settings": common,
        "differing_settings": differing,
        "recipes": entries,
    }


def _settings(runs: list[RunData]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(settings shared by every run that matter for the table, {key: {run_dir: value}} for the others)."""
    defaults = flat_config(TrainConfig())
    keys = sorted({k for r in runs for k in r.config} - _FREE_KEYS - {"model.lora_rank"})
    common, differing = {}, {}
    for k in keys:
        vals = {str(r.run_dir): r.config.get(k) for r in runs}
        distinct = {json.dumps(v, sort_keys=True) for v in vals.values()}
        if len(distinct) > 1:
            differing[k] = vals
        else:
            v = next(iter(vals.values()))
            if k in _KEY_SETTINGS or v != defaults.get(k):
                common[k] = v
    return common, differing

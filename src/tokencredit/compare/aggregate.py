"""From runs to the comparison: group the runs by recipe, and per group the statistics over seeds,
the per-run numbers, the curves and the paired test against the baseline, as one JSON-ready dict."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from tokencredit.compare.runs import RUNTIME_KEYS, RunData, flat_config
from tokencredit.compare.stats import (
    curve_area,
    holm,
    mean_ci,
    mean_std,
    paired_effect,
    paired_t_test,
    steps_to_target,
)
from tokencredit.errors import ConfigError, closest
from tokencredit.train.config import TrainConfig

__all__ = [
    "ACCURACY_BOUNDS",
    "INTERVAL",
    "METRICS",
    "MIN_SEEDS",
    "Group",
    "aggregate",
    "final_accuracy",
    "group_runs",
]

ACCURACY_BOUNDS, DIFFERENCE_BOUNDS = (
    (0.0, 1.0),
    (-1.0, 1.0),
)  # where an accuracy, and a difference of two, lie
MIN_SEEDS = 3  # fewer seeds per recipe: the intervals say little (t* = 12.7 for 2), compare warns
INTERVAL = (
    "95% t-interval of the mean over seeds, cut to [0, 1] for accuracies ([-1, 1] for their differences); "
    "paired tests two-sided, Holm-corrected across recipes"
)
METRICS = {"greedy": "eval_greedy_accuracy", "avg": "eval_avg_at_k"}
_FREE_KEYS = RUNTIME_KEYS | {"run.seed", "run.label", "algo.recipe"}
# Always listed in compare.md's settings, default or not.
_KEY_SETTINGS = (
    "model.name",
    "run.steps",
    "rollout.prompts_per_step",
    "rollout.group_size",
    "rollout.max_new_tokens",
    "rollout.temperature",
    "optim.lr",
    "data.train",
    "data.eval",
    "data.eval_size",
    "eval.every",
    "eval.samples",
    "reward.function",
)
# Per-run means over training steps, then mean ± std over seeds.
_STEP_MEANS = ("response_length", "credit_gini", "credit_eff_ratio", "gen_rounds")
_OVER_SEEDS = (
    "response_length",
    "tokens_per_s",
    "credit_gini",
    "credit_eff_ratio",
    "gen_rounds",
    "seconds",
    "generated_tokens",
    "work_tokens",
    "critic_work_tokens",
)


@dataclass
class Group:
    """The runs of one recipe (one LoRA rank, one set of recipe hyperparameters), over seeds."""

    label: str
    recipe: str
    lora_rank: int
    runs: list[RunData] = field(default_factory=list)


def group_runs(runs: list[RunData]) -> list[Group]:
    """Group by (label: the recipe name or `compare --arm`'s NAME, LoRA rank, recipe fields), in order of
    first appearance; the group labels are the run labels, with the LoRA rank or a variant number added
    where one would be ambiguous."""
    keyed: dict[tuple[str, int, str], Group] = {}
    for r in runs:
        key = (r.label, r.lora_rank, json.dumps(r.recipe_dict, sort_keys=True))
        keyed.setdefault(key, Group(r.label, r.recipe, r.lora_rank)).runs.append(r)
    groups = list(keyed.values())
    for name in {g.label for g in groups}:
        same = [g for g in groups if g.label == name]
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


def generated_tokens(run: RunData) -> int | None:
    """Tokens the run generated: every sampled round's responses (`generated_tokens` of each step,
    Monte-Carlo continuations of the oracle / VinePPO included), or the trained tokens of runs
    written before that field existed."""
    key = "generated_tokens" if any("generated_tokens" in s for s in run.steps) else "tokens"
    vals = [int(s[key]) for s in run.steps if key in s]
    return sum(vals) if vals else None


# Forward-token equivalents of a step: a backward pass costs about two forwards (the usual FLOPs ratio).
_WORK = {
    "generated_tokens": 1,
    "policy/forward_tokens": 1,
    "policy/backward_tokens": 2,
    "critic/forward_tokens": 1,
    "critic/backward_tokens": 2,
}


def work_tokens(run: RunData) -> tuple[int | None, int]:
    """(total work, the critic's part) of a run in forward-token equivalents: each generated token, each
    prompt or response token through a forward pass of the policy, the reference or the critic, and twice
    each token through a backward pass (`_WORK`, summed over the trained steps). None for a run written before
    the trainer logged its passes (`policy/forward_tokens`)."""
    if not any("policy/forward_tokens" in s for s in run.steps):
        return None, 0
    total = critic = 0
    for s in run.steps:
        for key, weight in _WORK.items():
            value = int(s.get(key, 0)) * weight
            total += value
            critic += value if key.startswith("critic/") else 0
    return total, critic


def _run_entry(r: RunData, final: float, key: str, target: float) -> dict[str, Any]:
    """One run's row of the result: its final accuracy, steps to `target`, the area under its accuracy
    curve, its cost (generated tokens, wall seconds) and per-step means."""
    summary = r.summary or {}
    means = {k: _step_mean(r, k) for k in _STEP_MEANS}
    work, critic_work = work_tokens(r)
    last = int(summary.get("steps", len(r.steps) + r.skipped_steps))
    return {
        "run_dir": str(r.run_dir),
        "seed": r.seed,
        "steps": int(summary.get("steps", len(r.steps) + r.skipped_steps)),
        "final_accuracy": final,
        "steps_to_target": steps_to_target(r.evals, key, target),
        "accuracy_auc": curve_area(r.evals, key, last),
        "generated_tokens": generated_tokens(r),
        "work_tokens": work,
        "critic_work_tokens": critic_work if work is not None else None,
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
    """Paired t-test of a per-seed figure against the baseline's over the seeds both have, with the
    95% interval of the paired difference and the effect size d_z."""
    matched = sorted(set(base) & set(finals))
    x, y = [finals[s] for s in matched], [base[s] for s in matched]
    test = paired_t_test(x, y).to_dict()
    test["seeds"] = matched
    test["difference"] = paired_effect(x, y, bounds=DIFFERENCE_BOUNDS)
    return test


def _group_entry(
    g: Group, per_run: list[dict[str, Any]], tests: dict[str, dict[str, Any] | None], key: str
) -> dict[str, Any]:
    """One recipe's entry of the result: statistics over seeds (95% t-intervals), per-run rows, curves."""
    reached = [p["steps_to_target"] for p in per_run if p["steps_to_target"] is not None]
    aucs = [p["accuracy_auc"] for p in per_run if p["accuracy_auc"] is not None]
    return {
        "label": g.label,
        "recipe": g.recipe,
        "lora_rank": g.lora_rank,
        "credit": g.runs[0].recipe_dict.get("credit"),
        "seeds": [r.seed for r in g.runs],
        "final_accuracy": mean_ci([p["final_accuracy"] for p in per_run], bounds=ACCURACY_BOUNDS),
        "steps_to_target": {**mean_std(reached), "reached": len(reached), "of": len(per_run)},
        "accuracy_auc": mean_ci(aucs, bounds=ACCURACY_BOUNDS),
        **{k: mean_std([p[k] for p in per_run if p[k] is not None]) for k in _OVER_SEEDS},
        "vs_baseline": tests["final"],
        "auc_vs_baseline": tests["auc"],
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


def _placebo_base(g: Group, groups: list[Group]) -> Group | None:
    """The group whose update size placebo group `g` keeps: the same recipe fields (placebo aside) and LoRA rank."""
    placebo = g.runs[0].recipe_dict.get("placebo", "none")
    if placebo == "none":
        return None
    want = json.dumps({**g.runs[0].recipe_dict, "placebo": "none"}, sort_keys=True)
    for h in groups:
        d = h.runs[0].recipe_dict
        if (
            h.lora_rank == g.lora_rank
            and json.dumps({**d, "placebo": d.get("placebo", "none")}, sort_keys=True) == want
        ):
            return h
    return None


def placebo_tests(
    groups: list[Group], by_seed: dict[str, dict[str, dict[int, float]]]
) -> list[dict[str, Any]]:
    """Each placebo row against the row whose update size it keeps (`compare --placebo`): the paired
    difference R - placebo per seed (positive: R's placement beats random placement of the same credit),
    for the final accuracy and its AUC, with Holm's correction across all placebo rows, one family per figure."""
    rows = []
    for g in groups:
        base = _placebo_base(g, groups)
        if base is None:
            continue
        row: dict[str, Any] = {
            "recipe": base.label,
            "placebo": g.runs[0].recipe_dict["placebo"],
            "label": g.label,
        }
        for fig, name in (("final_accuracy", "final"), ("accuracy_auc", "auc")):
            row[name] = _vs_baseline(by_seed[fig][base.label], by_seed[fig][g.label])
        rows.append(row)
    for name in ("final", "auc"):
        adjusted = holm({r["label"]: r[name]["p"] for r in rows})
        for r in rows:
            r[name]["p_holm"] = adjusted[r["label"]]
    return rows


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
    per_run = {g.label: [_run_entry(r, final_accuracy(r, key), key, target) for r in g.runs] for g in groups}
    by_seed = {
        fig: {lbl: {p["seed"]: p[fig] for p in rows if p[fig] is not None} for lbl, rows in per_run.items()}
        for fig in ("final_accuracy", "accuracy_auc")
    }
    tests: dict[str, dict[str, dict[str, Any] | None]] = {g.label: {} for g in groups}
    for fig, name in (("final_accuracy", "final"), ("accuracy_auc", "auc")):
        for g in groups:
            vals = by_seed[fig]
            tests[g.label][name] = (
                None if g.label == baseline else _vs_baseline(vals[g.label], vals[baseline])
            )
        # Holm across the recipes compared with the baseline, one family per figure
        adjusted = holm({lbl: t[name]["p"] for lbl, t in tests.items() if t[name] is not None})
        for lbl, p_holm in adjusted.items():
            tests[lbl][name]["p_holm"] = p_holm
    entries = [_group_entry(g, per_run[g.label], tests[g.label], key) for g in groups]
    common, differing = _settings(runs)
    return {
        "metric": key,
        "target": target,
        "interval": INTERVAL,
        "baseline": baseline,
        "settings": common,
        "differing_settings": differing,
        "recipes": entries,
        "placebo": placebo_tests(groups, by_seed),
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

"""`tokencredit compare`: the method shoot-out, recipes x seeds on equal terms.

Each (recipe, seed) is one ordinary trainer run in ``OUT/runs/<recipe>-s<seed>``. All runs share
every setting except the recipe, the seed and (for recipes that only work with a LoRA adapter,
such as ARCA) the LoRA rank, so they see the same data stream (`PromptSampler` depends only on
`run.seed`), the same rollout budget per step and the same held-out problems. DAPO-style dynamic
sampling draws extra prompts from that stream when a group is uninformative; the table shows the
generation rounds per step so that difference in budget stays visible.

Compare is resumable: a run with a `summary.json` for the planned number of steps is not rerun; an
unfinished run resumes from its last checkpoint. `--collect` only aggregates existing run
directories, grouping them by recipe (recipe.json) and LoRA rank (config.toml).

Outputs in OUT: `compare.md` (the table, the command that made it and the settings),
`compare.json`, `accuracy.png` (held-out accuracy vs step, mean over seeds with a band per
recipe) and `concentration.png` (credit Gini and effective-token ratio vs step, mean over seeds).

Statistics: mean ± sample std (n - 1) over seeds; against the baseline recipe a paired t-test over
the seeds both have, on the final held-out accuracy (two-sided p from the exact Student t
distribution for integer degrees of freedom, Abramowitz & Stegun 26.7.3-4).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokencredit.errors import ConfigError, closest

DEFAULT_RECIPES = "grpo,dapo,dapo+ktae,delta,strace,arca"
METRICS = {"greedy": "eval_greedy_accuracy", "avg": "eval_avg_at_k"}
# Keys that may differ between the runs of one comparison without changing what is compared.
_RUNTIME_KEYS = {"run.threads", "run.progress", "run.device", "run.name", "run.out_dir"}
_FREE_KEYS = _RUNTIME_KEYS | {"run.seed", "algo.recipe"}
# Always listed in compare.md's settings, default or not.
_KEY_SETTINGS = (
    "model.name", "run.steps", "rollout.prompts_per_step", "rollout.group_size", "rollout.max_new_tokens",
    "rollout.temperature", "optim.lr", "data.train", "data.eval", "data.eval_size", "eval.every", "eval.samples",
    "reward.function",
)  # fmt: skip


# ------------------------------------------------------------------------------------------ statistics
def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with integer `df` >= 1, in closed form (A&S 26.7.3-4).

    With theta = atan(|t| / sqrt(df)), c = cos theta, s = sin theta, A(t|df) = P(|T| < |t|) is
    2/pi * (theta + s * (c + 2/3 c^3 + ... + (2*4*...*(df-3)) / (1*3*...*(df-2)) c^(df-2))) for odd
    df (just 2 theta / pi for df = 1) and s * (1 + 1/2 c^2 + ... + (1*3*...*(df-3)) / (2*4*...*(df-2))
    c^(df-2)) for even df. Returns 1 - A.
    """
    if df < 1 or int(df) != df:
        raise ValueError(f"df must be a positive integer, got {df}")
    if math.isnan(t):
        raise ValueError("t is NaN")
    df = int(df)
    theta = math.atan(abs(t) / math.sqrt(df)) if math.isfinite(t) else math.pi / 2
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:
        series, term = 0.0, math.cos(theta)
        for k in range(1, (df - 1) // 2 + 1):
            series += term
            term *= c2 * (2 * k) / (2 * k + 1)
        a = 2 / math.pi * (theta + s * series)
    else:
        series, term = 0.0, 1.0
        for k in range(1, df // 2 + 1):
            series += term
            term *= c2 * (2 * k - 1) / (2 * k)
        a = s * series
    return min(1.0, max(0.0, 1.0 - a))


@dataclass
class PairedTest:
    """Paired t-test of x - y over matched seeds: t = mean(d) / (sd(d) / sqrt(n)), df = n - 1."""

    n: int
    mean_diff: float | None  # None when there is no pair
    t: float | None  # None when n < 2; +-inf when every difference is the same non-zero number
    p: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "mean_diff": self.mean_diff,
            "t": _finite_or_str(self.t),
            "df": self.n - 1,
            "p": self.p,
        }


def paired_t_test(x: list[float], y: list[float]) -> PairedTest:
    """Two-sided paired t-test of x against y (same length, matched by position).

    Fewer than 2 pairs: t and p are None. Zero spread of the differences: p = 1 when they are all
    0 (no difference), else t = +-inf and p = 0 (a constant non-zero shift).
    """
    if len(x) != len(y):
        raise ValueError(f"paired test needs equal lengths, got {len(x)} and {len(y)}")
    d = [float(a) - float(b) for a, b in zip(x, y)]
    n = len(d)
    if n == 0:
        return PairedTest(0, None, None, None)
    mean = math.fsum(d) / n
    if n < 2:
        return PairedTest(n, mean, None, None)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in d) / (n - 1))
    if sd <= 1e-12 * max(1.0, abs(mean)):
        if abs(mean) <= 1e-12:
            return PairedTest(n, mean, 0.0, 1.0)
        return PairedTest(n, mean, math.copysign(math.inf, mean), 0.0)
    t = mean / (sd / math.sqrt(n))
    return PairedTest(n, mean, t, t_two_sided_p(t, n - 1))


def mean_std(values: list[float]) -> dict[str, Any]:
    """Mean, sample std (n - 1; None for one value) and the values; mean None for no values."""
    vals = [float(v) for v in values]
    n = len(vals)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "values": []}
    mean = math.fsum(vals) / n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else None
    return {"n": n, "mean": mean, "std": std, "values": vals}


def steps_to_target(evals: list[dict[str, Any]], key: str, target: float) -> int | None:
    """First evaluated step whose `key` reaches `target` (step 0 is the starting model); None if never."""
    for e in sorted(evals, key=lambda r: r["step"]):
        if key in e and e[key] >= target:
            return int(e["step"])
    return None


def _finite_or_str(v: float | None) -> float | str | None:
    return v if v is None or math.isfinite(v) else ("inf" if v > 0 else "-inf")


# ------------------------------------------------------------------------------------------ reading runs
@dataclass
class RunData:
    """One finished or unfinished trainer run, as read from its directory."""

    run_dir: Path
    recipe: str
    seed: int
    lora_rank: int
    recipe_dict: dict[str, Any]
    config: dict[str, Any]  # flat {"section.key": value}
    evals: list[dict[str, Any]]
    steps: list[dict[str, Any]]  # step records that trained (skipped steps left out)
    skipped_steps: int
    summary: dict[str, Any] | None

    @property
    def finished(self) -> bool:
        return self.summary is not None and int(self.summary.get("steps", -1)) >= int(
            self.config["run.steps"]
        )


def _flat(cfg_dict: dict[str, Any]) -> dict[str, Any]:
    return {f"{sec}.{k}": v for sec, values in cfg_dict.items() for k, v in values.items()}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl; a torn last line (a crash mid-write) is dropped, any other bad line is an error."""
    lines = path.read_text().splitlines() if path.is_file() else []
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines):
                continue
            raise ConfigError(f"{path}:{i}: invalid JSON ({e.msg})") from None
        if not isinstance(rec, dict) or "step" not in rec:
            raise ConfigError(f"{path}:{i}: expected an object with a 'step' field")
        out.append(rec)
    return out


def read_run(run_dir: str | Path) -> RunData:
    """A run directory written by the trainer: config.toml, recipe.json, metrics.jsonl, summary.json."""
    from tokencredit.train.config import load_config

    d = Path(run_dir)
    if not (d / "config.toml").is_file():
        raise ConfigError(f"{d}: no config.toml (not a tokencredit run directory)")
    config = _flat(load_config(d / "config.toml").to_dict())
    recipe_dict = (
        _read_json(d / "recipe.json") if (d / "recipe.json").is_file() else {"name": config["algo.recipe"]}
    )
    records = read_metrics(d / "metrics.jsonl")
    evals = sorted((r for r in records if r.get("type") == "eval"), key=lambda r: r["step"])
    trained = [r for r in records if r.get("type") != "eval" and "skipped" not in r]
    skipped = sum(1 for r in records if r.get("type") != "eval" and "skipped" in r)
    summary = _read_json(d / "summary.json") if (d / "summary.json").is_file() else None
    return RunData(
        d, str(recipe_dict.get("name", config["algo.recipe"])), int(config["run.seed"]), int(config["model.lora_rank"]),
        recipe_dict, config, evals, sorted(trained, key=lambda r: r["step"]), skipped, summary,
    )  # fmt: skip


def expand_run_dirs(paths: list[str]) -> list[Path]:
    """Run directories from --collect: a directory with config.toml, or one whose sub-directories have one."""
    out: list[Path] = []
    for p in map(Path, paths):
        if (p / "config.toml").is_file():
            out.append(p)
        elif p.is_dir() and (subs := sorted(s for s in p.iterdir() if (s / "config.toml").is_file())):
            out += subs
        else:
            raise ConfigError(
                f"--collect {p}: not a run directory (no config.toml in it or its sub-directories)"
            )
    return out


# ------------------------------------------------------------------------------------------ aggregation
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
    labels = [g.label for g in groups]
    if baseline is None:
        baseline = "grpo" if "grpo" in labels else labels[0]
    if baseline not in labels:
        raise ConfigError(
            f"baseline {baseline!r} is not among the recipes compared ({', '.join(labels)}){closest(baseline, labels)}"
        )
    groups.sort(key=lambda g: g.label != baseline)  # baseline first, the others in the order given
    finals = {g.label: {r.seed: final_accuracy(r, key) for r in g.runs} for g in groups}
    base = finals[baseline]
    out_groups = []
    for g in groups:
        per_run = []
        for r in g.runs:
            per_run.append({
                "run_dir": str(r.run_dir),
                "seed": r.seed,
                "steps": int((r.summary or {}).get("steps", len(r.steps) + r.skipped_steps)),
                "final_accuracy": finals[g.label][r.seed],
                "steps_to_target": steps_to_target(r.evals, key, target),
                "response_length": _step_mean(r, "response_length"),
                "tokens_per_s": float((r.summary or {}).get("tokens_per_s") or 0.0) or _step_mean(r, "tokens_per_s"),
                "credit_gini": _step_mean(r, "credit_gini"),
                "credit_eff_ratio": _step_mean(r, "credit_eff_ratio"),
                "gen_rounds": _step_mean(r, "gen_rounds"),
                "skipped_steps": r.skipped_steps,
                "seconds": (r.summary or {}).get("seconds"),
                "final_mean_length": ((r.summary or {}).get("final") or {}).get("eval_mean_length"),
            })  # fmt: skip
        reached = [p["steps_to_target"] for p in per_run if p["steps_to_target"] is not None]
        matched = sorted(set(base) & set(finals[g.label]))
        test = None
        if g.label != baseline:
            test = paired_t_test([finals[g.label][s] for s in matched], [base[s] for s in matched]).to_dict()
            test["seeds"] = matched
        out_groups.append({
            "label": g.label,
            "recipe": g.recipe,
            "lora_rank": g.lora_rank,
            "credit": g.runs[0].recipe_dict.get("credit"),
            "seeds": [r.seed for r in g.runs],
            "final_accuracy": mean_std([p["final_accuracy"] for p in per_run]),
            "steps_to_target": {**mean_std(reached), "reached": len(reached), "of": len(per_run)},
            **{k: mean_std([p[k] for p in per_run if p[k] is not None]) for k in (
                "response_length", "tokens_per_s", "credit_gini", "credit_eff_ratio", "gen_rounds", "seconds")},
            "vs_baseline": test,
            "runs": per_run,
            "curves": {
                "accuracy": _curve(g.runs, "evals", key),
                "credit_gini": _curve(g.runs, "steps", "credit_gini"),
                "credit_eff_ratio": _curve(g.runs, "steps", "credit_eff_ratio"),
            },
        })  # fmt: skip
    common, differing = _settings(runs)
    return {
        "metric": key,
        "target": target,
        "baseline": baseline,
        "settings": common,
        "differing_settings": differing,
        "recipes": out_groups,
    }


def _settings(runs: list[RunData]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(settings shared by every run that matter for the table, {key: {run_dir: value}} for the others)."""
    from tokencredit.train.config import TrainConfig

    defaults = _flat(TrainConfig().to_dict())
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


# ------------------------------------------------------------------------------------------ formatting
def _fmt(stats: dict[str, Any], digits: int = 3) -> str:
    if stats.get("mean") is None:
        return "n/a"
    m = f"{stats['mean']:.{digits}f}"
    return m if stats.get("std") is None else f"{m} ± {stats['std']:.{digits}f}"


def _fmt_p(p: float | None) -> str:
    if p is None:
        return "n/a"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def _fmt_target(st: dict[str, Any]) -> str:
    if not st["reached"]:
        return "not reached"
    s = _fmt(st, digits=0)
    return s if st["reached"] == st["of"] else f"{s} ({st['reached']}/{st['of']} seeds)"


def table_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Column names and rows of the comparison table (shared by the Markdown and the rich table)."""
    base = result["baseline"]
    metric = "greedy" if result["metric"] == METRICS["greedy"] else "avg@k"
    cols = [
        "recipe", "LoRA", "seeds", f"final held-out acc. ({metric})", f"Δ vs {base}", "p (paired t)",
        f"steps to {result['target']:g}", "resp. length", "tokens/s", "credit Gini", "gen. rounds/step",
    ]  # fmt: skip
    rows = []
    for g in result["recipes"]:
        t = g["vs_baseline"]
        if t is None:
            delta, p = "baseline", ""
        elif t["n"] < 2:
            delta = "n/a" if t["n"] == 0 else f"{t['mean_diff']:+.3f}"
            p = f"n/a ({t['n']} matched seed{'s' if t['n'] != 1 else ''})"
        else:
            delta, p = f"{t['mean_diff']:+.3f}", _fmt_p(t["p"])
        rows.append([
            g["label"], f"r={g['lora_rank']}" if g["lora_rank"] else "-", str(len(g["seeds"])),
            _fmt(g["final_accuracy"]), delta, p, _fmt_target(g["steps_to_target"]),
            _fmt(g["response_length"], 1), _fmt(g["tokens_per_s"], 0), _fmt(g["credit_gini"]),
            _fmt(g["gen_rounds"], 2),
        ])  # fmt: skip
    return cols, rows


def markdown(result: dict[str, Any], command: str) -> str:
    """compare.md: the command, the table, the settings and notes, and the two plots."""
    cols, rows = table_rows(result)
    esc = [[c.replace("|", "\\|") for c in row] for row in rows]
    lines = [
        "# tokencredit compare",
        "",
        "Produced by:",
        "",
        "```bash",
        command,
        "```",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(cols))) + "|",
        *("| " + " | ".join(r) + " |" for r in esc),
        "",
        f"Final held-out accuracy: `{result['metric']}` at each run's last evaluation, mean ± sample std over "
        f"seeds. Δ and p: paired t-test (two-sided) against `{result['baseline']}` over the seeds both have. "
        f"Steps to {result['target']:g}: first evaluated step reaching it (resolution = eval.every), mean over "
        "the seeds that reached it. Response length, credit Gini (of |Â| per response) and generation rounds: "
        "means over training steps, then over seeds. tokens/s: response tokens per second of rollout + signals + "
        "update.",
        "",
    ]
    lora = [g for g in result["recipes"] if g["lora_rank"]]
    if lora and len(lora) < len(result["recipes"]):
        lines += [
            "LoRA: " + ", ".join(f"`{g['label']}` (r={g['lora_rank']})" for g in lora)
            + " trained a LoRA adapter; the other recipes fine-tuned all weights (`--lora-rank R` puts every recipe "
            "under the same adapter).",
            "",
        ]  # fmt: skip
    lines += ["Settings shared by every run:", ""]
    lines += [f"- `{k} = {json.dumps(v)}`" for k, v in result["settings"].items()]
    if result["differing_settings"]:
        lines += ["", "**Settings that differ between runs** (the comparison is not on equal terms):", ""]
        for k, vals in result["differing_settings"].items():
            lines.append(
                f"- `{k}`: " + ", ".join(f"{Path(d).name} = {json.dumps(v)}" for d, v in vals.items())
            )
    for title, items in (("Failed runs", result.get("failed")), ("Left out", result.get("left_out"))):
        if items:
            lines += ["", f"**{title}:**", ""] + [f"- `{x['run_dir']}`: {x['reason']}" for x in items]
    lines += ["", "![held-out accuracy](accuracy.png)", "", "![credit concentration](concentration.png)", ""]
    return "\n".join(lines)


def rich_table(result: dict[str, Any]) -> Any:
    from rich.table import Table

    _, rows = table_rows(result)
    cols = ["recipe", "LoRA", "n", "final acc.", "Δ", "p", f"steps→{result['target']:g}", "length", "tok/s",
            "Gini", "rounds"]  # fmt: skip
    t = Table(title=f"tokencredit compare (vs {result['baseline']}; columns as in compare.md)")
    for i, c in enumerate(cols):
        t.add_column(c, justify="left" if i == 0 else "right", overflow="fold")
    for r in rows:
        t.add_row(*r)
    return t


# ------------------------------------------------------------------------------------------ plots
def _smooth(y: list[float], window: int) -> list[float]:
    """Trailing moving average (window 1 = unchanged)."""
    if window <= 1:
        return list(y)
    out, acc = [], 0.0
    for i, v in enumerate(y):
        acc += v
        if i >= window:
            acc -= y[i - window]
        out.append(acc / min(i + 1, window))
    return out


def _colors(n: int) -> list[Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def plot_accuracy(result: dict[str, Any], path: Path, band: str = "std") -> Path:
    """Held-out accuracy vs step: the mean over seeds per recipe, band = ±1 std or min-max over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for g, color in zip(result["recipes"], _colors(len(result["recipes"]))):
        c = g["curves"]["accuracy"]
        if not c["step"]:
            continue
        ax.plot(
            c["step"], c["mean"], marker="o", ms=3, color=color, label=f"{g['label']} (n={len(g['seeds'])})"
        )
        if band == "minmax":
            lo, hi = c["min"], c["max"]
        else:
            lo = [m - s for m, s in zip(c["mean"], c["std"])]
            hi = [m + s for m, s in zip(c["mean"], c["std"])]
        ax.fill_between(c["step"], lo, hi, color=color, alpha=0.15, linewidth=0)
    if result["target"] is not None:
        ax.axhline(result["target"], color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel(result["metric"].removeprefix("eval_").replace("_", " "))
    ax.set_title(f"held-out accuracy (mean over seeds, band = {'min-max' if band == 'minmax' else '±1 std'})")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_concentration(result: dict[str, Any], path: Path, smooth: int = 5) -> Path:
    """Credit Gini and effective-token ratio of |Â| vs step, mean over seeds per recipe (moving average)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    panels = (
        ("credit_gini", "credit Gini of |Â| (0 = uniform)"),
        ("credit_eff_ratio", "effective-token ratio EffN/T"),
    )
    for ax, (key, title) in zip(axes, panels):
        for g, color in zip(result["recipes"], _colors(len(result["recipes"]))):
            c = g["curves"][key]
            if c["step"]:
                ax.plot(c["step"], _smooth(c["mean"], smooth), color=color, label=g["label"])
        ax.set_title(title + (f", moving average over {smooth} steps" if smooth > 1 else ""), fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("credit concentration (mean over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


# ------------------------------------------------------------------------------------------ running
@dataclass
class PlannedRun:
    recipe: str
    seed: int
    run_dir: Path
    cfg: Any  # TrainConfig

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


def plan_runs(args: argparse.Namespace) -> list[PlannedRun]:
    """One TrainConfig per (recipe, seed): the config file, then --set, then the seed, the recipe and the LoRA rank."""
    from tokencredit.recipes import get_recipe, requires_lora
    from tokencredit.train.config import load_config
    from tokencredit.train.trainer import resolve_recipe

    recipes = _split(args.recipes or DEFAULT_RECIPES, "recipes")
    try:
        seeds = [int(s) for s in _split(args.seeds or "0,1,2", "seeds")]
    except ValueError:
        raise ConfigError(f"--seeds expects comma-separated integers, got {args.seeds!r}") from None
    for s in args.set:
        key = s.split("=", 1)[0].strip()
        if key in ("run.seed", "algo.recipe"):
            raise ConfigError(
                f"--set {key}=...: compare sets it per run; use --{'seeds' if 'seed' in key else 'recipes'}"
            )
    for r in recipes:
        get_recipe(r)
    if (args.lora_rank is not None and args.lora_rank < 0) or args.lora_only_rank < 1:
        raise ConfigError("--lora-rank must be >= 0 and --lora-only-rank >= 1")
    out = Path(args.out)
    plans = []
    for r in recipes:
        for s in seeds:
            cfg = load_config(args.config, [*args.set, f"run.seed={s}"], recipe=r)
            if args.lora_rank is not None:
                cfg.model.lora_rank = args.lora_rank
            if cfg.model.lora_rank <= 0 and requires_lora(resolve_recipe(cfg)):
                cfg.model.lora_rank = args.lora_only_rank
            cfg.run.name = f"{r}-s{s}"
            cfg.run.out_dir = str(out / "runs")
            plans.append(PlannedRun(r, s, out / "runs" / cfg.run.name, cfg))
    return plans


def _state(plan: PlannedRun) -> str:
    """'new', 'finished' or 'resume'; a run directory made with other settings is an error."""
    from tokencredit.train.config import load_config

    d = plan.run_dir
    if not (d / "config.toml").is_file():
        return "new"
    old = _flat(load_config(d / "config.toml").to_dict())
    new = _flat(plan.cfg.to_dict())
    free = _RUNTIME_KEYS | {"run.steps"}  # run.steps may grow: the run is extended from its last checkpoint
    diff = [k for k in sorted(set(old) | set(new)) if k not in free and old.get(k) != new.get(k)]
    if diff:
        shown = "; ".join(f"{k}: {old.get(k)!r} there, {new.get(k)!r} now" for k in diff[:4])
        raise ConfigError(
            f"{d} was made with other settings ({shown}); use another --out or remove that run directory"
        )
    if int(old["run.steps"]) > plan.cfg.run.steps:
        raise ConfigError(
            f"{d} was planned for run.steps={old['run.steps']}, more than {plan.cfg.run.steps} now; "
            "use another --out or the same run.steps"
        )
    summary = d / "summary.json"
    if summary.is_file() and int(_read_json(summary).get("steps", -1)) >= plan.cfg.run.steps:
        return "finished"
    return "resume"


def _train_in_process(plan: PlannedRun, resume: bool, console: Any) -> None:
    from tokencredit.train.trainer import Trainer

    trainer = Trainer(plan.cfg, plan.run_dir, resume=resume, console=console)
    try:
        trainer.fit()
    finally:
        trainer.reward_fn.close()
        del trainer
        gc.collect()


def _child_command(plan: PlannedRun, resume: bool) -> list[str]:
    cmd = [sys.executable, "-m", "tokencredit.cli", "train"]
    return cmd + (
        ["--resume", str(plan.run_dir)]
        if resume
        else ["--config", str(plan.run_dir / "config.toml"), "--out", str(plan.run_dir)]
    )


def _run_parallel(todo: list[tuple[PlannedRun, bool]], jobs: int, console: Any) -> dict[str, str]:
    """Run plans as `tokencredit train` subprocesses, `jobs` at a time; {run_dir: error} for the failures.

    Each child reads the planned config from its run directory (written here first), logs to
    RUN_DIR/train.log, and sees this process's import path (so `module:function` rewards resolve)."""
    from tokencredit.train import checkpoint as ckpt
    from tokencredit.train.config import dump_toml

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [p or os.getcwd() for p in sys.path] + [env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    pending, running, failed = list(todo), [], {}
    total, started = len(todo), 0
    try:
        while pending or running:
            while pending and len(running) < jobs:
                plan, resume = pending.pop(0)
                plan.run_dir.mkdir(parents=True, exist_ok=True)
                ckpt.atomic_write_text(plan.run_dir / "config.toml", dump_toml(plan.cfg))
                log = open(plan.run_dir / "train.log", "a")  # noqa: SIM115 - closed when the child ends
                proc = subprocess.Popen(
                    _child_command(plan, resume), stdout=log, stderr=subprocess.STDOUT, env=env
                )
                running.append((plan, proc, log, time.perf_counter()))
                started += 1
                console.print(f"[{started}/{total}] started {plan.name} (pid {proc.pid}) -> {plan.run_dir}")
            time.sleep(0.5)
            for item in list(running):
                plan, proc, log, t0 = item
                if proc.poll() is None:
                    continue
                running.remove(item)
                log.close()
                if proc.returncode == 0:
                    console.print(f"finished {plan.name} in {time.perf_counter() - t0:.0f} s")
                else:
                    tail = (plan.run_dir / "train.log").read_text().strip().splitlines()[-1:] or [""]
                    failed[str(plan.run_dir)] = (
                        f"exit status {proc.returncode}: {tail[0]} (see {plan.run_dir / 'train.log'})"
                    )
                    console.print(f"[red]FAILED {plan.name}: {failed[str(plan.run_dir)]}")
    finally:
        for _plan, proc, log, _ in running:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
            log.close()
    return failed


def execute(plans: list[PlannedRun], jobs: int, console: Any) -> dict[str, str]:
    """Train the plans that are not finished (sequentially in this process, or `jobs` subprocesses);
    returns {run_dir: error} for runs that failed. Configuration errors stop everything."""
    from tokencredit.train.trainer import TrainingError

    states = [(p, _state(p)) for p in plans]
    done = [p for p, s in states if s == "finished"]
    if done:
        console.print(f"{len(done)} of {len(plans)} runs already finished: {', '.join(p.name for p in done)}")
    todo = [(p, s == "resume") for p, s in states if s != "finished"]
    if not todo:
        return {}
    if jobs > 1:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        for p, _ in todo:
            p.cfg.run.progress = False
            if p.cfg.run.threads <= 0:
                p.cfg.run.threads = max(1, cores // jobs)
        return _run_parallel(todo, jobs, console)
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


def command_line(args: argparse.Namespace) -> str:
    """The canonical `tokencredit compare` command for these arguments (written into compare.md)."""
    parts = ["tokencredit", "compare"]
    if args.collect:
        parts += ["--collect", *args.collect]
    else:
        parts += ["--recipes", args.recipes or DEFAULT_RECIPES, "--seeds", args.seeds or "0,1,2"]
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


# ------------------------------------------------------------------------------------------ CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--recipes", help=f"comma-separated recipes (default: {DEFAULT_RECIPES}; see `tokencredit recipes`)"
    )
    parser.add_argument("--seeds", help="comma-separated run seeds (default: 0,1,2)")
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
        choices=("std", "minmax"),
        default="std",
        help="accuracy band: ±1 std (default) or min-max over seeds",
    )
    parser.add_argument(
        "--smooth", type=int, default=5, help="moving-average window of the concentration plot (default 5)"
    )


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    if args.jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {args.jobs}")
    if args.smooth < 1:
        raise ConfigError(f"--smooth must be >= 1, got {args.smooth}")
    if not 0.0 <= args.target <= 1.0:
        raise ConfigError(f"--target is an accuracy in [0, 1], got {args.target}")
    out = Path(args.out)
    failed: dict[str, str] = {}
    left_out: list[dict[str, str]] = []
    if args.collect:
        given = [n for n in ("recipes", "seeds", "config", "lora_rank") if getattr(args, n) is not None]
        given += ["set"] * bool(args.set) + ["jobs"] * (args.jobs != 1)
        if given:
            raise ConfigError(
                f"--collect only aggregates existing runs; --{given[0].replace('_', '-')} does not apply"
            )
        runs = []
        for d in expand_run_dirs(args.collect):
            r = read_run(d)
            if r.finished:
                runs.append(r)
            else:
                left_out.append(
                    {"run_dir": str(d), "reason": "unfinished (no summary.json for its run.steps)"}
                )
    else:
        plans = plan_runs(args)
        failed = execute(plans, args.jobs, console)
        runs = []
        for p in plans:
            if str(p.run_dir) in failed:
                continue
            r = read_run(p.run_dir)
            if r.finished:
                runs.append(r)
            else:
                failed[str(p.run_dir)] = "did not finish"
    for d in left_out:
        console.print(f"[yellow]left out {d['run_dir']}: {d['reason']}")
    result = aggregate(runs, baseline=args.baseline, target=args.target, metric=args.metric)
    result["failed"] = [{"run_dir": d, "reason": why} for d, why in failed.items()]
    result["left_out"] = left_out
    command = command_line(args)
    result["command"] = command
    out.mkdir(parents=True, exist_ok=True)
    plot_accuracy(result, out / "accuracy.png", band=args.band)
    plot_concentration(result, out / "concentration.png", smooth=args.smooth)
    from tokencredit.train.checkpoint import atomic_write_text

    atomic_write_text(out / "compare.md", markdown(result, command))
    atomic_write_text(out / "compare.json", json.dumps(result, indent=2, allow_nan=False))
    console.print(rich_table(result))
    console.print(f"table: {out / 'compare.md'}   plots: {out / 'accuracy.png'}, {out / 'concentration.png'}")
    if failed:
        console.print(f"[red]{len(failed)} run(s) failed: " + ", ".join(failed))
        return 1
    return 0

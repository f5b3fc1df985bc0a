"""The comparison for people: the table (Markdown for compare.md, rich for the terminal), the two
plots, and `write_report`, which puts compare.md, compare.json and the plots in the output directory."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rich.table import Table

from tokencredit.atomic import atomic_write_text
from tokencredit.compare.aggregate import METRICS, MIN_SEEDS
from tokencredit.compare.stats import t_quantile

__all__ = [
    "INTERVAL_NOTE",
    "few_seeds_warning",
    "markdown",
    "plot_accuracy",
    "plot_concentration",
    "plot_differences",
    "rich_table",
    "table_rows",
    "tune_section",
    "write_report",
]

INTERVAL_NOTE = (
    "95% CI: the t-interval of the mean over seeds, cut to [0, 1] (Δ CI: to [-1, 1]); an accuracy cannot "
    "leave that range, so the cut keeps the interval's coverage; n/a for one seed"
)

ACCURACY_PNG, CONCENTRATION_PNG, DIFFERENCES_PNG = "accuracy.png", "concentration.png", "differences.png"


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


def _fmt_test(t: dict[str, Any] | None) -> tuple[str, str]:
    """The Δ and p cells of a paired test against the baseline."""
    if t is None:
        return "baseline", ""
    if t["n"] < 2:
        delta = "n/a" if t["n"] == 0 else f"{t['mean_diff']:+.3f}"
        return delta, f"n/a ({t['n']} matched seed{'s' if t['n'] != 1 else ''})"
    return f"{t['mean_diff']:+.3f}", _fmt_p(t["p"])


def _fmt_work(g: dict[str, Any]) -> str:
    """The work column: total forward-token equivalents per run, with the critic's share when it has one."""
    work, critic = g.get("work_tokens") or {}, g.get("critic_work_tokens") or {}
    if work.get("mean") is None:
        return "n/a"
    text = _fmt(work, 0)
    if critic.get("mean"):
        text += f" (critic {critic['mean'] / work['mean']:.0%})"
    return text


def table_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Column names and rows of the comparison table (shared by the Markdown and the rich table)."""
    base = result["baseline"]
    metric = "greedy" if result["metric"] == METRICS["greedy"] else "avg@k"
    cols = [
        "recipe",
        "LoRA",
        "seeds",
        f"final held-out acc. ({metric})",
        f"Δ vs {base}",
        "p (paired t)",
        f"steps to {result['target']:g}",
        "resp. length",
        "tokens/s",
        "credit Gini",
        "gen. rounds/step",
        "95% CI",
        "Δ 95% CI",
        "p (Holm)",
        "d_z",
        "acc. AUC",
        "Δ AUC",
        "p AUC (Holm)",
        "gen. tokens/run",
        "work/run (fwd-token eq.)",
        "wall s/run",
    ]
    rows = []
    for g in result["recipes"]:
        delta, p = _fmt_test(g["vs_baseline"])
        rows.append(
            [
                g["label"],
                f"r={g['lora_rank']}" if g["lora_rank"] else "-",
                str(len(g["seeds"])),
                _fmt(g["final_accuracy"]),
                delta,
                p,
                _fmt_target(g["steps_to_target"]),
                _fmt(g["response_length"], 1),
                _fmt(g["tokens_per_s"], 0),
                _fmt(g["credit_gini"]),
                _fmt(g["gen_rounds"], 2),
                _fmt_ci(g["final_accuracy"]),
                *_fmt_paired(g["vs_baseline"]),
                _fmt(g.get("accuracy_auc", {})),
                *_fmt_paired(g.get("auc_vs_baseline"), effect=False),
                _fmt(g.get("generated_tokens", {}), 0),
                _fmt_work(g),
                _fmt(g.get("seconds", {}), 0),
            ]
        )
    return cols, rows


def _fmt_ci(stats: dict[str, Any]) -> str:
    if stats.get("lo") is None:
        return "n/a"
    return f"[{stats['lo']:.3f}, {stats['hi']:.3f}]"


def _fmt_paired(t: dict[str, Any] | None, effect: bool = True) -> list[str]:
    """Cells of a paired comparison with the baseline: (Δ 95% CI, Holm p, d_z) or (Δ, Holm p)."""
    if t is None:
        return ["", "", ""] if effect else ["baseline", ""]
    d = t.get("difference") or {}
    holm_p = _fmt_p(t.get("p_holm"))
    if effect:
        d_z = "n/a" if d.get("d_z") is None else f"{d['d_z']:+.2f}"
        return [_fmt_ci(d), holm_p, d_z]
    return ["n/a" if d.get("mean") is None else f"{d['mean']:+.3f}", holm_p]


def _run_names(names: list[str]) -> str:
    """Run directory names, those named RECIPE-sSEED folded per recipe: "grpo s0-s2+s5, oracle s1"."""
    seeds: dict[str, list[int]] = {}
    other = []
    for name in names:
        m = re.fullmatch(r"(.+)-s(\d+)", name)
        if m:
            seeds.setdefault(m.group(1), []).append(int(m.group(2)))
        else:
            other.append(name)
    parts = []
    for recipe, ss in seeds.items():
        ss, spans = sorted(set(ss)), []
        for x in ss:
            if spans and x == spans[-1][1] + 1:
                spans[-1][1] = x
            else:
                spans.append([x, x])
        parts.append(f"{recipe} " + "+".join(f"s{a}" if a == b else f"s{a}-s{b}" for a, b in spans))
    return ", ".join(parts + other)


def few_seeds_warning(result: dict[str, Any]) -> str | None:
    """The warning for recipes compared over fewer than `MIN_SEEDS` seeds, else None."""
    few = [g for g in result["recipes"] if len(g["seeds"]) < MIN_SEEDS]
    if not few:
        return None
    names = ", ".join(f"{g['label']} ({len(g['seeds'])})" for g in few)
    return (
        f"fewer than {MIN_SEEDS} seeds for {names}: the 95% intervals are unreliable (±12.7 standard errors "
        f"for 2 seeds, none for one) and the paired tests have little power; train {MIN_SEEDS} or more seeds per "
        "recipe (--seeds 0,1,2)"
    )


def _notes(result: dict[str, Any]) -> list[str]:
    """compare.md below the table: how to read it, LoRA, the settings, failed and left-out runs, damaged parts."""
    warning = few_seeds_warning(result)
    lines = [f"**Warning:** {warning}.", ""] if warning else []
    lines += [
        f"Final held-out accuracy: `{result['metric']}` at each run's last evaluation, mean ± sample std over "
        f"seeds. {INTERVAL_NOTE}. Δ and p: paired t-test (two-sided) against "
        f"`{result['baseline']}` over the seeds both have; Δ 95% CI: the interval of the paired difference; "
        "p (Holm): Holm's correction across the recipes compared; d_z: mean paired difference / its sd. "
        "acc. AUC: area under the held-out accuracy curve over the run divided by its steps (the mean "
        "accuracy over training: sample efficiency), with the same paired test. gen. tokens/run: tokens "
        "generated (every sampled round, Monte-Carlo continuations included); work/run: the whole compute in "
        "forward-token equivalents: each generated token, each prompt and response token through a forward pass "
        "of the policy (old-policy and reference signals, training), of the reference model or of a learned "
        "critic, and twice each token through a backward pass (about the FLOPs ratio), with the critic's share; "
        "n/a for runs written before the trainer logged its passes; wall s/run: wall time. "
        f"Steps to {result['target']:g}: first evaluated step reaching it (resolution = eval.every), mean over "
        "the seeds that reached it. Response length, credit Gini (of |Â| per response) and generation rounds: "
        "means over training steps, then over seeds. tokens/s: response tokens per second of rollout + signals + "
        "update.",
        "",
    ]
    lora = [g for g in result["recipes"] if g["lora_rank"]]
    if lora and len(lora) < len(result["recipes"]):
        lines += [
            "LoRA: "
            + ", ".join(f"`{g['label']}` (r={g['lora_rank']})" for g in lora)
            + " trained a LoRA adapter; the other recipes fine-tuned all weights (`--lora-rank R` puts every recipe "
            "under the same adapter).",
            "",
        ]
    lines += ["Settings shared by every run:", ""]
    lines += [f"- `{k} = {json.dumps(v)}`" for k, v in result["settings"].items()]
    if result["differing_settings"]:
        lines += [
            "",
            "**Settings that differ between runs** (the comparison is not on equal terms, unless by design: "
            "`--arm` overrides, learning rates chosen by `--tune-lr`):",
            "",
        ]
        for k, vals in result["differing_settings"].items():
            by_value: dict[str, list[str]] = {}
            for d, v in vals.items():
                by_value.setdefault(json.dumps(v), []).append(Path(d).name)
            lines.append(
                f"- `{k}`: "
                + "; ".join(
                    f"{v} in {len(names)} run{'s' * (len(names) > 1)} ({_run_names(names)})"
                    for v, names in by_value.items()
                )
            )
    sections = (
        ("Failed runs", result.get("failed")),
        ("Left out", result.get("left_out")),
        ("Damaged parts skipped (the rest of each run is used)", result.get("damaged")),
    )
    for title, items in sections:
        if items:
            lines += ["", f"**{title}:**", ""] + [f"- `{x['run_dir']}`: {x['reason']}" for x in items]
    return lines


def _fmt_lr_cell(entry: dict[str, Any], chosen: bool) -> str:
    """A cell of the learning-rate table: mean ± sd over the tune seeds, bold and marked when chosen."""
    if entry["failed_seeds"]:
        n = len(entry["failed_seeds"]) + len(entry["seeds"])
        return f"failed ({len(entry['failed_seeds'])}/{n} seeds)"
    cell = _fmt(entry["final_accuracy"])
    return f"**{cell}** ✓" if chosen else cell


def tune_section(tune: dict[str, Any]) -> list[str]:
    """compare.md's "Learning rate chosen on the validation split": a row x learning-rate table of the
    mean final validation accuracy (± sd over the tune seeds), the chosen rate marked, and the rule."""
    lrs = tune["lrs"]
    metric = "greedy" if tune["metric"] == METRICS["greedy"] else "avg@k"
    lines = [
        "## Learning rate chosen on the validation split",
        "",
        f"Final validation accuracy ({metric}), mean ± sd over tune seeds {', '.join(map(str, tune['seeds']))} "
        f'(`data.eval_split = "validation"`: problems disjoint from the training and the held-out ones); '
        f"chosen: {tune['rule']}. The runs above trained with the chosen rate on the held-out split.",
        "",
        "| recipe | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | chosen lr |",
        "|---|" + "---:|" * (len(lrs) + 1),
    ]
    for row in tune["rows"]:
        by_lr = {e["lr"]: e for e in row["lrs"]}
        cells = [_fmt_lr_cell(by_lr[lr], lr == row["chosen"]) if lr in by_lr else "" for lr in lrs]
        lines.append(f"| {row['label']} | " + " | ".join(cells) + f" | {row['chosen']:g} |")
    if tune["failed"]:
        lines += ["", "**Tune runs not counted:**", ""]
        lines += [f"- `{x['run_dir']}`: {x['reason']}" for x in tune["failed"]]
    return lines + [""]


def placebo_section(rows: list[dict[str, Any]]) -> list[str]:
    """compare.md's "Placebo controls": each token-credit recipe R against its placebo rows (`--placebo`)."""
    if not rows:
        return []
    lines = [
        "## Placebo controls: does the placement of credit matter?",
        "",
        "Each placebo keeps R's update size and moves its credit: `permute` moves each response's effective "
        "credit to random positions (same values), `uniform-rms` gives every token the response's RMS credit, "
        "`uniform-mean` its mean credit (same total). Δ = R minus the placebo, paired over seeds (positive: "
        "R's placement does better than random placement of the same credit), with its 95% interval and "
        "Holm's correction across the placebo rows.",
        "",
        "| recipe R | placebo | R − placebo, final [95% CI] | p | Holm p | d_z | R − placebo, AUC | Holm p |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        t, a = r["final"], r["auc"]
        d, da = t.get("difference") or {}, a.get("difference") or {}
        mean = "n/a" if d.get("mean") is None else f"{d['mean']:+.3f} {_fmt_ci(d)}"
        d_z = "n/a" if d.get("d_z") is None else f"{d['d_z']:+.2f}"
        auc = "n/a" if da.get("mean") is None else f"{da['mean']:+.3f}"
        lines.append(
            f"| {r['recipe']} | {r['placebo']} | {mean} | {_fmt_p(t.get('p'))} | {_fmt_p(t.get('p_holm'))} | "
            f"{d_z} | {auc} | {_fmt_p(a.get('p_holm'))} |"
        )
    return lines + [""]


def placebo_table(rows: list[dict[str, Any]]) -> Table:
    """The placebo rows (`placebo_section`) for the terminal."""
    t = Table(title="placebo controls: R − placebo, paired over seeds (Holm across placebo rows)")
    for col in ("recipe R", "placebo", "Δ final [95% CI]", "Holm p", "Δ AUC", "Holm p (AUC)"):
        t.add_column(col, justify="left" if col in ("recipe R", "placebo") else "right")
    for r in rows:
        d, da = r["final"].get("difference") or {}, r["auc"].get("difference") or {}
        t.add_row(
            r["recipe"],
            r["placebo"],
            "n/a" if d.get("mean") is None else f"{d['mean']:+.3f} {_fmt_ci(d)}",
            _fmt_p(r["final"].get("p_holm")),
            "n/a" if da.get("mean") is None else f"{da['mean']:+.3f}",
            _fmt_p(r["auc"].get("p_holm")),
        )
    return t


def markdown(result: dict[str, Any], command: str) -> str:
    """compare.md: the command, the table, the settings and notes, the learning-rate sweep (--tune-lr)
    and the plots."""
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
        *_notes(result),
        "",
        *placebo_section(result.get("placebo") or []),
        *(tune_section(result["tune"]) if result.get("tune") else []),
        f"![held-out accuracy]({ACCURACY_PNG})",
        "",
        f"![paired differences from the baseline]({DIFFERENCES_PNG})",
        "",
        f"![credit concentration]({CONCENTRATION_PNG})",
        "",
    ]
    return "\n".join(lines)


# Terminal columns left out first when the table is wider than the terminal (compare.md keeps them all).
_DROP_ORDER = (
    "tok/s",
    "rounds",
    "length",
    "Gini",
    "tokens",
    "work",
    "LoRA",
    "Δ CI",
    "95% CI",
    "p",
    "Δ AUC",
    "s",
    "d_z",
)


def rich_table(result: dict[str, Any], width: int | None = None) -> Table:
    """The comparison table for the terminal (short column names; the rows of `table_rows`). With a
    `width` (the console's), columns are left out in `_DROP_ORDER` until the rest fits, and the caption
    names them."""
    _, rows = table_rows(result)
    cols = [
        "recipe",
        "LoRA",
        "n",
        "final acc.",
        "Δ",
        "p",
        f"steps→{result['target']:g}",
        "length",
        "tok/s",
        "Gini",
        "rounds",
        "95% CI",
        "Δ CI",
        "p Holm",
        "d_z",
        "AUC",
        "Δ AUC",
        "p AUC",
        "tokens",
        "work",
        "s",
    ]
    keep = list(range(len(cols)))
    need = {i: max([len(cols[i]), *(len(r[i]) for r in rows)]) + 3 for i in keep}  # + borders and padding
    dropped = []
    for name in _DROP_ORDER:
        if width is None or sum(need[i] for i in keep) + 1 <= width:
            break
        keep.remove(cols.index(name))
        dropped.append(name)
    caption = INTERVAL_NOTE + (
        f"; left out for the terminal's width: {', '.join(dropped)} (all in compare.md)" if dropped else ""
    )
    t = Table(
        title=f"tokencredit compare (vs {result['baseline']}; columns as in compare.md)", caption=caption
    )
    for i in keep:
        t.add_column(cols[i], justify="left" if i == 0 else "right", overflow="fold")
    for r in rows:
        t.add_row(*(r[i] for i in keep))
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


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend. Imported here, not at the top: matplotlib is slow to
    import and only the plots need it (reading, aggregating and the tables do not)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colors(n: int) -> list[Any]:
    import matplotlib  # only the plots need matplotlib (see _pyplot)

    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def plot_accuracy(result: dict[str, Any], path: Path, band: str = "std") -> Path:
    """Held-out accuracy vs step: the mean over seeds per recipe, band = ±1 std or min-max over seeds."""
    plt = _pyplot()
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
        elif band == "ci":
            half = [
                t_quantile(0.95, n - 1) * sd / n**0.5 if n > 1 else 0.0 for sd, n in zip(c["std"], c["n"])
            ]
            lo = [max(0.0, m - h) for m, h in zip(c["mean"], half)]  # cut to [0, 1], as the table's intervals
            hi = [min(1.0, m + h) for m, h in zip(c["mean"], half)]
        else:
            lo = [m - s for m, s in zip(c["mean"], c["std"])]
            hi = [m + s for m, s in zip(c["mean"], c["std"])]
        ax.fill_between(c["step"], lo, hi, color=color, alpha=0.15, linewidth=0)
    if result["target"] is not None:
        ax.axhline(result["target"], color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel(result["metric"].removeprefix("eval_").replace("_", " "))
    shown = {"minmax": "min-max", "ci": "95% CI of the mean", "std": "±1 std"}[band]
    ax.set_title(f"held-out accuracy (mean over seeds, band = {shown})")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_differences(result: dict[str, Any], path: Path) -> Path:
    """Paired differences from the baseline with their 95% intervals, one row per recipe: final held-out
    accuracy (left) and accuracy AUC (right), Holm-corrected p beside each; filled markers where
    p (Holm) < 0.05. Readable where a dozen overlapping accuracy bands are not."""
    plt = _pyplot()
    rows = [
        g
        for g in result["recipes"]
        if ((g.get("vs_baseline") or {}).get("difference") or {}).get("mean") is not None
    ]
    rows.sort(key=lambda g: g["vs_baseline"]["difference"]["mean"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 1.2 + 0.38 * max(len(rows), 1)), sharey=True)
    panels = (
        ("vs_baseline", "final held-out accuracy"),
        ("auc_vs_baseline", "accuracy AUC (mean over training)"),
    )
    for ax, (key, title) in zip(axes, panels):
        for y, g in enumerate(rows):
            test = g.get(key) or {}
            d = test.get("difference")
            if not d or d.get("mean") is None:  # no paired seeds for this metric
                continue
            p = test.get("p_holm")
            significant = p is not None and p < 0.05
            has_ci = (
                d.get("lo") is not None and d.get("hi") is not None
            )  # no interval for a constant difference
            ax.errorbar(
                d["mean"],
                y,
                xerr=[[d["mean"] - d["lo"]], [d["hi"] - d["mean"]]] if has_ci else None,
                fmt="o",
                capsize=3,
                color="C3" if significant else "C0",
                mfc="C3" if significant else "white",
            )
            label = "n/a" if p is None else (f"p={p:.3f}" if p >= 0.001 else "p<0.001")
            right = d["hi"] if has_ci else d["mean"]
            ax.annotate(label, (right, y), xytext=(4, 0), textcoords="offset points", va="center", fontsize=7)
        ax.axvline(0.0, color="grey", linewidth=1)
        ax.margins(x=0.18)  # room for the p labels right of the intervals
        ax.set_title(f"{title}: Δ vs {result['baseline']} (95% CI, p Holm)", fontsize=9)
        ax.grid(alpha=0.3, axis="x")
    axes[0].set_yticks(
        range(len(rows)), [f"{g['label']} (n={g['vs_baseline']['n']})" for g in rows], fontsize=8
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_concentration(result: dict[str, Any], path: Path, smooth: int = 5) -> Path:
    """Credit Gini and effective-token ratio of |Â| vs step, mean over seeds per recipe (moving average)."""
    plt = _pyplot()
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


def write_report(result: dict[str, Any], out: Path, *, band: str = "std", smooth: int = 5) -> dict[str, Path]:
    """Write the plots, compare.md (headed by `result["command"]`) and compare.json into `out`; their paths."""
    out = Path(out)
    paths = {
        "accuracy": out / ACCURACY_PNG,
        "concentration": out / CONCENTRATION_PNG,
        "differences": out / DIFFERENCES_PNG,
        "markdown": out / "compare.md",
        "json": out / "compare.json",
    }
    out.mkdir(parents=True, exist_ok=True)
    plot_accuracy(result, paths["accuracy"], band=band)
    plot_differences(result, paths["differences"])
    plot_concentration(result, paths["concentration"], smooth=smooth)
    atomic_write_text(paths["markdown"], markdown(result, result["command"]))
    atomic_write_text(paths["json"], json.dumps(result, indent=2, allow_nan=False))
    return paths

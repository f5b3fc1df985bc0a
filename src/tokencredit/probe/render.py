"""The probe's output: the JSON payload (checked for non-finite numbers) and the Markdown report
(one table per probed point, with --oracle a "Credit fidelity against Monte-Carlo A*" table per
point, with its gradient cosines and headroom index, then an evolution table across points)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokencredit.columns import NA_LORA, MethodSpec
from tokencredit.probe.config import ProbeConfig
from tokencredit.probe.truth import LABELS

__all__ = [
    "code_span",
    "credit_batches_line",
    "evolution_table",
    "fidelity_table",
    "gradient_line",
    "markdown_report",
    "md_text",
    "noise_table",
    "oracle_label",
    "point_table",
    "preconditioned_table",
    "probe_result",
    "write_report",
]


_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|#~&!])")


def md_text(value: Any) -> str:
    """A user string (a model path, a data spec, a method name) as literal Markdown text: its characters that
    Markdown reads as markup (emphasis, code, links, HTML, table cells, headings) backslash-escaped, and its
    line breaks made spaces, so that it can neither format the report nor break a heading or a table row."""
    return _MD_SPECIAL.sub(r"\\\1", " ".join(str(value).splitlines()))


def code_span(value: Any) -> str:
    """`value` as one Markdown code span: fenced by more backticks than any run inside it (padded with a
    space when it starts or ends with one), its line breaks made spaces."""
    text = " ".join(str(value).splitlines())
    fence = "`" * (max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def probe_result(
    command: str, model: str, cfg: ProbeConfig, specs: Sequence[MethodSpec], points: list[dict[str, Any]]
) -> dict[str, Any]:
    """The JSON payload: the command that reproduces it, the settings, the columns and every point's result."""
    return {
        "command": command,
        "model": model,
        "config": cfg.record(),
        "ks": list(cfg.ks),
        "methods": [s.name for s in specs],
        "points": points,
    }


def _pct(x: float | None, se: float | None = None) -> str:
    """A share as a percentage, with ± its standard error when there is one."""
    if x is None:
        return "–"
    return f"{100 * x:.1f}%" if se is None else f"{100 * x:.1f} ± {100 * se:.1f}%"


def _rank(r: dict[str, Any]) -> str:
    if r.get("mean_rank") is None:
        return "–"
    return f"{r['mean_rank']:.1f} ({r['mean_rank_frac']:.2f})"


def _na_text(r: dict[str, Any]) -> str:
    """The cell of a method that was not scored: its reason, escaped (it may quote a user's name)."""
    reason = r.get("reason", "n/a")
    return md_text(reason if reason == NA_LORA else f"n/a ({reason})")


def _row(name: str, r: dict[str, Any], ks: Sequence[int]) -> str:
    if r.get("status", "ok") != "ok":
        text = _na_text(r)
        return f"| {name} | " + " | ".join([text] + [""] * (len(ks) + len(LABELS))) + " |"
    cells = [_pct(r.get(f"blame@{k}"), r.get(f"blame@{k}_se")) for k in ks] + [_rank(r)]
    cells += [_pct(r.get(f"mass_{lab}")) for lab in LABELS]
    return f"| {name} | " + " | ".join(cells) + " |"


def oracle_label(oracle: dict[str, Any]) -> str:
    """The oracle's row name in the tables."""
    return f"*Monte-Carlo oracle (K={oracle['k']})*"


def point_table(point: dict[str, Any], ks: Sequence[int]) -> str:
    """The Markdown table of one probed model: one row per method, then the two chance baselines, and
    the oracle's A* when the point has it."""
    head = (
        "| credit | "
        + " | ".join(f"blame@{k}" for k in ks)
        + " | mean rank (/len) | "
        + " | ".join(f"mass: {lab}" for lab in LABELS)
        + " |"
    )
    sep = "|" + "---|" * (len(ks) + 2 + len(LABELS))
    lines = [head, sep]
    lines += [_row(md_text(name), r, ks) for name, r in point["methods"].items()]
    lines.append(_row("*random (chance)*", point["baselines"]["random"], ks))
    lines.append(_row("*uniform (chance)*", point["baselines"]["uniform"], ks))
    oracle = point.get("oracle")
    if oracle is not None and "checker" in oracle:
        lines.append(_row(oracle_label(oracle), oracle["checker"], ks))
    return "\n".join(lines)


def _rho(x: float | None, se: float | None = None) -> str:
    if x is None:
        return "n/a"
    text = f"{round(x, 3) + 0.0:.3f}"  # + 0.0: no "-0.000"
    return text if se is None else f"{text} ± {se:.3f}"


_GRAD_KEYS = {2: ("oracle", "grpo"), 3: ("oracle", "oracle_corrected", "grpo")}
"""The gradient columns' keys (grad_cos_<key>) by their number: with the noise ceiling, three."""


def _grad_cells(r: dict[str, Any] | None, n: int = 2) -> list[str]:
    """The n gradient columns: cos(g, g*), (noise-corrected,) cos(g, g_GRPO), mean ± SE over batches
    ("–": not computed)."""
    keys = _GRAD_KEYS[n]
    if r is None:
        return ["–"] * n
    cell = {k: _rho(r[f"grad_cos_{k}"], r.get(f"grad_cos_{k}_se")) for k in keys if f"grad_cos_{k}" in r}
    return [cell.get(k, "–") for k in keys]


def _fidelity_row(name: str, r: dict[str, Any], ks: Sequence[int], grads: int = 0) -> str:
    """One row of the fidelity table; `grads`: the number of gradient-cosine columns (0, 2 or 3)."""
    if r.get("status", "ok") != "ok":
        text = _na_text(r)
        return f"| {name} | " + " | ".join([text] + [""] * (len(ks) + 3 + grads)) + " |"
    cells = [_rho(r[k], r.get(f"{k}_se")) for k in ("spearman", "spearman_per_response")]
    cells += [_pct(r[k], r.get(f"{k}_se")) for k in ("sign_agreement", "significant_share")]
    cells += [_pct(r.get(f"oracle_blame@{k}"), r.get(f"oracle_blame@{k}_se")) for k in ks]
    if grads:
        cells += _grad_cells(r if "grad_cos_oracle" in r else None, grads)
    return f"| {name} | " + " | ".join(cells) + " |"


def _reference_cells(gradients: dict[str, Any], ref: str) -> dict[str, Any]:
    """A reference's own gradient cosines (the oracle's A*: 1 with itself) as a row's grad_cos keys."""
    got = gradients["references"][ref]
    return {
        f"grad_cos_{r}{tail}": got[f"cos_{r}"][key]
        for r in ("oracle", "grpo")
        for tail, key in (("", "mean"), ("_se", "se"))
    }


def _cost_text(cost: dict[str, Any]) -> str:
    skipped = (
        ""
        if cost["skipped_share"] is None
        else f"; {_pct(cost['skipped_share'])} of positions skipped by delta"
    )
    return (
        f"{cost['states']:,} states, {cost['continuations']:,} continuations, "
        f"{cost['generated_tokens']:,} generated tokens, {cost['seconds']:.1f} s{skipped}"
    )


def _gradient_columns(oracle: dict[str, Any]) -> int:
    """The fidelity table's gradient columns: 0 (none), 2, or 3 with the noise-corrected cos(g, g*)."""
    g = oracle.get("gradients", {})
    if g.get("status") != "ok":
        return 0
    return 3 if "headroom_corrected" in g else 2


def fidelity_table(oracle: dict[str, Any], ks: Sequence[int]) -> str:
    """The Markdown table "Credit fidelity against Monte-Carlo A*" of one point's "oracle" result: one
    row per method, the chance baselines, and the oracle's cost in its own row; with the point's
    "gradients", the columns cos(g, g*), with the noise ceiling its noise-corrected value ("corrected"),
    and cos(g, g_GRPO) (the oracle's row: A*'s own gradient, no corrected value)."""
    grads = _gradient_columns(oracle)
    names = {0: "", 2: " | cos(g, g*) | cos(g, g_GRPO)", 3: " | cos(g, g*) | corrected | cos(g, g_GRPO)"}
    head = (
        "| credit | ρ pooled | ρ per response | sign agreement | Â mass on significant | "
        + " | ".join(f"blame@{k} vs A*" for k in ks)
        + names[grads]
        + " |"
    )
    lines = [head, "|" + "---|" * (len(ks) + 5 + grads)]
    lines += [_fidelity_row(md_text(name), r, ks, grads) for name, r in oracle["methods"].items()]
    lines.append(_fidelity_row("*random (chance)*", oracle["baselines"]["random"], ks, grads))
    lines.append(_fidelity_row("*uniform (chance)*", oracle["baselines"]["uniform"], ks, grads))
    cells = [f"cost: {_cost_text(oracle['cost'])}"] + [""] * (len(ks) + 3)
    if grads:
        cells += _grad_cells(_reference_cells(oracle["gradients"], "oracle"), grads)
    lines.append(f"| {oracle_label(oracle)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _sizes(values: Sequence[int]) -> str:
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}-{high}"


def _headroom_text(gradients: dict[str, Any]) -> str:
    """The headroom index, with the noise ceiling "(noise-corrected x; split-half reliability of g* r_K,
    from cos(g*_a, g*_b) r_half)" when it was computed."""
    h = gradients["headroom"]
    text = f"**Headroom index 1 - cos(g_GRPO, g*) = {_rho(h['mean'], h['se'])}**"
    c, rel = gradients.get("headroom_corrected"), gradients.get("reliability", {})
    if c is None:
        return text
    full, half = rel["full_k"], rel["split_half"]
    return (
        f"{text} (noise-corrected {_rho(c['mean'], c['se'])}; split-half reliability of g* "
        f"{_rho(full['mean'], full['se'])}, from cos(g*_a, g*_b) = {_rho(half['mean'], half['se'])})"
    )


def _ceiling_text(gradients: dict[str, Any]) -> str:
    """The paragraph on what the noise correction is and assumes (or why there is none; "" in results
    from before it existed)."""
    rel = gradients.get("reliability")
    if rel is None:
        return ""
    if rel["status"] == "n/a":
        return f"No noise correction: {rel['reason']}."
    capped = gradients["headroom_corrected"]["capped"]
    capped += sum(c.get("cos_oracle_corrected", {}).get("capped", 0) for c in gradients["credits"].values())
    return (
        'Noise-corrected (column "corrected"): A* is a Monte-Carlo estimate whose noise lowers every '
        "cosine with g*; per batch, cos(g, g*) / sqrt(r_K) estimates the cosine with the exact A*'s gradient, "
        "r_K = 2 r_half / (1 + r_half) (Spearman-Brown) the reliability of g*, r_half = cos(g*_a, g*_b) "
        f"between the gradients of A* from each half (K/2 = {rel['k_half']}) of the continuations; capped "
        f"at ±1 ({capped} batch value(s) capped); assumes the halves' noises independent and of equal size."
        + (f" Undefined (null) on {rel['reason']}." if rel.get("reason") else "")
    )


def gradient_line(gradients: dict[str, Any]) -> str:
    """The line under the fidelity table: what the gradient cosines are, the headroom index (and its
    noise-corrected value), θ, the cost."""
    if gradients["status"] != "ok":
        return f"Gradient cosines: n/a ({gradients['reason']})."
    return (
        f"Gradient fidelity: cos(g, g*) and cos(g, g_GRPO) are the cosines between the policy gradient "
        f"∇θ Σ Â log π of the method's Â and that of A* (of GRPO's Â) on the same rollouts, at ratio 1 (the "
        f"first mini-batch step's direction, before AdamW's per-coordinate scaling), θ = {gradients['parameters']}; "
        f"mean ± standard error over {gradients['batches']} batches of whole problems "
        f"({_sizes(gradients['groups_per_batch'])} problems, {_sizes(gradients['rollouts_per_batch'])} "
        f"rollouts each). {_headroom_text(gradients)}. "
        f"Cost: {gradients['backward_passes']:,} backward passes, {gradients['seconds']:.1f} s."
    ) + (f"\n\n{ceiling}" if (ceiling := _ceiling_text(gradients)) else "")


def _expected_row(name: str, row: dict[str, Any]) -> str:
    cells = [_rho(row[k]["mean"], row[k]["se"]) for k in ("cos_oracle", "cos_grpo", "signal_share")]
    return f"| {name} | " + " | ".join(cells) + " |"


def expected_table(expected: dict[str, Any]) -> list[str]:
    """The paragraph and table of the cross-batch analysis (`expected.expected_gradients`): per credit,
    cos(E g, E g*), cos(E g, E g_GRPO) and the signal share |E g|^2 / E|g|^2, jackknife SEs; [] for
    results from before it existed."""
    if not expected:
        return []
    if expected["status"] != "ok":
        return ["", f"Expected gradients: n/a ({expected['reason']})."]
    h = expected["headroom"]
    lines = [
        "",
        f"Expected gradients, from the dot products of *different* batches' gradients ({expected['batches']} "
        "batches, delete-one-batch jackknife SEs): batches of different problems are independent, so these "
        "carry no batch noise and no Monte-Carlo noise of A*. cos(E g, E g*): does the credit's update "
        "point, on average, where exact credit's does (a bias repeated at every step when it does not); "
        "signal share |E g|^2 / E|g|^2: how much of one batch's gradient is that average rather than noise. "
        f"**Expected headroom 1 - cos(E g_GRPO, E g*) = {_rho(h['mean'], h['se'])}**.",
        "",
        "| credit | cos(E g, E g*) | cos(E g, E g_GRPO) | signal share |",
        "|---|---|---|---|",
    ]
    lines += [_expected_row(md_text(n), r) for n, r in expected["credits"].items()]
    lines.append(_expected_row(r"*A\* (oracle)*", expected["references"]["oracle"]))
    return lines


def preconditioned_table(pre: dict[str, Any]) -> list[str]:
    """The paragraph and table of the gradient figures in AdamW's metric (`gradients._preconditioned`):
    per credit the per-batch cos(g, g*), cos(E g, E g*), cos(E g, E g_GRPO) and the signal share; [] for
    results from before it existed."""
    if not pre:
        return []
    if pre["status"] != "ok":
        return ["", f"Preconditioned (AdamW) figures: n/a ({pre['reason']})."]
    exp, h = pre["expected"], pre["headroom"]
    eh = exp["headroom"]
    lines = [
        "",
        "In AdamW's preconditioned metric: every gradient mapped g ↦ g / (sqrt(v̂) + eps) before the same cosines "
        f"and signal shares are taken; v̂: {md_text(pre['preconditioner']['description'])}. Headroom index "
        f"{_rho(h['mean'], h['se'])} per batch, expected headroom {_rho(eh['mean'], eh['se'])}.",
        "",
        "| credit (AdamW metric) | cos(g, g*) per batch | cos(E g, E g*) | cos(E g, E g_GRPO) | signal share |",
        "|---|---|---|---|---|",
    ]

    def row(name: str, per: dict[str, Any], ex: dict[str, Any]) -> str:
        cells = [_rho(per["cos_oracle"]["mean"], per["cos_oracle"]["se"])]
        cells += [_rho(ex[k]["mean"], ex[k]["se"]) for k in ("cos_oracle", "cos_grpo", "signal_share")]
        return f"| {name} | " + " | ".join(cells) + " |"

    lines += [row(md_text(n), r, exp["credits"][n]) for n, r in pre["credits"].items()]
    lines.append(row(r"*A\* (oracle)*", pre["references"]["oracle"], exp["references"]["oracle"]))
    return lines


_NOISE_METRICS = {"raw": "raw gradients", "adamw": "AdamW's metric"}
_NOISE_COLUMNS = (
    r"signal | between problems | within problem | A\*'s Monte-Carlo part | cos(E[g\|x], E[g\*\|x]) | "
    r"cos(E[g\|x], E[g_GRPO\|x])"
)


def _noise_row(name: str, d: dict[str, Any], batch: int | None) -> str:
    sh, cx = d["shares"], d["cos_given_x"]
    cells = [_pct(sh[k]["mean"], sh[k]["se"]) for k in ("signal", "between", "within")]
    mc = sh.get("monte_carlo")
    cells.append(_pct(mc["mean"], mc["se"]) if mc is not None else "–")
    cells += [_rho(cx[r]["mean"], cx[r]["se"]) for r in ("oracle", "grpo")]
    if batch:
        b = d["batch_signal_share"]
        cells.append(_pct(b["mean"], b["se"]))
    vs = d.get("vs_grpo")  # absent from reports written before the paired differences
    if vs is not None:
        cells.append(_points(vs["within"]))
        if batch:
            cells.append(_points(vs["batch_signal_share"]))
    return f"| {name} | " + " | ".join(cells) + " |"


def _points(d: dict[str, Any]) -> str:
    """A difference of two shares in percentage points, signed, with ± its standard error."""
    if d.get("mean") is None:
        return "–"
    se = d.get("se")
    return f"{100 * d['mean']:+.1f}" + ("" if se is None else f" ± {100 * se:.1f}") + " pts"


def noise_table(noise: dict[str, Any]) -> list[str]:
    """The paragraph and one table per metric of the noise decomposition (`gradients._noise`): per credit
    the signal, between-problem and within-problem shares of E|g|^2 (A*: its Monte-Carlo part), the
    per-problem cosines with A* and GRPO and the signal share of a training batch; [] when not computed."""
    if not noise:
        return []
    if noise["status"] != "ok":
        return ["", f"Noise decomposition: n/a ({noise['reason']})."]
    n = noise["batch_problems"]
    k_half = noise["k_half"]
    lines = [
        "",
        f"Noise decomposition of one group's gradient g, from two independent groups a, b per problem ({noise['problems']} "
        f"problems, jackknife SEs over {noise['blocks']} blocks): E|g|^2 = |E g|^2 (signal) + between-problem "
        "variance E|E[g|x]|^2 - |E g|^2 + within-problem variance E|g|^2 - E|E[g|x]|^2, each as a share of E|g|^2; "
        "g_a·g_b estimates |E[g|x]|^2, products of different problems |E g|^2. No credit lowers the between-problem "
        "part; only the within-problem part is a credit's to remove. A*'s Monte-Carlo part: |g(A*_1) - g(A*_2)|^2 / 4 "
        + (
            f"from the two halves (K/2 = {k_half}) of its continuations"
            if k_half
            else "(n/a: no split halves)"
        )
        + ", a piece of its within-problem share. cos(E[g|x], ·): the per-problem expected gradients' cosine, "
        "free of within-problem noise."
        + (
            f" Last column: the signal share of a training batch of {n} problems, n s / (1 + (n - 1) s)."
            if n
            else ""
        )
        + " Columns vs GRPO: the credit's within-problem share (and batch signal share) minus GRPO's on the same "
        "problems, paired (the jackknife of the difference); below 0, less within-problem noise than GRPO's."
        + f" Cost: {noise['backward_passes']:,} backward passes, {noise['seconds']:.1f} s.",
    ]
    for metric, by in noise["metrics"].items():
        head = f"| credit ({_NOISE_METRICS.get(metric, metric)}) | {_NOISE_COLUMNS} |"
        cols = 7
        if n:
            head += f" signal share, batch of {n} |"
            cols += 1
        if "vs_grpo" in by["references"]["oracle"]:
            head += " within vs GRPO |" + (" batch share vs GRPO |" if n else "")
            cols += 2 if n else 1
        lines += ["", head, "|" + "---|" * cols]
        lines += [_noise_row(md_text(name), d, n) for name, d in by["credits"].items()]
        lines.append(_noise_row(r"*A\* (oracle)*", by["references"]["oracle"], n))
    return lines


def _fidelity_section(oracle: dict[str, Any], ks: Sequence[int]) -> list[str]:
    """The heading, the summary of what A* was computed on and what it cost, and the table."""
    out = ["", "### Credit fidelity against Monte-Carlo A*", ""]
    if oracle["status"] != "ok":
        return out + [f"n/a: {oracle['reason']}."]
    counts = oracle["baselines"]["uniform"]
    out.append(
        f"A* from K = {oracle['k']} continuations per state (delta {oracle['delta']}, reward: "
        f"{oracle['reward']}) on the {oracle['rollouts']} rollouts of mixed groups: {counts['tokens']:,} "
        f"tokens, {counts['significant_tokens']:,} significant (|A*| > {oracle['z']:g} se); "
        f"{counts['oracle_blame_rollouts']} rollout(s) whose most negative A* is significant "
        f"(blame@k vs A*). Oracle cost: {_cost_text(oracle['cost'])}."
    )
    out += ["", fidelity_table(oracle, ks)]
    if "gradients" in oracle:
        out += [
            "",
            gradient_line(oracle["gradients"]),
            *expected_table(oracle["gradients"].get("expected", {})),
            *preconditioned_table(oracle["gradients"].get("preconditioned", {})),
            *noise_table(oracle["gradients"].get("noise", {})),
        ]
    return out


def _summary_line(point: dict[str, Any]) -> str:
    s = point["rollouts"]
    kinds = ", ".join(f"{k} {v}" for k, v in s["first_error_kinds"].items()) or "none"
    labels = ", ".join(f"{k} {v}" for k, v in s["first_wrong_token_labels"].items()) or "none"
    mean_len = s["mean_length_blamed"]
    return (
        f"{s['rollouts']} rollouts ({s['groups']} held-out problems x {s['rollouts'] // max(1, s['groups'])}), "
        f"accuracy {100 * s['accuracy']:.1f}%, {s['mixed_groups']} mixed groups; "
        f"{s['blame_rollouts']} wrong rollouts scored"
        + (f" (mean length {mean_len:.1f} tokens)" if mean_len is not None else "")
        + f"; first error: {kinds}; first wrong token: {labels}"
        + (
            f"; {s['no_target']} wrong rollouts end before their error (truncated), not scored"
            if s["no_target"]
            else ""
        )
        + "."
    )


def evolution_table(points: Sequence[dict[str, Any]], ks: Sequence[int]) -> str:
    """Methods x probed points: blame@k for the two smallest k, to show how blame accuracy evolves."""
    shown = list(ks[:2])
    head = "| credit | " + " | ".join(md_text(p["label"]) for p in points) + " |"
    lines = [head, "|" + "---|" * (len(points) + 1)]
    names: list[str] = []
    for p in points:
        names += [n for n in p["methods"] if n not in names]

    def cell(r: dict[str, Any] | None) -> str:
        if r is None or r.get("status", "ok") != "ok":
            return "n/a"
        return " / ".join(_pct(r.get(f"blame@{k}")) for k in shown)

    for n in names:
        lines.append(f"| {md_text(n)} | " + " | ".join(cell(p["methods"].get(n)) for p in points) + " |")
    for b in ("random", "uniform"):
        lines.append(f"| *{b} (chance)* | " + " | ".join(cell(p["baselines"][b]) for p in points) + " |")
    return "\n".join(lines)


_FIDELITY_LEGEND = (
    "Credit fidelity: A*_t = V(s_{t+1}) - V(s_t) is each token's true advantage under the probed policy, "
    "estimated from K continuations per state sampled as the rollouts were (tokens of probability >= "
    "1 - delta get A* = 0), on the rollouts of mixed groups, with the rollouts' reward. ρ pooled: Spearman "
    "correlation of Â and A* over all those tokens; ρ per response: the mean of each response's own "
    "correlation; sign agreement: share of the significant tokens (|A*| > 2 standard errors) where Â has "
    "A*'s sign; Â mass on significant: share of the summed |Â| on those tokens; blame@k vs A*: share of "
    "the rollouts whose most negative A* is significant with that token among the k most negatively "
    "credited (expected value under random tie-breaking). The uniform baseline is -1 on every token. "
    "± standard errors: for ρ, sign agreement and Â mass a bootstrap that resamples whole problems "
    "(--bootstrap resamples; a problem's rollouts share their prompt, so they are not independent), "
    "for blame@k the standard error over rollouts."
)


def _data_summary_line(point: dict[str, Any]) -> str:
    s = point["rollouts"]
    return (
        f"{s['rollouts']} rollouts ({s['groups']} problems x {s['rollouts'] // max(1, s['groups'])}), "
        f"accuracy {100 * s['accuracy']:.1f}% (the problems' verifier), {s['mixed_groups']} mixed groups "
        f"({s['mixed_rollouts']} rollouts), mean length {s['mean_length']:.1f} tokens."
    )


def _point_section(point: dict[str, Any], ks: Sequence[int]) -> list[str]:
    """A point's heading, summary line, checker table (synthetic task) and fidelity section (--oracle)."""
    out = ["", f"## {md_text(point['label'])}", ""]
    source = md_text(point["source"])
    if "methods" in point:
        out += [f"{source}. {_summary_line(point)}", "", point_table(point, ks)]
    else:
        out.append(f"{source}. {_data_summary_line(point)}")
    if "credit_batches" in point:
        out += ["", credit_batches_line(point["credit_batches"])]
    mc = point.get("mc_signals")
    if mc:
        out += ["", _mc_columns_line(mc)]
    if "oracle" in point:
        out += _fidelity_section(point["oracle"], ks)
    return out


def credit_batches_line(rec: dict[str, Any]) -> str:
    """What batch every credit was computed on: the training batch's size and where it came from."""
    sizes = _sizes(rec["rollouts_per_batch"])
    if not rec["prompts_per_step"]:
        return f"Credit computed on the whole probe set at once ({sizes} rollouts; --prompts-per-step 0)."
    return (
        f"Credit computed per training batch of {rec['prompts_per_step']} problems ({md_text(rec['source'])}), "
        f"{rec['batches']} batches of {sizes} rollouts, as the trainer computes it per step: a batch "
        "statistic (DelTA, S-trace, the 80/20 mask) is a training batch's."
    )


def _mc_columns_line(mc: dict[str, Any]) -> str:
    """What the oracle / vineppo columns' Monte-Carlo signals were estimated on and what they cost."""
    if not mc.get("rows"):
        return "The oracle / vineppo columns are 0: no rollout of a mixed group to estimate values on."
    return (
        f"The oracle / vineppo columns are Monte-Carlo estimates (the trainer's default settings) on the "
        f"{mc['rows']} rollouts of mixed groups (0 on the others): {mc['states']:,} states, "
        f"{mc['continuations']:,} continuations, {mc['generated_tokens']:,} generated tokens, "
        f"{mc['seconds']:.1f} s."
    )


def _preamble(result: dict[str, Any]) -> list[str]:
    """The title, the command and the legend (the checker's, or the note that only the oracle speaks)."""
    cfg = result["config"]
    if all("methods" in p for p in result["points"]):
        out = [
            "# tokencredit probe: does the credit blame the first wrong token?",
            "",
            code_span(result["command"]),
            "",
            f"blame@k: share of wrong rollouts whose first wrong token is among the k most negatively credited "
            f"tokens (expected value under random tie-breaking); mean rank of that token (1 = most negative; "
            f"rank / length in brackets); |Â| columns: share of the credit mass on each token label (choice: the "
            f"first character of a free-phrasing connective or ending, which also decides whether a step follows "
            f"or a number is complete; free: the rest of that word; tail: the reward-irrelevant letters after the "
            f"answer of the toy-tail tasks). Effective credit "
            f"(per-token gradient weight at ratio 1); sequence advantage "
            f"{md_text(cfg['advantage'])}; task difficulty {cfg['difficulty']}, "
            f"digits {cfg['digits']}, temperature {cfg['temperature']}, seed "
            f"{cfg['seed']}.",
        ]
    else:
        out = [
            f"# tokencredit probe: credit fidelity against Monte-Carlo A* on {md_text(cfg['data'])}",
            "",
            code_span(result["command"]),
            "",
            f"{md_text(cfg['data'])} has no checker truth (no known first wrong token): only the oracle-based metrics "
            f"are reported. Effective credit (per-token gradient weight at ratio 1); sequence advantage "
            f"{md_text(cfg['advantage'])}; temperature {cfg['temperature']}, seed {cfg['seed']}.",
        ]
    if cfg.get("oracle_k", 0) > 0:
        out += ["", _FIDELITY_LEGEND]
    return out


def markdown_report(result: dict[str, Any]) -> str:
    """The whole report as Markdown: the command, one table per probed point (and its fidelity table
    with --oracle), the evolution table."""
    ks = result["ks"]
    out = _preamble(result)
    for p in result["points"]:
        out += _point_section(p, ks)
    if len(result["points"]) > 1 and all("methods" in p for p in result["points"]):
        shown = " / ".join(f"blame@{k}" for k in ks[:2])
        out += ["", f"## Evolution ({shown})", "", evolution_table(result["points"], ks)]
    return "\n".join(out) + "\n"


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        raise ValueError(f"non-finite number in the probe result: {x}")
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def write_report(result: dict[str, Any], markdown: str, out_json: Path) -> Path:
    """Write `result` to `out_json` and `markdown` beside it (.md); returns the Markdown file's path."""
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(_jsonable(result), indent=2) + "\n", encoding="utf-8")
    out_md = out_json.with_suffix(".md")
    out_md.write_text(markdown, encoding="utf-8")
    return out_md

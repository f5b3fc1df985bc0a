"""The probe's output: the JSON payload (checked for non-finite numbers) and the Markdown report
(one table per probed point, with --oracle a "Credit fidelity against Monte-Carlo A*" table per
point, then an evolution table across points)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokencredit.report.methods import NA_LORA, MethodSpec
from tokencredit.report.probe.config import ProbeConfig
from tokencredit.report.probe.truth import LABELS

__all__ = [
    "evolution_table",
    "fidelity_table",
    "markdown_report",
    "oracle_label",
    "point_table",
    "probe_result",
    "write_report",
]


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


def _row(name: str, r: dict[str, Any], ks: Sequence[int]) -> str:
    if r.get("status", "ok") != "ok":
        reason = r.get("reason", "n/a")
        text = reason if reason == NA_LORA else f"n/a ({reason})"
        return f"| {name} | " + " | ".join([text] + [""] * (len(ks) + 3)) + " |"
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
        + " | mean rank (/len) | mass: format | mass: computed | mass: answer |"
    )
    sep = "|" + "---|" * (len(ks) + 5)
    lines = [head, sep]
    lines += [_row(name, r, ks) for name, r in point["methods"].items()]
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


def _fidelity_row(name: str, r: dict[str, Any], ks: Sequence[int]) -> str:
    if r.get("status", "ok") != "ok":
        reason = r.get("reason", "n/a")
        text = reason if reason == NA_LORA else f"n/a ({reason})"
        return f"| {name} | " + " | ".join([text] + [""] * (len(ks) + 3)) + " |"
    cells = [_rho(r[k], r.get(f"{k}_se")) for k in ("spearman", "spearman_per_response")]
    cells += [_pct(r[k], r.get(f"{k}_se")) for k in ("sign_agreement", "significant_share")]
    cells += [_pct(r.get(f"oracle_blame@{k}"), r.get(f"oracle_blame@{k}_se")) for k in ks]
    return f"| {name} | " + " | ".join(cells) + " |"


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


def fidelity_table(oracle: dict[str, Any], ks: Sequence[int]) -> str:
    """The Markdown table "Credit fidelity against Monte-Carlo A*" of one point's "oracle" result: one
    row per method, the chance baselines, and the oracle's cost in its own row."""
    head = (
        "| credit | ρ pooled | ρ per response | sign agreement | Â mass on significant | "
        + " | ".join(f"blame@{k} vs A*" for k in ks)
        + " |"
    )
    lines = [head, "|" + "---|" * (len(ks) + 5)]
    lines += [_fidelity_row(name, r, ks) for name, r in oracle["methods"].items()]
    lines.append(_fidelity_row("*random (chance)*", oracle["baselines"]["random"], ks))
    lines.append(_fidelity_row("*uniform (chance)*", oracle["baselines"]["uniform"], ks))
    cost = f"cost: {_cost_text(oracle['cost'])}"
    lines.append(f"| {oracle_label(oracle)} | " + " | ".join([cost] + [""] * (len(ks) + 3)) + " |")
    return "\n".join(lines)


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
    return out + ["", fidelity_table(oracle, ks)]


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
    head = "| credit | " + " | ".join(p["label"] for p in points) + " |"
    lines = [head, "|" + "---|" * (len(points) + 1)]
    names: list[str] = []
    for p in points:
        names += [n for n in p["methods"] if n not in names]

    def cell(r: dict[str, Any] | None) -> str:
        if r is None or r.get("status", "ok") != "ok":
            return "n/a"
        return " / ".join(_pct(r.get(f"blame@{k}")) for k in shown)

    for n in names:
        lines.append(f"| {n} | " + " | ".join(cell(p["methods"].get(n)) for p in points) + " |")
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
    out = ["", f"## {point['label']}", ""]
    if "methods" in point:
        out += [f"{point['source']}. {_summary_line(point)}", "", point_table(point, ks)]
    else:
        out.append(f"{point['source']}. {_data_summary_line(point)}")
    mc = point.get("mc_signals")
    if mc:
        out += ["", _mc_columns_line(mc)]
    if "oracle" in point:
        out += _fidelity_section(point["oracle"], ks)
    return out


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
            f"`{result['command']}`",
            "",
            f"blame@k: share of wrong rollouts whose first wrong token is among the k most negatively credited "
            f"tokens (expected value under random tie-breaking); mean rank of that token (1 = most negative; "
            f"rank / length in brackets); |Â| columns: share of the credit mass on format / computed / answer "
            f"tokens. Effective credit (per-token gradient weight at ratio 1); sequence advantage "
            f"{cfg['advantage']}; task difficulty {cfg['difficulty']}, "
            f"digits {cfg['digits']}, temperature {cfg['temperature']}, seed "
            f"{cfg['seed']}.",
        ]
    else:
        out = [
            f"# tokencredit probe: credit fidelity against Monte-Carlo A* on {cfg['data']}",
            "",
            f"`{result['command']}`",
            "",
            f"{cfg['data']} has no checker truth (no known first wrong token): only the oracle-based metrics "
            f"are reported. Effective credit (per-token gradient weight at ratio 1); sequence advantage "
            f"{cfg['advantage']}; temperature {cfg['temperature']}, seed {cfg['seed']}.",
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

"""The probe's output: the JSON payload (checked for non-finite numbers) and the Markdown report
(one table per probed point, then an evolution table across points)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tokencredit.report.methods import NA_LORA, MethodSpec
from tokencredit.report.probe.config import ProbeConfig
from tokencredit.report.probe.truth import LABELS

__all__ = ["evolution_table", "markdown_report", "point_table", "probe_result", "write_report"]


def probe_result(
    command: str, model: str, cfg: ProbeConfig, specs: Sequence[MethodSpec], points: list[dict[str, Any]]
) -> dict[str, Any]:
    """The JSON payload: the command that reproduces it, the settings, the columns and every point's result."""
    return {
        "command": command,
        "model": model,
        "config": asdict(cfg),
        "ks": list(cfg.ks),
        "methods": [s.name for s in specs],
        "points": points,
    }


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _rank(r: dict[str, Any]) -> str:
    if r.get("mean_rank") is None:
        return "–"
    return f"{r['mean_rank']:.1f} ({r['mean_rank_frac']:.2f})"


def _row(name: str, r: dict[str, Any], ks: Sequence[int]) -> str:
    if r.get("status", "ok") != "ok":
        reason = r.get("reason", "n/a")
        text = reason if reason == NA_LORA else f"n/a ({reason})"
        return f"| {name} | " + " | ".join([text] + [""] * (len(ks) + 3)) + " |"
    cells = [_pct(r.get(f"blame@{k}")) for k in ks] + [_rank(r)]
    cells += [_pct(r.get(f"mass_{lab}")) for lab in LABELS]
    return f"| {name} | " + " | ".join(cells) + " |"


def point_table(point: dict[str, Any], ks: Sequence[int]) -> str:
    """The Markdown table of one probed model: one row per method, then the two chance baselines."""
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
    return "\n".join(lines)


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


def markdown_report(result: dict[str, Any]) -> str:
    """The whole report as Markdown: the command, one table per probed point, the evolution table."""
    ks = result["ks"]
    out = [
        "# tokencredit probe: does the credit blame the first wrong token?",
        "",
        f"`{result['command']}`",
        "",
        f"blame@k: share of wrong rollouts whose first wrong token is among the k most negatively credited "
        f"tokens (expected value under random tie-breaking); mean rank of that token (1 = most negative; "
        f"rank / length in brackets); |Â| columns: share of the credit mass on format / computed / answer "
        f"tokens. Effective credit (per-token gradient weight at ratio 1); sequence advantage "
        f"{result['config']['advantage']}; task difficulty {result['config']['difficulty']}, "
        f"digits {result['config']['digits']}, temperature {result['config']['temperature']}, seed "
        f"{result['config']['seed']}.",
    ]
    for p in result["points"]:
        out += ["", f"## {p['label']}", "", f"{p['source']}. {_summary_line(p)}", "", point_table(p, ks)]
    if len(result["points"]) > 1:
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

"""The `tokencredit explain` page: a pure function from a `ReportData` structure to one HTML string.

Self-contained: the CSS and the small script (package data, tokencredit/assets/explain/explain.css
and explain.js) are inlined, no network asset. Every number the page shows is also
machine-readable, so tests can compare it with the core without a browser:

- each token is a ``<span class="t" data-t=POS data-a=VALUE>`` inside a
  ``<div class="cell" data-m=METHOD data-r=ROW>``; its background is a diverging colour centred at 0;
- diagnostics cells carry ``data-m``, ``data-k`` (key) and ``data-value``; rank-correlation cells
  carry ``data-a``, ``data-b``, ``data-value`` (empty when undefined) and ``data-rows``;
- a ``<script type="application/json" id="tc-data">`` blob holds per row the tokens, entropy,
  probability, reward, sequence advantage and every method's credit (the hover card reads it), and
  where the task's checker knows it (`marks`) the first wrong token ("first_wrong") and what it says;
- a first wrong token's span also has the class ``fw``; a response's meta cell carries
  ``data-first-wrong`` (its token index) and ``data-wrong-step="1"`` when its answer is right but a
  step is wrong (badge ``rw``); the header's ``<div class="checker">`` counts those responses.

User text (problems, answers, tokens, method names, notes) is escaped, and its bidirectional control
characters (U+202A-U+202E, U+2066-U+2069, U+200E, U+200F, U+061C: `BIDI_CONTROLS`) are shown visibly
as ``⟨U+202E⟩`` and never written raw into the page (in the JSON blob as ``\\u202e`` escapes, the same
data once parsed), so no text can reorder the page; problems and answers are also isolated in ``<bdi>``.
In a token, a control character (tab, newline, ...) is its symbol in an ``<i class="ctl">`` (⇥, ↵, ␛; the
tooltip names it) and a byte that is not part of a whole character is ``<i class="byte">&lt;0xNN&gt;</i>``
(`tokens`): both styled apart from literal text, so a typed "→" or "<0x0A>" never reads as either.
"""

from __future__ import annotations

import html
import json
import math
from functools import cache
from importlib import resources
from typing import Any

from tokencredit.explain.tokens import BYTE_MARK, control_symbol, is_control
from tokencredit.explain.views import GroupView, MethodView, ReportData, ResponseView, StepCheck

__all__ = ["BIDI_CONTROLS", "DIAGNOSTIC_COLUMNS", "build_report", "check_text", "colour", "visible_bidi"]

# characters that reorder the text after them (embeddings, overrides, isolates, marks)
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_BIDI_VISIBLE = str.maketrans({c: f"⟨U+{ord(c):04X}⟩" for c in BIDI_CONTROLS})
_BIDI_ESCAPED = str.maketrans({c: f"\\u{ord(c):04x}" for c in BIDI_CONTROLS})

# (key in MethodView.diagnostics, column header, tooltip)
DIAGNOSTIC_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("credit_gini", "Gini", "weight Gini of |Â| per response (0 = uniform), mean over responses"),
    ("credit_eff_ratio", "EffN/T", "effective-token ratio 1/(T Σw²) of |Â| per response (1 = uniform)"),
    ("credit_high_entropy_share", "high-H share", "share of |Â| mass on the top-20% entropy tokens"),
    ("credit_q_pos_high", "+ / high H", "share of |Â| mass: Â > 0 on high-entropy tokens"),
    ("credit_q_pos_low", "+ / low H", "share of |Â| mass: Â > 0 on low-entropy tokens"),
    ("credit_q_neg_high", "− / high H", "share of |Â| mass: Â < 0 on high-entropy tokens"),
    ("credit_q_neg_low", "− / low H", "share of |Â| mass: Â < 0 on low-entropy tokens"),
    ("credit_sign_flip", "sign flips", "share of tokens whose Â has the opposite sign of their response's A"),
)

_POS = (33, 102, 172)  # blue: credit pushes the token up
_NEG = (178, 24, 43)  # red: credit pushes the token down


# ---------------------------------------------------------------------------------------- helpers
def colour(value: float, scale: float) -> tuple[str, bool]:
    """(css rgb, dark background?) of `value` on a diverging white-centred scale saturating at ±scale."""
    t = 0.0 if not scale > 0 or not math.isfinite(value) else max(-1.0, min(1.0, value / scale))
    base = _POS if t >= 0 else _NEG
    a = abs(t)
    rgb = tuple(round(255 * (1 - a) + c * a) for c in base)
    return f"rgb({rgb[0]},{rgb[1]},{rgb[2]})", a > 0.55


def _num(x: float | None) -> float | None:
    """A float rounded to float32 precision for the JSON blob (None stays None)."""
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.7g}")


def _fmt(x: float | None, digits: int = 3, signed: bool = False) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    s = f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"
    return s.replace("-", "−")


def visible_bidi(s: str) -> str:
    """`s` with each bidirectional control character written out as its code point, e.g. ⟨U+202E⟩
    (`BIDI_CONTROLS`)."""
    return s.translate(_BIDI_VISIBLE)


def _esc(s: Any) -> str:
    """Text for the page, in an element or an attribute: escaped, bidirectional controls made visible."""
    return html.escape(visible_bidi(str(s)), quote=True)


def _char_html(ch: str) -> str:
    """One character of a token: a control character as its symbol in the ``ctl`` style (a newline also
    breaks the line), a bidirectional control as its code point (⟨U+202E⟩), anything else escaped."""
    if ch in BIDI_CONTROLS:
        return f'<i class="ws">⟨U+{ord(ch):04X}⟩</i>'
    if is_control(ch):
        symbol, name = control_symbol(ch)
        return f'<i class="ctl" title="{_esc(name)}">{symbol}</i>' + ("<br>" if ch == "\n" else "")
    return html.escape(ch)


def _token_html(tok: str, byte_marks: bool = False) -> str:
    """A token's text with its control characters visible (`_char_html`), an empty token as ∅; with
    `byte_marks`, each <0xNN> in the ``byte`` style (a byte not part of a whole character, `tokens`)."""
    if tok == "":
        return '<i class="ws">∅</i>'
    if not byte_marks:
        return "".join(_char_html(ch) for ch in tok)
    parts, at = [], 0
    for m in BYTE_MARK.finditer(tok):
        parts.extend(_char_html(ch) for ch in tok[at : m.start()])
        value = int(m.group(1), 16)
        tip = f"byte 0x{m.group(1)}" + ("" if value < 0x80 else ", part of a UTF-8 character")
        parts.append(
            f'<i class="byte" title="{tip}">&lt;0x{m.group(1)}&gt;</i>' + ("<br>" if value == 0x0A else "")
        )
        at = m.end()
    parts.extend(_char_html(ch) for ch in tok[at:])
    return "".join(parts)


def _legend(scale: float, method: str) -> str:
    """A colour bar from -scale to +scale for `method` (the script relabels it on a scale change)."""
    lo, hi = colour(-scale, scale)[0], colour(scale, scale)[0]
    return (
        f'<span class="legend" data-m="{_esc(method)}" title="colour scale of {_esc(method)}">'
        f'<span class="lv">{_esc(_fmt(-scale, 2))}</span>'
        f'<span class="bar" style="background:linear-gradient(90deg,{lo},#fff,{hi})"></span>'
        f'<span class="lv">{_esc(_fmt(scale, 2, signed=True))}</span></span>'
    )


def check_text(c: StepCheck) -> str:
    """What the task's checker says of a response's first error, in words."""
    if c.kind == "correct":
        return "every step and the answer match the reference"
    where = "the answer line" if c.kind == "wrong-final" else f"line {(c.line or 0) + 1}"
    if c.expected is None:
        return "text after the answer line"
    what = {"wrong-step": "a wrong step", "wrong-final": "a wrong answer"}.get(
        c.kind, "not of the task's form"
    )
    past = " (past the last token: truncated)" if c.first_wrong is None else ""
    return f"{where}: {what}; the reference reads {c.expected!r}{past}"


@cache
def _asset(name: str) -> str:
    """A page asset from the package data (tokencredit/assets/explain/NAME), read once."""
    return resources.files("tokencredit").joinpath("assets", "explain", name).read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------- page parts
def _diagnostics_panel(methods: list[MethodView], n_rows: int) -> str:
    head = "".join(f'<th title="{_esc(tip)}">{_esc(label)}</th>' for _, label, tip in DIAGNOSTIC_COLUMNS)
    rows = []
    for m in methods:
        name = f'<td class="name" title="{_esc(m.description)}"><b>{_esc(m.name)}</b></td>'
        if m.skipped:
            rows.append(
                f'<tr data-m="{_esc(m.name)}" class="skipped">{name}'
                f'<td class="skip" colspan="{len(DIAGNOSTIC_COLUMNS)}">skipped: {_esc(m.note)}</td></tr>'
            )
            continue
        cells = []
        for key, _, _ in DIAGNOSTIC_COLUMNS:
            v = m.diagnostics.get(key)
            dv = "" if v is None else repr(float(v))
            cells.append(f'<td data-m="{_esc(m.name)}" data-k="{key}" data-value="{dv}">{_fmt(v)}</td>')
        rows.append(f'<tr data-m="{_esc(m.name)}">{name}{"".join(cells)}</tr>')
    return (
        '<div class="panel" id="diagnostics"><h2>Credit diagnostics</h2>'
        f'<div class="sub">tokencredit.diagnostics over the {n_rows} shown responses; quadrants: sign of Â '
        "× top-20% entropy, as shares of |Â| mass</div>"
        f'<table><tr><th class="name">method</th>{head}</tr>{"".join(rows)}</table></div>'
    )


def _correlation_panel(data: ReportData) -> str:
    names = [m.name for m in data.methods if not m.skipped]
    if len(names) < 2:
        return ""
    head = "".join(f"<th>{_esc(n)}</th>" for n in names)
    rows = []
    for a in names:
        cells = []
        for b in names:
            value, n = (1.0, -1) if a == b else data.correlations.get((a, b), (None, 0))
            if a != b and value is None:
                cells.append(
                    f'<td data-a="{_esc(a)}" data-b="{_esc(b)}" data-value="" data-rows="{n}" '
                    'title="undefined: no response where both credits vary">n/a</td>'
                )
                continue
            bg, dark = colour(value, 1.0)
            style = f"background:{bg};" + ("color:#fff;" if dark else "")
            tip = "" if a == b else f' title="mean Spearman over {n} responses where both vary"'
            cells.append(
                f'<td data-a="{_esc(a)}" data-b="{_esc(b)}" data-value="{float(value)!r}" data-rows="{n}" '
                f'style="{style}"{tip}>{_fmt(value, 2)}</td>'
            )
        rows.append(f'<tr><th class="name">{_esc(a)}</th>{"".join(cells)}</tr>')
    return (
        '<div class="panel" id="correlations"><h2>Rank correlation between methods</h2>'
        '<div class="sub">Spearman per response (diagnostics.rank_correlation), mean over the responses '
        "where both methods' credit varies (n/a: never, e.g. uniform)</div>"
        f'<table class="corr"><tr><th></th>{head}</tr>{"".join(rows)}</table></div>'
    )


def _group_head(g: GroupView, shown: list[MethodView]) -> list[str]:
    """The group's header (problem, answer, stats) and the grid's column headers."""
    n_ok = sum(1 for r in g.responses if r.correct)
    known = any(r.correct is not None for r in g.responses)
    mean_r = sum(r.reward for r in g.responses) / max(1, len(g.responses))
    stats = (f"{n_ok}/{len(g.responses)} correct · " if known else f"{len(g.responses)} responses · ") + (
        f"mean reward {mean_r:.2f}"
    )
    answer = f'<div class="answer">reference answer: <bdi>{_esc(g.answer)}</bdi></div>' if g.answer else ""
    index = (
        f' <span class="sub" title="--group-index {g.index} shows this group">· index {g.index}</span>'
        if g.index is not None
        else ""
    )
    parts = [
        f'<section class="group" data-group="{g.group_id}"><div class="ghead">'
        f'<h2>Group {g.group_id}{index} <span class="sub">· {_esc(stats)}</span></h2>'
        f'<div class="problem"><bdi>{_esc(g.problem)}</bdi></div>{answer}</div>'
        f'<div class="grid" style="--nm:{max(1, len(shown))}">',
        '<div class="mh">response</div>',
    ]
    for m in shown:
        parts.append(
            f'<div class="mh" title="{_esc(m.description)}">{_esc(m.name)} {_legend(m.scale, m.name)}'
            f'<span class="desc">{_esc(m.label)}</span></div>'
        )
    if not shown:
        parts.append('<div class="mh skipnote">every method was skipped (see the notes above)</div>')
    return parts


def _response_meta(k: int, r: ResponseView) -> str:
    """The first cell of a response's line: number, correctness, reward, A, length."""
    mark = (
        '<span class="ok">✓</span>'
        if r.correct
        else ('<span class="bad">✗</span>' if r.correct is not None else "")
    )
    trunc = ' <span class="k">truncated</span>' if r.truncated else ""
    c, attrs, badge, first = r.check, "", "", ""
    if c is not None and c.first_wrong is not None:
        attrs += f' data-first-wrong="{c.first_wrong}"'
        first = f'<br><span class="fwnote" title="{_esc(check_text(c))}">first wrong: token {c.first_wrong}</span>'
    if c is not None and c.right_answer_wrong_step:
        attrs += ' data-wrong-step="1"'
        tip = f"the answer is right (reward {_fmt(r.reward, 2)}) but a step is wrong: {check_text(c)}"
        badge = f' <span class="badge rw" title="{_esc(tip)}">right answer, wrong step</span>'
    return (
        f'<div class="meta" data-r="{r.row}" data-reward="{r.reward!r}" data-advantage="{r.advantage!r}"{attrs}>'
        f"<b>#{k}</b> {mark}{trunc}{badge}<br>"
        f'<span class="k">reward</span> {_fmt(r.reward, 2)}<br>'
        f'<span class="k">A</span> {_fmt(r.advantage, 3, signed=True)}<br>'
        f'<span class="k">{len(r.tokens)} tokens</span>{first}</div>'
    )


def _credit_cell(r: ResponseView, m: MethodView) -> str:
    """One method's credit on one response: a coloured span per token."""
    vals = m.credit[r.row]  # type: ignore[index]
    cm = f"Gini {_fmt(m.row_gini.get(r.row), 2)}"
    if m.seq_advantages is not None and abs(m.seq_advantages[r.row] - r.advantage) > 1e-6:
        cm += f" · A {_fmt(m.seq_advantages[r.row], 3, signed=True)}"
    spans = []
    first_wrong = r.check.first_wrong if r.check is not None else None
    for t, (tok, v) in enumerate(zip(r.tokens, vals)):
        bg, dark = colour(v, m.scale)
        cls = "t" + (" d" if dark else "") + (" sp" if r.special and r.special[t] else "")
        cls += " fw" if t == first_wrong else ""
        spans.append(
            f'<span class="{cls}" data-t="{t}" data-a="{_num(v)!r}" '
            f'style="background:{bg}">{_token_html(tok, bool(r.byte_marks and r.byte_marks[t]))}</span>'
        )
    return (
        f'<div class="cell" data-m="{_esc(m.name)}" data-r="{r.row}"><span class="cm">{cm}</span>'
        f"{''.join(spans)}</div>"
    )


def _group_html(g: GroupView, methods: list[MethodView]) -> str:
    shown = [m for m in methods if not m.skipped]
    parts = _group_head(g, shown)
    for k, r in enumerate(g.responses, 1):
        parts.append(_response_meta(k, r))
        parts.extend(_credit_cell(r, m) for m in shown)
        if not shown:
            parts.append("<div></div>")
    parts.append("</div></section>")
    return "".join(parts)


def _blob(data: ReportData) -> str:
    rows: dict[str, Any] = {}
    for g in data.groups:
        for k, r in enumerate(g.responses, 1):
            rows[str(r.row)] = {
                "group": g.group_id,
                "label": f"#{k} of group {g.group_id}",
                "tokens": r.tokens,
                "reward": _num(r.reward),
                "advantage": _num(r.advantage),
                "correct": r.correct,
                "first_wrong": r.check.first_wrong if r.check is not None else None,
                "checker": check_text(r.check) if r.check is not None else None,
                "entropy": None if r.entropy is None else [_num(x) for x in r.entropy],
                "prob": None if r.prob is None else [_num(x) for x in r.prob],
                "credit": {
                    m.name: [_num(x) for x in m.credit[r.row]]
                    for m in data.methods
                    if not m.skipped  # type: ignore[index]
                },
            }
    shown = [m for m in data.methods if not m.skipped]
    payload = {
        "title": data.title,
        "methods": [
            {
                "name": m.name,
                "label": m.label,
                "skipped": m.skipped,
                "note": m.note,
                "scale": _num(m.scale),
                "diagnostics": {k: _num(v) for k, v in m.diagnostics.items()},
            }
            for m in data.methods
        ],
        "shared_scale": _num(max([m.scale for m in shown], default=1.0)),
        "correlations": [
            {"a": a, "b": b, "value": v, "rows": n} for (a, b), (v, n) in sorted(data.correlations.items())
        ],
        "rows": rows,
    }
    # "<" escaped as \\u003c: the JSON can never close the script element it lives in; bidirectional controls
    # as \\u escapes: the same data once parsed, but none raw in the page's source
    text = json.dumps(payload, ensure_ascii=False, allow_nan=False).replace("<", "\\u003c")
    return text.translate(_BIDI_ESCAPED)


def _checker_line(data: ReportData) -> str:
    """The header's legend of the checker's marks and its count of right answers through a wrong step
    (empty when the checker knows no shown response; the notes then say why)."""
    checked = [r.check for g in data.groups for r in g.responses if r.check is not None]
    if not checked:
        return ""
    n = sum(c.right_answer_wrong_step for c in checked)
    return (
        f'<div class="checker" data-wrong-steps="{n}" data-checked="{len(checked)}">the task\'s checker · '
        f'<span class="badge rw">right answer, wrong step</span> <b>{n}</b> of the {len(checked)} checked '
        'responses shown · <span class="fwkey">7</span> first wrong token, where the response first departs '
        "from the reference solution (hover it for what the checker says)</div>"
    )


def build_report(data: ReportData) -> str:
    """The whole page for `data`, deterministic (its only I/O: the packaged CSS/JS, read once)."""
    n_rows = sum(len(g.responses) for g in data.groups)
    notes = "".join(f"<li>{_esc(n)}</li>" for n in data.notes)
    controls = (
        '<div class="controls">colour = the credit Â each token receives: <b style="color:rgb(33,102,172)">blue</b> '
        'positive (pushed up), <b style="color:rgb(178,24,43)">red</b> negative, white 0; each method on its own '
        'scale, saturating at its largest |Â| (legend above each column) · <label><input type="checkbox" '
        'id="shared"> one shared scale</label> · hover a token for its entropy, probability and every method\'s Â</div>'
    )
    body = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_esc(data.title)}</title><style>\n{_asset('explain.css')}</style></head><body>",
        f"<header><h1>{_esc(data.title)}</h1>",
        f'<div class="sub">{_esc(data.subtitle)}</div>' if data.subtitle else "",
        f'<ul class="notes">{notes}</ul>' if notes else "",
        controls,
        _checker_line(data),
        "</header><main>",
        f'<div class="panels">{_diagnostics_panel(data.methods, n_rows)}{_correlation_panel(data)}</div>',
        *(_group_html(g, data.methods) for g in data.groups),
        '</main><div id="tip"></div>',
        f'<script type="application/json" id="tc-data">{_blob(data)}</script>',
        f"<script>\n{_asset('explain.js')}</script></body></html>",
    ]
    return "\n".join(b for b in body if b)

"""The `tokencredit explain` page: a pure function from a `ReportData` structure to one HTML string.

Self-contained: inline CSS and a small inline script, no network asset. Every number the page
shows is also machine-readable, so tests can compare it with the core without a browser:

- each token is a ``<span class="t" data-t=POS data-a=VALUE>`` inside a
  ``<div class="cell" data-m=METHOD data-r=ROW>``; its background is a diverging colour centred at 0;
- diagnostics cells carry ``data-m``, ``data-k`` (key) and ``data-value``; rank-correlation cells
  carry ``data-a``, ``data-b``, ``data-value`` (empty when undefined) and ``data-rows``;
- a ``<script type="application/json" id="tc-data">`` blob holds per row the tokens, entropy,
  probability, reward, sequence advantage and every method's credit (the hover card reads it).
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DIAGNOSTIC_COLUMNS",
    "GroupView",
    "MethodView",
    "ReportData",
    "ResponseView",
    "build_report",
    "colour",
]

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


@dataclass
class ResponseView:
    """One completion: its batch row, display tokens and per-token signals (None when unavailable)."""

    row: int
    tokens: list[str]
    reward: float
    advantage: float
    correct: bool | None = None
    truncated: bool = False
    entropy: list[float] | None = None
    prob: list[float] | None = None
    special: list[bool] | None = None  # True for special tokens (EOS...), drawn muted


@dataclass
class GroupView:
    group_id: int
    problem: str
    responses: list[ResponseView]
    answer: str | None = None


@dataclass
class MethodView:
    """One column. credit[row] is the per-token credit shown for batch row `row` (None when skipped)."""

    name: str
    label: str
    description: str = ""
    credit: dict[int, list[float]] | None = None
    seq_advantages: dict[int, float] | None = None
    row_gini: dict[int, float | None] = field(default_factory=dict)
    diagnostics: dict[str, float | None] = field(default_factory=dict)
    scale: float = 1.0
    note: str = ""

    @property
    def skipped(self) -> bool:
        return self.credit is None


@dataclass
class ReportData:
    title: str
    groups: list[GroupView]
    methods: list[MethodView]
    correlations: dict[tuple[str, str], tuple[float | None, int]] = field(default_factory=dict)
    subtitle: str = ""
    notes: list[str] = field(default_factory=list)


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


def _esc(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _token_html(tok: str) -> str:
    """Visible whitespace: newline as ↵ plus a line break, tab as →, empty token as ∅."""
    if tok == "":
        return '<i class="ws">∅</i>'
    parts = []
    for ch in tok:
        if ch == "\n":
            parts.append('<i class="ws">↵</i><br>')
        elif ch == "\t":
            parts.append('<i class="ws">→</i>')
        elif ch == "\r":
            parts.append('<i class="ws">␍</i>')
        else:
            parts.append(html.escape(ch))
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


# ---------------------------------------------------------------------------------------- page parts
_CSS = """
:root{--fg:#1d232b;--mut:#6a737d;--line:#d9dee4;--bg:#f6f7f9;--card:#fff}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
header{padding:14px 22px 10px;background:var(--card);border-bottom:1px solid var(--line)}
h1{font-size:19px;margin:0 0 2px}
h2{font-size:15px;margin:0}
.sub{color:var(--mut);font-size:13px}
.notes{margin:6px 0 0;padding-left:18px;color:#5a4a00;font-size:12px}
.notes li{margin:1px 0}
main{padding:12px 22px 40px}
.panels{display:flex;flex-wrap:wrap;gap:14px;align-items:flex-start;margin-bottom:14px}
.panel{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 12px}
.panel h2{margin-bottom:2px}
.panel .sub{max-width:430px;margin-bottom:6px}
table{border-collapse:collapse;font-size:12.5px}
th,td{padding:3px 8px;text-align:right;border-bottom:1px solid #eef0f3;white-space:nowrap}
th{font-weight:600;color:#444;border-bottom:1px solid var(--line)}
td.name,th.name{text-align:left}
td.skip{text-align:left;color:var(--mut);font-style:italic;white-space:normal;max-width:520px}
.corr td{text-align:center;min-width:58px}
.controls{font-size:12.5px;color:var(--mut);margin-top:6px}
.group{background:var(--card);border:1px solid var(--line);border-radius:8px;margin:0 0 16px;overflow:hidden}
.ghead{padding:8px 12px;border-bottom:1px solid var(--line);background:#fbfcfd}
.problem{white-space:pre-wrap;max-height:5.2em;overflow:auto;margin-top:3px;font-size:13px}
.answer{color:var(--mut);font-size:12.5px}
.grid{display:grid;grid-template-columns:118px repeat(var(--nm),minmax(0,1fr))}
.grid>div{padding:5px 8px;border-bottom:1px solid #eef0f3;border-left:1px solid #eef0f3;min-width:0}
.grid>.mh{background:#fbfcfd;font-weight:600;font-size:12.5px;position:sticky;top:0;z-index:1}
.mh .desc{font-weight:400;color:var(--mut);font-size:11.5px;display:block}
.meta{font-size:12px;color:#333;border-left:0!important}
.meta .ok{color:#1a7f37;font-weight:700}.meta .bad{color:#b42318;font-weight:700}
.meta .k{color:var(--mut)}
.cell{font:12.5px/1.55 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;white-space:pre-wrap;overflow-wrap:anywhere}
.cell .cm{display:block;font:11px system-ui,sans-serif;color:var(--mut);margin-bottom:1px}
.t{border-radius:2px;padding:0 .5px;cursor:default}
.t.d{color:#fff}
.t.sp{font-style:italic;opacity:.85}
.t.hl{outline:2px solid #111;outline-offset:0}
.ws{color:#8a929a;font-style:normal}
.t.d .ws{color:#e8eef5}
.legend{display:inline-flex;align-items:center;gap:4px;font:11px system-ui,sans-serif;color:var(--mut);font-weight:400}
.legend .bar{display:inline-block;width:70px;height:9px;border:1px solid #ccd;border-radius:2px}
#tip{position:fixed;display:none;z-index:10;background:#fff;border:1px solid #aab;border-radius:6px;
 box-shadow:0 4px 14px rgba(0,0,0,.15);padding:7px 9px;font-size:12.5px;pointer-events:none;max-width:400px}
#tip .tk{font:13px ui-monospace,Menlo,Consolas,monospace;background:#f0f2f5;padding:0 4px;border-radius:3px}
#tip table{margin-top:4px}#tip td{padding:1px 6px;border:0}#tip td:first-child{text-align:left}
#tip tr.cur td{font-weight:700}
.skipnote{color:var(--mut);font-style:italic;font-size:12px}
"""

_JS = """
(function(){
  var D = JSON.parse(document.getElementById('tc-data').textContent);
  var tip = document.getElementById('tip'), lit = [];
  function f(x, d, s){ if (x === null || x === undefined) return 'n/a';
    var v = x.toFixed(d); if (s && x >= 0) v = '+' + v; return v.replace('-', '\\u2212'); }
  function td(tr, text){ var c = document.createElement('td'); c.textContent = text; tr.appendChild(c); }
  function show(s, ev){
    var cell = s.parentNode, r = cell.getAttribute('data-r'), t = +s.getAttribute('data-t');
    var m = cell.getAttribute('data-m'), row = D.rows[r];
    tip.textContent = '';
    var head = document.createElement('div'), tk = document.createElement('span');
    tk.className = 'tk'; tk.textContent = JSON.stringify(row.tokens[t]); head.appendChild(tk);
    head.appendChild(document.createTextNode('  token ' + t + ' of response ' + row.label));
    tip.appendChild(head);
    var info = document.createElement('div');
    info.textContent = 'entropy ' + f(row.entropy ? row.entropy[t] : null, 3) +
      '  ·  probability ' + f(row.prob ? row.prob[t] : null, 3) +
      '  ·  A ' + f(row.advantage, 3, true) + '  ·  reward ' + f(row.reward, 2);
    tip.appendChild(info);
    var tb = document.createElement('table');
    D.methods.forEach(function(me){
      if (!row.credit[me.name]) return;
      var tr = document.createElement('tr'); if (me.name === m) tr.className = 'cur';
      td(tr, me.name); td(tr, 'Â ' + f(row.credit[me.name][t], 4, true)); tb.appendChild(tr);
    });
    tip.appendChild(tb);
    lit.forEach(function(x){ x.classList.remove('hl'); });
    lit = Array.prototype.slice.call(document.querySelectorAll('.cell[data-r="' + r + '"] .t[data-t="' + t + '"]'));
    lit.forEach(function(x){ x.classList.add('hl'); });
    tip.style.display = 'block'; move(ev);
  }
  function move(ev){
    var w = tip.offsetWidth, h = tip.offsetHeight, x = ev.clientX + 14, y = ev.clientY + 14;
    if (x + w > window.innerWidth - 4) x = ev.clientX - w - 10;
    if (y + h > window.innerHeight - 4) y = ev.clientY - h - 10;
    tip.style.left = Math.max(2, x) + 'px'; tip.style.top = Math.max(2, y) + 'px';
  }
  document.addEventListener('mouseover', function(ev){
    var s = ev.target.closest ? ev.target.closest('.t') : null;
    if (s) show(s, ev); else { tip.style.display = 'none'; lit.forEach(function(x){ x.classList.remove('hl'); }); lit = []; }
  });
  document.addEventListener('mousemove', function(ev){ if (tip.style.display === 'block') move(ev); });
  function paint(shared){
    var scales = {}; D.methods.forEach(function(me){ scales[me.name] = shared ? D.shared_scale : me.scale; });
    document.querySelectorAll('.cell').forEach(function(c){
      var sc = scales[c.getAttribute('data-m')];
      c.querySelectorAll('.t').forEach(function(s){
        var v = +s.getAttribute('data-a'), t = sc > 0 ? Math.max(-1, Math.min(1, v / sc)) : 0;
        var b = t >= 0 ? [33,102,172] : [178,24,43], a = Math.abs(t);
        s.style.background = 'rgb(' + b.map(function(q){ return Math.round(255 * (1 - a) + q * a); }).join(',') + ')';
        s.classList.toggle('d', a > 0.55);
      });
    });
    document.querySelectorAll('.legend[data-m]').forEach(function(l){
      var sc = scales[l.getAttribute('data-m')], v = l.querySelectorAll('.lv');
      v[0].textContent = f(-sc, 2); v[1].textContent = f(sc, 2, true);
    });
  }
  var box = document.getElementById('shared');
  if (box) box.addEventListener('change', function(){ paint(box.checked); });
})();
"""


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


def _group_html(g: GroupView, methods: list[MethodView]) -> str:
    shown = [m for m in methods if not m.skipped]
    n_ok = sum(1 for r in g.responses if r.correct)
    known = any(r.correct is not None for r in g.responses)
    mean_r = sum(r.reward for r in g.responses) / max(1, len(g.responses))
    stats = (f"{n_ok}/{len(g.responses)} correct · " if known else f"{len(g.responses)} responses · ") + (
        f"mean reward {mean_r:.2f}"
    )
    answer = f'<div class="answer">reference answer: {_esc(g.answer)}</div>' if g.answer else ""
    parts = [
        f'<section class="group" data-group="{g.group_id}"><div class="ghead">'
        f'<h2>Group {g.group_id} <span class="sub">· {_esc(stats)}</span></h2>'
        f'<div class="problem">{_esc(g.problem)}</div>{answer}</div>'
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
    for k, r in enumerate(g.responses, 1):
        mark = (
            '<span class="ok">✓</span>'
            if r.correct
            else ('<span class="bad">✗</span>' if r.correct is not None else "")
        )
        trunc = ' <span class="k">truncated</span>' if r.truncated else ""
        parts.append(
            f'<div class="meta" data-r="{r.row}" data-reward="{r.reward!r}" data-advantage="{r.advantage!r}">'
            f"<b>#{k}</b> {mark}{trunc}<br>"
            f'<span class="k">reward</span> {_fmt(r.reward, 2)}<br>'
            f'<span class="k">A</span> {_fmt(r.advantage, 3, signed=True)}<br>'
            f'<span class="k">{len(r.tokens)} tokens</span></div>'
        )
        for m in shown:
            vals = m.credit[r.row]  # type: ignore[index]
            cm = f"Gini {_fmt(m.row_gini.get(r.row), 2)}"
            if m.seq_advantages is not None and abs(m.seq_advantages[r.row] - r.advantage) > 1e-6:
                cm += f" · A {_fmt(m.seq_advantages[r.row], 3, signed=True)}"
            spans = []
            for t, (tok, v) in enumerate(zip(r.tokens, vals)):
                bg, dark = colour(v, m.scale)
                cls = "t" + (" d" if dark else "") + (" sp" if r.special and r.special[t] else "")
                spans.append(
                    f'<span class="{cls}" data-t="{t}" data-a="{_num(v)!r}" '
                    f'style="background:{bg}">{_token_html(tok)}</span>'
                )
            parts.append(
                f'<div class="cell" data-m="{_esc(m.name)}" data-r="{r.row}"><span class="cm">{cm}</span>'
                f"{''.join(spans)}</div>"
            )
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
    # "<" escaped as \\u003c: the JSON can never close the script element it lives in
    return json.dumps(payload, ensure_ascii=False, allow_nan=False).replace("<", "\\u003c")


def build_report(data: ReportData) -> str:
    """The whole page for `data` (no I/O, deterministic)."""
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
        f"<title>{_esc(data.title)}</title><style>{_CSS}</style></head><body>",
        f"<header><h1>{_esc(data.title)}</h1>",
        f'<div class="sub">{_esc(data.subtitle)}</div>' if data.subtitle else "",
        f'<ul class="notes">{notes}</ul>' if notes else "",
        controls,
        "</header><main>",
        f'<div class="panels">{_diagnostics_panel(data.methods, n_rows)}{_correlation_panel(data)}</div>',
        *(_group_html(g, data.methods) for g in data.groups),
        '</main><div id="tip"></div>',
        f'<script type="application/json" id="tc-data">{_blob(data)}</script>',
        f"<script>{_JS}</script></body></html>",
    ]
    return "\n".join(b for b in body if b)

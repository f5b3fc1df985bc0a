"""A static picture of the explain page's credit (`tokencredit explain --png FILE`): for papers, slides and
docs, and where no browser is at hand to screenshot the HTML page.

One block per shown group (the first `max_groups`): its problem, then per response a line of its
tokens for every method that computed credit, each token's box coloured by its Â on the page's
diverging scale (`render.colour`: blue pushes the token up, red down, white 0; one shared scale, the
largest |Â| of the shown methods' 99th percentiles, so methods compare by colour). Long responses wrap.
Where the task's checker knows it (`marks`), the first wrong token is boxed in orange and a right answer
reached through a wrong step is said on the response's line, as on the page.
Drawn with matplotlib (Agg); text is the display tokens, control characters as the page's symbols (⇥ tab,
↵ newline, `tokens.control_symbol`); a token holding one, or a byte mark <0xNN>, is drawn in violet italics,
apart from literal text (a token is one text box, so the whole token takes the style).
Every string is drawn literally: maths parsing and TeX are off (``parse_math=False, usetex=False``), so
"$5 and $" or "$\\begin{pmatrix}..." is its characters, never italic maths or a mathtext error; a
bidirectional control character is written as ⟨U+202E⟩, as on the page. At most `MAX_BOXES` token boxes
(a few seconds of drawing) and `MAX_ROWS` lines (a height an image viewer opens) are drawn; the last line
then says how many token boxes were left out.
The file is written whole or not at all (`output.write_whole`).
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

from tokencredit.explain.output import write_whole
from tokencredit.explain.render import colour, visible_bidi
from tokencredit.explain.tokens import control_symbol, is_control
from tokencredit.explain.views import GroupView, MethodView, ReportData

__all__ = ["MAX_BOXES", "MAX_ROWS", "draw_png"]

MAX_ROWS = 600  # lines drawn at most: 600 x _LINE in x 130 dpi is about 25,000 pixels high
MAX_BOXES = 4000  # token boxes drawn at most (matplotlib draws about 500 a second)
_MAX_TOKEN_CHARS = 40  # a longer token's text is cut (with "…") so that its box fits a line
_LITERAL = {"parse_math": False, "usetex": False}  # every string drawn as its characters

_WIDTH_CHARS = 110  # characters per wrapped line
_LINE = 0.32  # inches per line of text
_CHAR_W = 1.0 / _WIDTH_CHARS
_FIRST_WRONG = "#f76707"  # the page's first-wrong-token colour (explain.css)

_MARKED = "#7048e8"  # text colour of a token with a control character or a byte mark
Token = tuple[str, float | None, bool, bool]  # display text, Â, first wrong token?, control / byte marked?


def _visible(tok: str, byte_marks: bool) -> tuple[str, bool]:
    """(text drawn, marked?) of a display token: control characters as their symbols, bidi controls visible."""
    text = "".join(control_symbol(ch)[0] if is_control(ch) else ch for ch in tok)
    marked = byte_marks or any(is_control(ch) for ch in tok)
    return visible_bidi(text) or "∅", marked


def _lines(g: GroupView, shown: list[MethodView]) -> list[tuple[str, list[Token]]]:
    """(label, [(token text, Â, first wrong?)]) per drawn line: the problem, then each response under each method."""
    problem = visible_bidi(" ".join(g.problem.split()))
    out: list[tuple[str, list[Token]]] = [(f"group {g.group_id}: {problem[:100]}", [])]
    for k, r in enumerate(g.responses, 1):
        tick = "" if r.correct is None else (" ✓" if r.correct else " ✗")
        flag = (
            " · right answer, wrong step" if r.check is not None and r.check.right_answer_wrong_step else ""
        )
        out.append((f"#{k} reward {r.reward:.2f}{tick}, A {r.advantage:+.2f}{flag}", []))
        marks = r.byte_marks or [False] * len(r.tokens)
        toks = [_visible(t, b) for t, b in zip(r.tokens, marks)]
        first_wrong = r.check.first_wrong if r.check is not None else None
        for m in shown:
            vals = m.credit[r.row]  # type: ignore[index]
            out.append(
                (m.name, [(t, v, j == first_wrong, k) for j, ((t, k), v) in enumerate(zip(toks, vals))])
            )
    return out


# label, [(text, Â, first wrong?, marked?, x)]
Row = tuple[str, list[tuple[str, float | None, bool, bool, float]]]


def _rows(lines: list[tuple[str, list[Token]]]) -> list[Row]:
    """The drawn lines: each token line wrapped at _WIDTH_CHARS characters (the label column takes 16), a
    token's text cut to `_MAX_TOKEN_CHARS`; at most `MAX_BOXES` token boxes and `MAX_ROWS` lines, the last
    line then saying how much was left out."""
    rows: list[Row] = []
    boxes = 0
    total = sum(len(toks) for _, toks in lines)
    for label, toks in lines:
        if len(rows) >= MAX_ROWS - 1 or boxes >= MAX_BOXES:
            break
        if not toks:
            rows.append((label, []))
            continue
        x, row = 0.0, []
        for text, val, wrong, marked in toks:
            if boxes >= MAX_BOXES or len(rows) >= MAX_ROWS - 1:
                break
            if len(text) > _MAX_TOKEN_CHARS:
                text = text[: _MAX_TOKEN_CHARS - 1] + "…"
            w = len(text) + 0.4
            if x + w > _WIDTH_CHARS - 16 and row:
                rows.append((label, row))
                label, x, row = "", 0.0, []
            row.append((text, val, wrong, marked, x))
            x += w
            boxes += 1
        rows.append((label, row))
    if boxes < total:
        rows.append((f"... {total - boxes} more token boxes not drawn (the HTML page shows them all)", []))
    return rows


def draw_png(data: ReportData, path: str | Path, max_groups: int = 1) -> Path:
    """Write the picture of `data`'s first `max_groups` groups to `path` (PNG); returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [m for m in data.methods if not m.skipped]
    scale = max([m.scale for m in shown], default=1.0)
    rows = _rows([line for g in data.groups[:max_groups] for line in _lines(g, shown)])
    first_wrong = any(wrong for _, toks in rows for _, _, wrong, _, _ in toks)
    fig = plt.figure(figsize=(13, _LINE * (len(rows) + 2)))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 1)
    ax.set_ylim(len(rows) + 1.5, 0)
    ax.axis("off")
    key = " · orange box: first wrong token (the task's checker)" if first_wrong else ""
    title = f"{visible_bidi(data.title)}: Â per token, colour scale ±{scale:.2g} (blue +, red −){key}"
    ax.text(0.005, 0.6, title, fontsize=9, weight="bold", **_LITERAL)
    for i, (label, toks) in enumerate(rows, start=1):
        y = i + 0.5
        ax.text(
            0.005,
            y,
            label,
            fontsize=7.5,
            va="center",
            family="monospace",
            weight="bold" if not toks else None,
            **_LITERAL,
        )
        for text, val, wrong, marked, x in toks:
            fill = "rgb(255,255,255)" if val is None else colour(val, scale)[0]
            rgb = tuple(int(c) / 255 for c in fill[4:-1].split(","))
            x0 = (16 + x) * _CHAR_W
            edge = {"edgecolor": _FIRST_WRONG, "linewidth": 1.6} if wrong else {"edgecolor": "none"}
            ax.text(
                x0,
                y,
                text,
                fontsize=7.5,
                va="center",
                family="monospace",
                **({"color": _MARKED, "style": "italic"} if marked else {}),
                bbox={"boxstyle": "square,pad=0.12", "facecolor": rgb, **edge},
                **_LITERAL,
            )
    buf = io.BytesIO()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Glyph .* missing from")  # drawn as a box, as expected
            fig.savefig(buf, dpi=130, format="png")
    finally:
        plt.close(fig)
    return write_whole(Path(path), buf.getvalue(), "--png")

"""The front pages stay true: README.md, BENCHMARKS.md, the findings, guide and experiment pages, and
examples/core.py.

- README.md is short, starts with the install + main job and test commands, says on its first screen
  what the project found (linking docs/findings.md), and links the other pages;
- examples/core.py runs, and the README's code block of the core example is a part of it (and runs
  on its own), so the two cannot drift apart;
- BENCHMARKS.md is one table of current figures: one line per figure, each with its command and a link
  to its record;
- the user-facing pages name no internal issue numbers (they say what changed instead);
- every relative link (and image) in those pages points at a file of the repository, and every
  #anchor at a heading of its page.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BENCHMARKS = ROOT / "BENCHMARKS.md"
CHANGELOG = ROOT / "CHANGELOG.md"
FINDINGS = ROOT / "docs" / "findings.md"
CORE = ROOT / "examples" / "core.py"
DOCS = ROOT / "docs"
# The pages written for users: what they read first, the findings, the guide and every experiment's record.
USER_PAGES = (
    README,
    BENCHMARKS,
    CHANGELOG,
    FINDINGS,
    DOCS / "getting-started.md",
    *sorted((DOCS / "guide").glob("*.md")),
    *sorted((DOCS / "experiments").glob("*.md")),
)
LINKED_PAGES = (*USER_PAGES, DOCS / "inputs.md")
MAX_README_LINES = 220
FIRST_SCREEN = 25  # lines of the README a reader sees before scrolling
MAX_CELL = 120  # characters of a BENCHMARKS.md cell other than its command: a figure, not a paragraph
ISSUE_NUMBER = re.compile(r"\bissues?\s*#?\d+|#\d{2,}\b", re.IGNORECASE)

FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CELL_SPLIT = re.compile(r"(?<!\\)\|")


# -- markdown helpers -----------------------------------------------------------------------------


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks."""
    out, in_fence = [], False
    for i, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            in_fence = not in_fence
            continue
        if not in_fence:
            out.append((i, line))
    return out


def _code_blocks(text: str) -> list[tuple[str, int, str]]:
    """(language, first line number, body) of every fenced code block."""
    blocks, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i].strip())
        if m:
            lang = lines[i].strip()[3:].strip()
            body, j = [], i + 1
            while j < len(lines) and not lines[j].strip().startswith(m.group(1)):
                body.append(lines[j])
                j += 1
            blocks.append((lang, i + 1, "\n".join(body)))
            i = j + 1
        else:
            i += 1
    return blocks


def _headings(text: str) -> list[tuple[int, int, str]]:
    """(line number, level, text) of the ATX headings outside code blocks."""
    out = []
    for i, line in _prose_lines(text):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m:
            out.append((i, len(m.group(1)), m.group(2)))
    return out


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def _anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, _, heading in _headings(text):
        base = _slug(heading)
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def _split_row(line: str) -> list[str]:
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return [c.strip() for c in CELL_SPLIT.split(inner)]


def _is_separator(line: str) -> bool:
    cells = _split_row(line)
    return bool(cells) and all(re.fullmatch(r":?-{3,}:?", c) for c in cells)


def _tables(text: str) -> list[tuple[int, list[str], list[list[str]]]]:
    """(line number of the header, header cells, data rows) of every pipe table outside code blocks."""
    lines = _prose_lines(text)
    tables = []
    k = 0
    while k + 1 < len(lines):
        (i, head), (_, sep) = lines[k], lines[k + 1]
        if head.strip().startswith("|") and _is_separator(sep):
            rows = []
            k += 2
            while k < len(lines) and lines[k][1].strip().startswith("|"):
                rows.append(_split_row(lines[k][1]))
                k += 1
            tables.append((i, _split_row(head), rows))
        else:
            k += 1
    return tables


def _section(text: str, title_contains: str) -> str:
    """The text of the first section whose heading contains `title_contains`, up to the next heading
    of the same or a higher level."""
    lines = text.splitlines()
    heads = _headings(text)
    for n, (line_no, level, title) in enumerate(heads):
        if title_contains in title:
            end = next((ln for ln, lv, _ in heads[n + 1 :] if lv <= level), len(lines) + 1)
            return "\n".join(lines[line_no : end - 1])
    raise AssertionError(f"no heading containing {title_contains!r}")


def _normalise(code: str) -> str:
    return "\n".join(line.rstrip() for line in code.strip("\n").splitlines())


def _core_block() -> str:
    blocks = [
        b for lang, _, b in _code_blocks(_section(_read(README), "examples/core.py")) if lang == "python"
    ]
    assert len(blocks) == 1, f"the README's core section should hold one python block, found {len(blocks)}"
    return blocks[0]


def _python_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


# -- the helpers themselves ------------------------------------------------------------------------


def test_markdown_helpers_on_a_sample():
    sample = (
        '# Top\n\nSee [a](x.md) and ![b](img/c.png "t") and [d](#top).\n\n'
        "| recipe | x |\n|---|---:|\n| `a`, `b` | 1 \\| 2 |\n| `c` (note) | 3 |\n\n"
        "```bash\n# not a heading\n[not](a-link.md)\n| no | table |\n|---|---|\n```\n"
        "## Why A+B: `c.py` (2026)\n"
    )
    assert [h for _, _, h in _headings(sample)] == ["Top", "Why A+B: `c.py` (2026)"]
    assert _anchors(sample) == {"top", "why-ab-cpy-2026"}
    assert [LINK.findall(line) for _, line in _prose_lines(sample) if LINK.search(line)] == [
        ["x.md", "img/c.png", "#top"]
    ]
    (_, header, rows), *rest = _tables(sample)
    assert not rest and header == ["recipe", "x"]
    assert rows == [["`a`, `b`", "1 \\| 2"], ["`c` (note)", "3"]]


# -- README ----------------------------------------------------------------------------------------


def test_readme_is_short():
    n = len(_read(README).splitlines())
    assert n <= MAX_README_LINES, (
        f"README.md has {n} lines (at most {MAX_README_LINES}); move detail to docs/ (findings, guide, experiments)"
    )


def test_readme_starts_with_install_and_test_commands():
    lang, line_no, body = _code_blocks(_read(README))[0]
    assert line_no <= 5, f"the README's first code block starts on line {line_no}; it should open the page"
    assert 'pip install torch==2.13.0 && pip install -e ".[test]" && tokencredit train' in body, body
    assert "python -m pytest -q" in body, body


def test_readme_links_the_other_pages():
    targets = {t.split("#")[0] for _, line in _prose_lines(_read(README)) for t in LINK.findall(line)}
    wanted = {
        "docs/getting-started.md",
        "docs/findings.md",
        "docs/guide/train.md",
        "docs/guide/explain.md",
        "docs/guide/compare.md",
        "docs/guide/probe.md",
        "docs/guide/eval.md",
        "docs/experiments/index.md",
        "docs/methods.md",
        "docs/integrations.md",
        "docs/extending.md",
        "BENCHMARKS.md",
    }
    assert not wanted - targets, f"README.md does not link {sorted(wanted - targets)}"


def test_readme_first_screen_says_what_the_project_found():
    """The headline result is on the first screen, above the feature list, and links its evidence."""
    lines = _read(README).splitlines()[:FIRST_SCREEN]
    first = "\n".join(lines)
    assert any("docs/findings.md" in t for line in lines for t in LINK.findall(line)), (
        f"README.md's first {FIRST_SCREEN} lines do not link docs/findings.md"
    )
    for phrase in ("GRPO", "rollouts"):
        assert phrase in first, (
            f"README.md's first {FIRST_SCREEN} lines do not say what was found ({phrase!r})"
        )


def test_readme_points_at_the_recipe_listing_instead_of_a_table():
    """The recipes are listed by `tokencredit recipes` and docs/methods.md, not by a table to keep in step."""
    text = _read(README)
    assert "`tokencredit recipes`" in text, "README.md does not point at `tokencredit recipes`"
    tables = [t for t in _tables(text) if t[1] and t[1][0].lower() == "recipe"]
    assert not tables, (
        f"README.md has a recipe table again (line {tables[0][0]}); point at `tokencredit recipes`"
    )


# -- the core example ------------------------------------------------------------------------------


def _run_python(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """This interpreter on `args` in `cwd` (the project's environment), within 60 s."""
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=60, env=_python_env()
    )


def test_core_example_runs(tmp_path):
    proc = _run_python([str(CORE)], tmp_path)
    assert proc.returncode == 0, f"examples/core.py failed:\n{proc.stdout}\n{proc.stderr}"
    for expected in ("A (GRPO", "loss", "gradient norm", "credit_gini", "gives the same"):
        assert expected in proc.stdout, f"examples/core.py output lacks {expected!r}:\n{proc.stdout}"


def test_core_example_makes_the_core_calls():
    source = _read(CORE)
    for call in (
        "advantages.grpo(",
        "credit.compute(",
        "recipes.token_credit(",
        "objectives.clipped_token_loss(",
        "objectives.aggregate(",
        "diagnostics.summary(",
    ):
        assert call in source, f"examples/core.py does not call {call[:-1]}"


def test_readme_core_block_is_part_of_examples_core():
    block = _normalise(_core_block())
    assert len(block.splitlines()) >= 5, f"the README's core example is too short to be the example:\n{block}"
    for call in (
        "advantages.grpo(",
        "objectives.clipped_token_loss(",
        "objectives.aggregate(",
        "diagnostics.",
    ):
        assert call in block, f"the README's core example does not show {call[:-1]}"
    assert "credit.compute(" in block or "token_credit(" in block, "the README's core example shows no credit"
    assert block in _normalise(_read(CORE)), (
        "the README's core example is not a verbatim part of examples/core.py; copy the block from the file:\n"
        + block
    )


def test_readme_core_block_runs_on_its_own(tmp_path):
    proc = _run_python(["-c", _core_block()], tmp_path)
    assert proc.returncode == 0, f"the README's core example does not run as shown:\n{proc.stderr}"


# -- BENCHMARKS.md ---------------------------------------------------------------------------------


def test_benchmarks_is_one_table_of_current_figures():
    """BENCHMARKS.md: a title, a short intro, then the table; nothing after it. Every row is one figure
    with its command and a link to the experiment page that records how it was measured."""
    text = _read(BENCHMARKS)
    heads = _headings(text)
    assert [level for _, level, _ in heads] == [1], (
        f"BENCHMARKS.md should be one table, has sections {heads[1:]}"
    )
    tables = _tables(text)
    assert len(tables) == 1, f"BENCHMARKS.md should hold one table, holds {len(tables)}"
    table_line, header, rows = tables[0]
    prose = [(i, line) for i, line in _prose_lines(text) if line.strip() and not line.startswith(("#", "|"))]
    assert all(i < table_line for i, _ in prose), "BENCHMARKS.md has text after its table"
    assert len(prose) <= 6, f"BENCHMARKS.md's intro is {len(prose)} lines; the table is the page"
    columns = [h.lower() for h in header]
    for name in ("measurement", "figure", "command", "record"):
        assert name in columns, f"the BENCHMARKS.md table has no {name!r} column: {header}"
    command, record = columns.index("command"), columns.index("record")
    assert len(rows) >= 10, f"the table has {len(rows)} rows"
    for row in rows:
        assert len(row) == len(header), f"row with {len(row)} cells for {len(header)} columns: {row}"
        assert row[command].startswith("`"), f"row without its command: {row[0]!r}"
        assert "docs/experiments/" in row[record], f"row {row[0]!r} does not link its record: {row[record]!r}"
        for i, cell in enumerate(row):
            if i not in (command, record):
                assert len(cell) <= MAX_CELL, f"a paragraph in a cell of row {row[0]!r}: {cell!r}"


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_pages_name_no_internal_issue_numbers(page):
    found = [
        f"{page.name}:{i}: {m.group(0)!r}"
        for i, line in _prose_lines(_read(page))
        for m in ISSUE_NUMBER.finditer(line)
    ]
    assert not found, "internal issue numbers (say what changed instead):\n" + "\n".join(found)


# -- links -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", LINKED_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    text = _read(page)
    broken, checked = [], 0
    for line_no, line in _prose_lines(text):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                continue
            checked += 1
            path_part, _, anchor = target.partition("#")
            where = f"{page.relative_to(ROOT)}:{line_no}: {target}"
            dest = (page.parent / path_part).resolve() if path_part else page
            if ROOT not in dest.parents and dest != ROOT:
                broken.append(f"{where} (outside the repository)")
            elif not dest.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(_read(dest)):
                broken.append(f"{where} (no heading with anchor #{anchor})")
    assert checked, f"{page.name}: no relative links found; the link parser is broken"
    assert not broken, "broken links:\n" + "\n".join(broken)

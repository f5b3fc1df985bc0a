"""Every reference in the repository stays inside it and resolves (issue 28).

Scans the source, tests, docs, examples, benchmarks, README.md and BENCHMARKS.md for
(a) paths that leave the repository (a relative path into a sibling ``shared`` folder, an absolute
    path of the machine the project was developed on);
(b) citations of a Markdown file (a bare file name or a relative path, with an optional ``#anchor``)
    that does not exist in the repository; bare names resolve against the citing file's folder, the
    repository root, docs/ and docs/spec/. In Python files under tests/ only comments and docstrings
    count: other string literals there are synthetic test data;
(c) relative Markdown links in the Markdown pages (docs/*.md, docs/spec/*.md, README.md,
    BENCHMARKS.md) whose target or ``#anchor`` does not resolve.
Each failure names the file and the line. The method notes that code and tests cite live in
docs/spec/ (see docs/methods.md#method-notes).
"""

from __future__ import annotations

import functools
import importlib.util
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = (
    "src",
    "tests",
    "docs",
    "examples",
    "benchmarks",
    "README.md",
    "BENCHMARKS.md",
    "CHANGELOG.md",
    "CONTRIBUTING.md",
)
SUFFIXES = {".py", ".md", ".toml", ".sh", ".txt", ".yaml", ".yml", ".cfg", ".ini", ".rst"}
SKIP_PARTS = {"__pycache__", ".pytest_cache", ".ruff_cache"}
MAX_BYTES = 2_000_000
# Files tokencredit itself writes (a report's output name), not citations of a page.
OUTPUT_NAMES = {"compare.md", "probe.md"}
# Folders runs write into (git-ignored): a path under one records where a run put its report, and
# exists only on the machine that made it, so it is not a citation the repository must hold.
OUTPUT_DIRS = {"runs"}
# The documentation site's page generator: its strings are the site's page paths (relative to each
# generated page), not citations; the pages it writes exist in the site, so a link to one resolves.
GENERATOR = Path("docs", "gen_pages.py")
# Bare file names are looked up here (besides the citing file's own folder).
BARE_DIRS = ("", "docs", "docs/spec")

# Built from pieces so that this file does not match its own patterns.
_SHARED = r"\.\./" + "shared"
_MACHINE_ROOTS = "|".join(("work", "home", "root", "Users", "mnt"))
OUTSIDE_RE = re.compile(rf"{_SHARED}\b[^\s'\"`)]*|(?<![\w.~-])/(?:{_MACHINE_ROOTS})/[\w.-][^\s'\"`)]*")
MD_REF_RE = re.compile(r"(?<![\w/.-])((?:\.{1,2}/)*(?:[\w.-]+/)*[\w-][\w.-]*\.md)(?:#([\w-]+))?(?![\w/])")
LINK_RE = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE_RE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN_RE = re.compile(r"`+[^`\n]*`+")
LINE_BREAKS = set("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")  # what str.splitlines splits on
HEADING_RE = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def scanned_files(root: Path = ROOT) -> Iterator[Path]:
    for name in SCANNED:
        top = root / name
        paths = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        for p in paths:
            rel = p.relative_to(root).parts
            if (
                p.is_file()
                and p.suffix in SUFFIXES
                and not SKIP_PARTS.intersection(rel)
                and not any(part.endswith(".egg-info") for part in rel)
                and p.stat().st_size <= MAX_BYTES
                and p.relative_to(root) != GENERATOR
            ):
                yield p


@functools.cache
def generated_pages(root: Path = ROOT) -> frozenset[Path]:
    """The pages docs/gen_pages.py writes into the site at `mkdocs build` (as paths under docs/)."""
    if not (root / GENERATOR).is_file():
        return frozenset()
    spec = importlib.util.spec_from_file_location("gen_pages", root / GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return frozenset((root / "docs" / page).resolve() for page in module.all_pages())


def _generated(path: Path, root: Path) -> bool:
    return root == ROOT and path.resolve() in generated_pages(root)


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, markup and punctuation dropped, spaces -> '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading anchor of a Markdown text (duplicates numbered -1, -2, ... as GitHub does)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    in_fence = False
    for line in markdown.splitlines():
        if FENCE_RE.match(line):
            in_fence = not in_fence
            continue
        m = None if in_fence else HEADING_RE.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def _anchor_problem(target: Path, anchor: str | None) -> str | None:
    if not anchor or target.suffix != ".md":
        return None
    if anchor not in anchors(target.read_text(encoding="utf-8")):
        return f"has no heading with anchor #{anchor}"
    return None


def resolve_citation(ref: str, citing: Path, root: Path = ROOT) -> Path | None:
    """The existing file a cited `*.md` path means, or None."""
    if ref.startswith(("./", "../")):
        candidates = [citing.parent / ref]
    elif "/" in ref:
        candidates = [citing.parent / ref, root / ref]
    else:
        candidates = [citing.parent / ref, *(root / d / ref for d in BARE_DIRS)]
    for c in candidates:
        if c.is_file() and _inside(c, root):
            return c
    return None


def prose_only(source: str) -> str:
    """Python `source` with every string literal that is not a docstring blanked (newlines kept).

    A docstring here is a string literal that is a statement of its own (module, class, function
    docstrings and bare strings); comments stay as they are.
    """
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return source
    fs_start, fs_end = getattr(tokenize, "FSTRING_START", -1), getattr(tokenize, "FSTRING_END", -1)
    skip = {tokenize.NL, tokenize.COMMENT}
    units: list[tuple[bool, tuple[int, int], tuple[int, int], int]] = []  # (is_string, start, end, type)
    depth, begin = 0, (0, 0)
    for tok in toks:
        if tok.type == fs_start:
            begin = tok.start if depth == 0 else begin
            depth += 1
        elif tok.type == fs_end:
            depth -= 1
            if depth == 0:
                units.append((True, begin, tok.end, tokenize.STRING))
        elif depth == 0 and tok.type not in skip:
            units.append((tok.type == tokenize.STRING, tok.start, tok.end, tok.type))
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    chars = list(source)
    statement_edges = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    for i, (is_string, start, end, _) in enumerate(units):
        if not is_string:
            continue
        before = units[i - 1][3] if i > 0 else tokenize.NEWLINE
        after = units[i + 1][3] if i + 1 < len(units) else tokenize.ENDMARKER
        if before in statement_edges and after in statement_edges:
            continue  # a docstring
        a, b = starts[start[0] - 1] + start[1], starts[end[0] - 1] + end[1]
        for k in range(a, b):
            if chars[k] not in LINE_BREAKS:
                chars[k] = " "
    return "".join(chars)


def _strip_code(line: str) -> str:
    return CODE_SPAN_RE.sub(lambda m: " " * len(m.group(0)), line)


def problems_in_text(text: str, citing: Path, root: Path = ROOT) -> list[str]:
    """All reference problems of one file's text, each as 'path:line: message'."""
    rel = citing.relative_to(root) if _inside(citing, root) else citing
    is_md = citing.suffix == ".md"
    in_tests = bool(rel.parts) and rel.parts[0] == "tests"
    cited_text = prose_only(text) if citing.suffix == ".py" and in_tests else text
    found: list[str] = []
    in_fence = False
    for no, (line, cited_line) in enumerate(zip(text.splitlines(), cited_text.splitlines(), strict=True), 1):
        where = f"{rel}:{no}"
        # (a) paths that leave the repository
        for m in OUTSIDE_RE.finditer(line):
            found.append(f"{where}: path outside the repository: {m.group(0)!r}")
        # (b) cited Markdown files
        for m in MD_REF_RE.finditer(cited_line):
            ref, anchor = m.group(1), m.group(2)
            if Path(ref).name in OUTPUT_NAMES or Path(ref).parts[0] in OUTPUT_DIRS or ref.startswith("/"):
                continue
            target = resolve_citation(ref, citing, root)
            if target is None and _generated(citing.parent / ref, root):
                continue
            if target is None:
                leaves = ref.startswith("../") and not _inside(citing.parent / ref, root)
                why = "leaves the repository" if leaves else "does not exist in the repository"
                found.append(f"{where}: cited {ref!r} {why}")
            elif (msg := _anchor_problem(target, anchor)) is not None:
                found.append(f"{where}: cited {ref}#{anchor}: {target.relative_to(root)} {msg}")
        # (c) relative Markdown links (outside code)
        if not is_md:
            continue
        if FENCE_RE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for m in LINK_RE.finditer(_strip_code(line)):
            link = m.group(1)
            if re.match(r"^[a-zA-Z][\w+.-]*:", link) or link.startswith("//"):
                continue  # http:, https:, mailto:, ...
            path_part, _, anchor = link.partition("#")
            target = citing if not path_part else citing.parent / path_part
            if not _inside(target, root):
                found.append(f"{where}: link {link!r} leaves the repository")
            elif not target.exists() and not _generated(target, root):
                found.append(
                    f"{where}: link {link!r} does not resolve ({target.relative_to(root)} is missing)"
                )
            elif target.is_file() and (msg := _anchor_problem(target, anchor or None)) is not None:
                found.append(f"{where}: link {link!r}: {target.relative_to(root)} {msg}")
    return list(dict.fromkeys(found))  # one message per problem, even if a line repeats the reference


def test_scanned_files_include_the_method_notes() -> None:
    files = {p.relative_to(ROOT).as_posix() for p in scanned_files()}
    for page in ("baselines", "ktae", "delta", "strace", "arca", "evaluation"):
        assert f"docs/spec/{page}.md" in files
    assert "docs/methods.md" in files and "src/tokencredit/credit/ktae.py" in files
    assert not any(".egg-info" in f for f in files)


def test_every_reference_resolves_inside_the_repository() -> None:
    found = [
        problem
        for path in scanned_files()
        for problem in problems_in_text(path.read_text(encoding="utf-8", errors="replace"), path)
    ]
    assert not found, "references that leave the repository or do not resolve:\n" + "\n".join(found)


# ------------------------------------------------------------------- the scanner itself
# The synthetic texts below spell ".md" and the sibling folder's name through these constants, so
# that scanning this very file (test_every_reference_resolves_inside_the_repository) sees no citation.
MD = ".md"
UP = "../"
SH = "shared"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "docs" / "spec").mkdir(parents=True)
    (tmp_path / "src").mkdir()
    (tmp_path / "docs" / f"methods{MD}").write_text("# Methods\n\n## Method notes\n\ntext\n")
    (tmp_path / "docs" / "spec" / f"ktae{MD}").write_text(
        "# KTAE\n\n## Worked example\n\n## GRPO(λ), the baseline\n"
    )
    return tmp_path


def _check(tree: Path, rel: str, text: str) -> list[str]:
    path = tree / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return problems_in_text(text, path, tree)


def test_scanner_accepts_good_references(tree: Path) -> None:
    ok = (
        f'"""See docs/spec/ktae{MD}#worked-example and ktae{MD}; methods{MD}#method-notes."""\n'
        f"x = 'compare{MD}'  # an output name, not a citation\n"
        f"# the 10-seed table is runs/tail/compare_n4{MD} (a run's output, not in the repository)\n"
        f"url = 'https://github.com/owner/repo/blob/main/NOTES{MD}'\n"
    )
    assert _check(tree, "src/mod.py", ok) == []
    md = (
        f"# Page\n\n## A section\n\n[notes](spec/ktae{MD}#worked-example), [self](#a-section), "
        f"[lambda](spec/ktae{MD}#grpoλ-the-baseline), [web](https://example.org/x{MD}), `[code](nowhere/)`\n"
        f"```\n[not a link](nowhere/)\n```\n"
    )
    assert _check(tree, f"docs/page{MD}", md) == []


@pytest.mark.parametrize(
    ("rel", "text", "needle"),
    [
        ("src/mod.py", f"# see {UP}{SH}/spec/ktae{MD}\n", "src/mod.py:1: path outside"),
        ("src/mod.py", "x = 1\nP = '/" + "work/main/data'\n", "src/mod.py:2: path outside"),
        (
            "tests/t.py",
            f'"""Vectors from strace{MD}."""\n',
            f"tests/t.py:1: cited 'strace{MD}' does not exist",
        ),
        ("src/mod.py", f"# docs/spec/delta{MD} steps 1-6\n", f"cited 'docs/spec/delta{MD}' does not exist"),
        (
            "src/mod.py",
            f"# docs/spec/ktae{MD}#no-such-section\n",
            "has no heading with anchor #no-such-section",
        ),
        (
            f"docs/page{MD}",
            f"intro\n[spec]({UP}{UP}{SH}/overview{MD})\n",
            f"docs/page{MD}:2: link '{UP}{UP}{SH}",
        ),
        (
            f"docs/page{MD}",
            f"[gone](spec/missing{MD})\n",
            f"docs/page{MD}:1: link 'spec/missing{MD}' does not resolve",
        ),
        (
            f"docs/page{MD}",
            f"# T\n[x](methods{MD}#nowhere)\n",
            f"docs/page{MD}:2: link 'methods{MD}#nowhere'",
        ),
        (f"docs/page{MD}", "# T\n[x](#nowhere)\n", "has no heading with anchor #nowhere"),
    ],
)
def test_scanner_flags_bad_references(tree: Path, rel: str, text: str, needle: str) -> None:
    found = _check(tree, rel, text)
    assert any(needle in f for f in found), found


def test_test_data_strings_are_not_citations(tree: Path) -> None:
    source = (
        f'"""Module docstring citing gone{MD}."""\n'
        f"SAMPLE = '[a](x{MD})'  # a comment citing absent{MD}\n"
        f'def f():\n    """Docstring citing missing{MD}."""\n    return f\'{{1}} y{MD}\'\n'
    )
    in_tests = " ".join(_check(tree, "tests/t.py", source))
    assert f"'gone{MD}'" in in_tests and f"'absent{MD}'" in in_tests and f"'missing{MD}'" in in_tests
    assert f"'x{MD}'" not in in_tests and f"'y{MD}'" not in in_tests
    in_src = " ".join(_check(tree, "src/t.py", source))
    assert f"'x{MD}'" in in_src and f"'y{MD}'" in in_src  # strings in src/ are checked too
    odd = "x = 'a\x0cb'\ny = 2\n"  # a line break str.splitlines knows, inside a string literal
    assert prose_only(odd).splitlines() == ["x =   ", "  ", "y = 2"]


def test_slug_matches_github() -> None:
    assert slug("The 80/20 high-entropy rule") == "the-8020-high-entropy-rule"
    assert slug("Coefficients: steps 1-7") == "coefficients-steps-1-7"
    assert slug("verl's and TRL's losses and estimators") == "verls-and-trls-losses-and-estimators"
    assert (
        slug("GRPO(λ), the baseline S-trace compares against")
        == "grpoλ-the-baseline-s-trace-compares-against"
    )
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}

"""MkDocs hook: the pages' relative links that leave docs/ keep working in the site.

The Markdown is written to be read on GitHub too, so a page links a source file as
``../src/tokencredit/credit/ktae.py`` and a root page as ``../BENCHMARKS.md``. In the site, a link to
a root page shown there (docs/gen_pages.py, ROOT_PAGES) becomes a link to that page, and a link to any
other file of the repository becomes a link to it in the repository's browser (``repo_url``). A link
to a file that does not exist is left alone, so ``mkdocs build --strict`` still fails on it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
ROOT_PAGES = {
    "BENCHMARKS.md": "benchmarks.md",
    "CHANGELOG.md": "changelog.md",
    "CONTRIBUTING.md": "contributing.md",
}
# Files under docs/ that are pages or pictures of the site; another file there (docs/gen_pages.py) is
# linked in the repository, like the source.
SITE_SUFFIXES = {".md", ".png", ".svg", ".jpg", ".jpeg", ".gif"}
_LINK = re.compile(r"(\]\()([^)\s#]+)((?:#[^)\s]*)?\))")
_FENCE = re.compile(r"^\s*(```|~~~)")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def _rewrite(target: str, page_dir: Path, src_dir: Path, repo_url: str) -> str:
    if _SCHEME.match(target) or target.startswith("/"):
        return target
    path = (src_dir / target).resolve()
    try:
        rel_root = path.relative_to(ROOT).as_posix()
    except ValueError:
        return target  # outside the repository: left for mkdocs to report
    if rel_root in ROOT_PAGES:
        return os.path.relpath(DOCS / ROOT_PAGES[rel_root], page_dir).replace(os.sep, "/")
    if path.is_relative_to(DOCS) and (path.suffix in SITE_SUFFIXES or not path.exists()):
        return os.path.relpath(path, page_dir).replace(os.sep, "/")
    if path.exists():
        kind = "tree" if path.is_dir() else "blob"
        return f"{repo_url.rstrip('/')}/{kind}/main/{rel_root}"
    return target


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    src_uri = page.file.src_uri
    page_dir = (DOCS / src_uri).parent
    root_name = next((k for k, v in ROOT_PAGES.items() if v == src_uri), None)
    src_dir = ROOT if root_name else page_dir  # a root page's links are relative to the repository root
    repo_url = config.get("repo_url") or ""
    out, fenced = [], False
    for line in markdown.split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
        if not fenced:
            line = _LINK.sub(lambda m: m[1] + _rewrite(m[2], page_dir, src_dir, repo_url) + m[3], line)
        out.append(line)
    return "\n".join(out)


def on_nav(nav: Any, config: Any, files: Any) -> Any:
    """The generated navigation files (catalog/SUMMARY.md, reference/SUMMARY.md) are navigation, not
    pages: mkdocs-literate-nav has read them by now."""
    for file in [f for f in files if f.src_uri.endswith("/SUMMARY.md")]:
        files.remove(file)
    return nav

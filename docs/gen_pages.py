"""The documentation site's generated pages, written by mkdocs-gen-files at ``mkdocs build`` (mkdocs.yml).

Nothing here is checked in as Markdown, so adding a method or a module never touches a page:

- ``catalog/``: one page per registered credit method (name, description, parameters with their
  defaults, the signals it reads, source, whether it is a reconstruction, the recipes built on it),
  and an index with the tables of every recipe, credit method, policy loss, ratio kernel and
  advantage estimator, all read from the registries;
- ``reference/``: the API reference, one page per public package or top-level module of
  ``src/tokencredit`` (its docstring and each public submodule's, rendered by mkdocstrings), with its
  navigation in ``reference/SUMMARY.md`` (mkdocs-literate-nav); the overview, ``reference/index.md``,
  is checked in;
- ``benchmarks.md``, ``changelog.md``, ``contributing.md``: the repository's root pages (their links
  are fixed up by docs/hooks.py).

tests/docs/test_site.py checks the generated pages against the registries and the package.
"""

from __future__ import annotations

import ast
import inspect
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hooks import ROOT, ROOT_PAGES  # noqa: E402  (the site's root pages: one table, read by both)

PACKAGE = ROOT / "src" / "tokencredit"
# Not API: the command-line front end (documented by --help and the user guide) and the verl dry-run launcher.
NOT_API = ("tokencredit.cli", "tokencredit.commands", "tokencredit.integrations.verl.local.__main__")


# ------------------------------------------------------------------------------------------- the catalog
def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, tuple):
        v = list(v)
    return repr(v)


def _params(defaults: Mapping[str, Any]) -> str:
    return ", ".join(f"`{k} = {_value(v)}`" for k, v in defaults.items()) or "none"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _source(fn: Any) -> str:
    """The function's dotted path as an mkdocstrings cross-reference."""
    dotted = f"{fn.__module__}.{fn.__qualname__}"
    return f"[`{dotted}`][{dotted}]"


def method_page(name: str) -> str:
    """The page of one registered credit method."""
    from tokencredit import credit
    from tokencredit.recipes import RECIPES

    m = credit.get(name)
    recipes = [r for r in RECIPES.values() if r.credit == name]
    doc = inspect.cleandoc(m.fn.__doc__ or "")
    rows = "\n".join(f"| `{k}` | `{_value(v)}` |" for k, v in m.defaults.items())
    lines = [
        f"# {name}",
        "",
        f"{_cell(m.description)}",
        "",
        f"- **Source:** {_cell(m.paper) or 'tokencredit'}",
        f"- **Reconstruction:** {_cell(m.reconstruction) if m.reconstruction else 'no (follows the source)'}",
        f"- **Reads:** {', '.join(f'`{s}`' for s in sorted(m.needs)) or 'only the response tokens and A'}",
        f"- **Needs a LoRA adapter:** {'yes' if m.requires_lora else 'no'}",
        f"- **Takes a token-level A [N,T]:** {'yes' if m.token_advantages else 'no'}",
        f"- **Code:** {_source(m.fn)}",
        "",
        "## Parameters",
        "",
        *(["| parameter | default |", "|---|---|", rows] if rows else ["None."]),
        "",
        "## Use it",
        "",
        f"On its own, over the engine's group baseline: `tokencredit train --recipe credit:{name}`, "
        f"`tokencredit explain --methods credit:{name}`; `tokencredit recipes credit:{name}` prints it as a "
        "config file to edit.",
        "",
    ]
    if recipes:
        lines += [
            "Recipes built on it:",
            "",
            *(f"- `{r.name}`: {_cell(r.notes or r.paper)}" for r in recipes),
            "",
        ]
    if doc:
        lines += ["## Definition", "", "```text", doc, "```", ""]
    return "\n".join(lines)


def _table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> list[str]:
    head = list(header)
    return [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]


def catalog_index() -> str:
    """Every recipe, credit method, policy loss, ratio kernel and advantage estimator, from the registries."""
    from tokencredit import advantages, credit, objectives
    from tokencredit.recipes import RECIPES

    methods = credit.CREDIT_METHODS.items()
    lines = [
        "# Catalog",
        "",
        "Generated from the registries at every build (`docs/gen_pages.py`); the same tables print with "
        "`tokencredit recipes` in a terminal. A name in the recipe table is a whole recipe; any credit "
        "method also runs on its own as `credit:NAME` (the default PPO-clip objective over the engine's "
        "group baseline). [Methods](../methods.md) says where each piece comes from.",
        "",
        "## Credit methods",
        "",
        *_table(
            ("method", "what it does", "parameters (defaults)", "reads", "reconstruction"),
            (
                (
                    f"[{n}]({n}.md)",
                    _cell(m.description),
                    _params(m.defaults),
                    ", ".join(sorted(m.needs)) or "-",
                    "yes" if m.reconstruction else "no",
                )
                for n, m in methods
            ),
        ),
        "## Recipes",
        "",
        *_table(
            ("recipe", "advantage", "credit", "objective", "source"),
            (
                (
                    f"`{r.name}`",
                    r.advantage,
                    f"[{r.credit}]({r.credit}.md)",
                    r.objective_label(),
                    _cell(r.paper),
                )
                for r in RECIPES.values()
            ),
        ),
        "## Policy losses",
        "",
        *_table(
            ("loss", "uses a ratio", "per-token credit", "parameters (defaults)", "source"),
            (
                (
                    f"`{n}`",
                    "yes" if x.uses_ratio else "no",
                    "yes" if x.per_token else "no",
                    _params(x.defaults),
                    _cell(x.paper),
                )
                for n, x in objectives.LOSSES.items()
            ),
        ),
        "## Ratio kernels",
        "",
        *_table(
            ("kernel", "per token", "parameters (defaults)", "reads", "reconstruction"),
            (
                (
                    f"`{n}`",
                    "yes" if k.per_token else "no",
                    _params(k.defaults),
                    ", ".join(sorted(k.needs)) or "-",
                    _cell(k.reconstruction) or "no",
                )
                for n, k in objectives.KERNELS.items()
            ),
        ),
        "## Advantage estimators",
        "",
        *_table(
            ("estimator", "token-level A", "parameters (defaults)", "reads", "source"),
            (
                (
                    f"`{n}`",
                    "yes" if e.token_level else "no",
                    _params(e.defaults),
                    ", ".join(sorted(e.needs | e.fields)) or "-",
                    _cell(e.paper),
                )
                for n, e in advantages.ESTIMATORS.items()
            ),
        ),
    ]
    return "\n".join(lines)


def catalog_pages() -> dict[str, str]:
    from tokencredit import credit

    pages = {"catalog/index.md": catalog_index()}
    pages.update({f"catalog/{name}.md": method_page(name) for name in list(credit.CREDIT_METHODS)})
    nav = ["* [Catalog](index.md)", *(f"* [{n}]({n}.md)" for n in list(credit.CREDIT_METHODS))]
    pages["catalog/SUMMARY.md"] = "\n".join(nav) + "\n"
    return pages


# ------------------------------------------------------------------------------------------ the reference
def _is_public(path: Path) -> bool:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return not any(p.startswith("_") and p != "__init__" for p in parts)


def public_modules() -> list[str]:
    """Dotted names of the package's public modules and packages (no ``_private`` part, not NOT_API)."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if not _is_public(path):
            continue
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        dotted = ".".join(parts)
        if not any(dotted == n or dotted.startswith(n + ".") for n in NOT_API):
            names.append(dotted)
    return names


def _has_docstring(module: str) -> bool:
    rel = Path(*module.split("."))
    path = PACKAGE.parent / rel.with_suffix(".py")
    if not path.exists():
        path = PACKAGE.parent / rel / "__init__.py"
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) is not None


def reference_pages() -> dict[str, str]:
    """One page per top-level package or module of tokencredit: the package, then each public submodule."""
    modules = public_modules()
    tops = sorted({".".join(m.split(".")[:2]) for m in modules if m != "tokencredit"})
    pages: dict[str, str] = {}
    nav = ["* [Overview](index.md)"]  # docs/reference/index.md, checked in (the README links it)
    for top in tops:
        members = [m for m in modules if m == top or m.startswith(top + ".")]
        blocks = [f"# `{top}`", ""]
        for m in members:
            level = 2 if m == top else 3
            blocks += [
                f"::: {m}",
                "    options:",
                f"      heading_level: {level}",
                "      show_root_heading: true",
                "",
            ]
        short = top.split(".", 1)[1]
        pages[f"reference/{short}.md"] = "\n".join(blocks)
        nav.append(f"* [{short}]({short}.md)")
    pages["reference/SUMMARY.md"] = "\n".join(nav) + "\n"
    return pages


def undocumented_modules() -> list[str]:
    """Public modules without a module docstring (the reference would show an empty section)."""
    return [m for m in public_modules() if not _has_docstring(m)]


# ------------------------------------------------------------------------------------------ root pages
def root_pages() -> dict[str, str]:
    """The root pages as site pages (docs/hooks.py makes their links relative to where they show)."""
    return {
        page: (ROOT / name).read_text(encoding="utf-8")
        for name, page in ROOT_PAGES.items()
        if (ROOT / name).exists()
    }


def all_pages() -> dict[str, str]:
    return {**catalog_pages(), **reference_pages(), **root_pages()}


if __name__ == "<run_path>":  # run by mkdocs-gen-files (runpy.run_path)
    import mkdocs_gen_files

    for _path, _text in all_pages().items():
        with mkdocs_gen_files.open(_path, "w") as _f:
            _f.write(_text)

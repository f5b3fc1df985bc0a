"""The documentation site's generated pages (docs/gen_pages.py) against the registries and the package.

CI builds the site itself (`mkdocs build --strict`, .ci/run); these tests check what the generator
writes without MkDocs: every registered name has its row and its parameters, a method registered in a
test shows up with no page edited, every public module is in the API reference, and every page the
site's navigation names exists.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch

from tokencredit import advantages, credit, objectives
from tokencredit.batch import RolloutBatch
from tokencredit.recipes import RECIPES

ROOT = Path(__file__).resolve().parents[2]


def _gen_pages():
    spec = importlib.util.spec_from_file_location("gen_pages", ROOT / "docs" / "gen_pages.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_pages", module)
    spec.loader.exec_module(module)
    return module


gen = _gen_pages()


def test_every_credit_method_has_a_page_with_its_parameters():
    pages = gen.catalog_pages()
    for name, method in credit.CREDIT_METHODS.items():
        page = pages[f"catalog/{name}.md"]
        assert page.startswith(f"# {name}\n")
        for param, default in method.defaults.items():
            assert f"| `{param}` | `{gen._value(default)}` |" in page, (name, param)
        assert f"[`{method.fn.__module__}.{method.fn.__qualname__}`]" in page
    summary = pages["catalog/SUMMARY.md"]
    assert summary.count("\n") == len(credit.CREDIT_METHODS) + 1


def test_the_catalog_index_has_a_row_for_every_registered_name():
    index = gen.catalog_index()
    rows = {line.split(" | ")[0].strip("| ") for line in index.splitlines() if line.startswith("| ")}
    assert {f"[{n}]({n}.md)" for n in credit.CREDIT_METHODS} <= rows
    assert {f"`{n}`" for n in RECIPES} <= rows
    for registry in (objectives.LOSSES, objectives.KERNELS, advantages.ESTIMATORS):
        assert {f"`{n}`" for n in registry} <= rows, registry
    assert "reconstruction" in index


def test_a_new_method_reaches_the_docs_with_no_page_edited():
    """The one-module promise of docs/extending.md: registering is all it takes."""
    with credit.CREDIT_METHODS.temporary():

        @credit.register("test-docs-halves", needs=("entropy",), paper="a throwaway example")
        def halves(batch: RolloutBatch, advantages: torch.Tensor, low: float = 0.5) -> torch.Tensor:
            """Â_t = A w_t with w = 1 on high-entropy tokens and `low` elsewhere."""
            return advantages[:, None] * torch.ones_like(batch.mask, dtype=torch.float32)

        pages = gen.catalog_pages()
        page = pages["catalog/test-docs-halves.md"]
        assert "| `low` | `0.5` |" in page and "`entropy`" in page and "a throwaway example" in page
        assert "[test-docs-halves](test-docs-halves.md)" in pages["catalog/index.md"]
    assert "test-docs-halves" not in credit.CREDIT_METHODS


def test_the_reference_covers_every_public_module_once():
    pages = [
        *gen.reference_pages().values(),
        (ROOT / "docs" / "reference" / "index.md").read_text(encoding="utf-8"),
    ]
    shown = [m for text in pages for m in re.findall(r"^::: (\S+)$", text, flags=re.M)]
    assert sorted(shown) == sorted(gen.public_modules())
    assert len(shown) == len(set(shown))
    for core in (
        "batch",
        "advantages",
        "credit",
        "objectives",
        "recipes",
        "builder",
        "signals",
        "diagnostics",
    ):
        assert f"tokencredit.{core}" in shown
    assert not any(m.startswith(("tokencredit.cli", "tokencredit.commands")) for m in shown)
    assert not any(part.startswith("_") for m in shown for part in m.split("."))


def test_every_public_module_has_a_docstring():
    assert gen.undocumented_modules() == []


def _nav_pages(text: str) -> list[str]:
    return re.findall(r"^\s*-\s+(?:[^:\n]+:\s+)?([\w/.-]+\.md|[\w-]+/)\s*$", text, flags=re.M)


def test_every_page_the_navigation_names_exists():
    generated = set(gen.all_pages())
    nav = _nav_pages((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert "index.md" in nav and "reference/" in nav and "catalog/" in nav
    for page in nav:
        if page.endswith("/"):
            assert (ROOT / "docs" / page).is_dir() or any(g.startswith(page) for g in generated), page
        else:
            assert (ROOT / "docs" / page).is_file() or page in generated, page


@pytest.mark.parametrize("target", ["../BENCHMARKS.md", "../src/tokencredit/credit/ktae.py", "spec/ktae.md"])
def test_links_that_leave_docs_point_into_the_site_or_the_repository(target):
    sys.path.insert(0, str(ROOT / "docs"))
    import hooks

    class Page:
        class file:
            src_uri = "methods.md"

    out = hooks.on_page_markdown(f"see [x]({target}#a)", Page, {"repo_url": "https://example.org/r"}, None)
    expected = {
        "../BENCHMARKS.md": "benchmarks.md#a",
        "../src/tokencredit/credit/ktae.py": "https://example.org/r/blob/main/src/tokencredit/credit/ktae.py#a",
        "spec/ktae.md": "spec/ktae.md#a",
    }[target]
    assert out == f"see [x]({expected})"
    assert (
        hooks.on_page_markdown("[x](../no-such-file.md)", Page, {"repo_url": "u"}, None)
        == "[x](../no-such-file.md)"
    )

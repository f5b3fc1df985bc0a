"""The config reference in docs/inputs.md is generated from train/config.py and kept current: every key
listed with its default, every field described (issue 31)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tokencredit.train import config_reference as ref

DOC = Path(__file__).resolve().parents[2] / "docs" / "inputs.md"
REGENERATE = "python -m tokencredit.train.config_reference --write docs/inputs.md"
CELL_SPLIT = re.compile(r"(?<!\\)\|")


def _cells(line: str) -> list[str]:
    return [c.strip().strip("`").replace("\\|", "|") for c in CELL_SPLIT.split(line.strip())[1:-1]]


def documented(text: str) -> dict[str, tuple[str, str]]:
    """{key: (type, default)} of the rows of the marked block of a page."""
    start, end = text.find(ref.START), text.find(ref.END)
    assert 0 <= start < end, f"no config reference block in the page; add it with {REGENERATE}"
    rows = [_cells(line) for line in text[start:end].splitlines() if line.startswith("| `")]
    return {cells[0]: (cells[1], cells[2]) for cells in rows}


def problems(text: str) -> list[str]:
    """What the page's reference gets wrong: keys missing or not in the config, defaults that differ."""
    doc = documented(text)
    keys = {k.key: k for _, _, ks in ref.config_keys() for k in ks}
    out = [f"{key} is missing" for key in keys if key not in doc]
    out += [f"{key} is no config key" for key in doc if key not in keys]
    out += [
        f"{key}: default {doc[key][1]} in the page, {k.default} in the config"
        for key, k in keys.items()
        if key in doc and doc[key][1] != k.default
    ]
    return out


def test_the_doc_lists_every_key_with_its_default():
    found = problems(DOC.read_text(encoding="utf-8"))
    assert not found, f"docs/inputs.md's config reference: {'; '.join(found)} (run {REGENERATE})"


def test_the_doc_reference_is_current():
    text = DOC.read_text(encoding="utf-8")
    assert ref.replace_block(text, ref.reference(), str(DOC)) == text, (
        f"the config reference is out of date: run {REGENERATE}"
    )


def test_every_config_key_has_a_description():
    missing = [k.key for _, _, keys in ref.config_keys() for k in keys if not k.description]
    assert not missing, (
        f"config keys without a description (a comment after the field in train/config.py): {missing}"
    )


def test_the_checks_catch_a_missing_key_and_a_changed_default():
    text = ref.replace_block(f"# page\n{ref.START}\n{ref.END}\n", ref.reference(), "page")
    assert problems(text) == []
    text = text.replace("| `run.steps` | `int` | `40` |", "| `run.steps` | `int` | `41` |")
    text = "\n".join(line for line in text.splitlines() if not line.startswith("| `optim.lr` |"))
    assert problems(text) == ["optim.lr is missing", "run.steps: default 41 in the page, 40 in the config"]


SOURCE = '''
@dataclass
class Section:
    """Not a field."""

    plain: int = 0  # on the line
    # above, line one
    # above, line two
    above: str = "#"
    # a comment kept apart by a blank line

    bare: bool = True
    several: list[str] = field(
        default_factory=lambda: ["a # b"]
    )  # after the closing line
    both: float = 1.0  # the line's comment wins
    ignored = 3  # not annotated: no dataclass field
'''


def test_descriptions_are_the_comments_read_as_tokens():
    assert ref.field_descriptions(SOURCE, "Section") == {
        "plain": "on the line",
        "above": "above, line one above, line two",  # the '#' in "#" is a string, not a comment
        "bare": "",
        "several": "after the closing line",
        "both": "the line's comment wins",
    }
    with pytest.raises(ValueError, match="no class 'Other'"):
        ref.field_descriptions(SOURCE, "Other")


def test_the_table_escapes_what_markdown_would_read():
    table = ref.reference()
    assert '| `run.device` | `str` | `"auto"` | auto \\| cpu \\| cuda |' in table
    assert "10\\*\\*digits" in table and "\\<recipe>" in table  # no emphasis, no HTML tag
    assert "| `algo.overrides` | `dict[str, Any]` | `{}` |" in table


def test_write_and_check(tmp_path, capsys):
    page = tmp_path / "page.md"
    page.write_text(f"# Page\n\n{ref.START}\nstale\n{ref.END}\n\nafter\n")
    assert ref.main(["--check", str(page)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert ref.main(["--write", str(page)]) == 0
    assert ref.main(["--check", str(page)]) == 0
    text = page.read_text()
    assert "stale" not in text and text.endswith(f"{ref.END}\n\nafter\n") and "| `run.seed` |" in text
    page.write_text("no markers\n")
    assert ref.main(["--write", str(page)]) == 2
    assert "no config reference markers" in capsys.readouterr().err

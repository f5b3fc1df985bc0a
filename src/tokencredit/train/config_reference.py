"""The trainer's config reference, generated from the config code: one Markdown table per section.

Each key's type is its annotation, its default the value `TrainConfig()` holds (written as in a run's
config.toml) and its description the comment on the field's line in ``train/config.py`` (or, with
none there, the comment lines right above the field). The reference lives in docs/inputs.md between
`START` and `END`; regenerate it after changing the config::

    python -m tokencredit.train.config_reference --write docs/inputs.md
    python -m tokencredit.train.config_reference --check docs/inputs.md   # exit 1 when out of date
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

from tokencredit.errors import ConfigError
from tokencredit.train import config
from tokencredit.train.config import TrainConfig
from tokencredit.train.config import _toml_value as toml_value  # the writer of a run's config.toml

__all__ = [
    "END",
    "START",
    "ConfigKey",
    "config_keys",
    "field_descriptions",
    "main",
    "reference",
    "replace_block",
]

START = "<!-- config-reference:start (generated: python -m tokencredit.train.config_reference --write docs/inputs.md) -->"
END = "<!-- config-reference:end -->"


@dataclass(frozen=True)
class ConfigKey:
    """One key of the trainer config: ``section.name``, its type, its default as TOML, its description."""

    section: str
    name: str
    type: str
    default: str
    description: str

    @property
    def key(self) -> str:
        return f"{self.section}.{self.name}"


def _comments(source: str) -> dict[int, tuple[str, bool]]:
    """line number -> (comment text without '#', whether the comment is the line's only content)."""
    lines = source.splitlines()
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            own_line = not lines[row - 1][:col].strip()
            out[row] = (tok.string.lstrip("#").strip(), own_line)
    return out


def field_descriptions(source: str, class_name: str) -> dict[str, str]:
    """Each annotated field of class `class_name` in `source` -> its description: the comment after
    the field (on any line of a field written over several), else the block of comment lines right
    above it (no blank line between), joined; "" when it has neither. Comments are read with
    `tokenize`, so a '#' inside a string default is not one."""
    comments = _comments(source)
    node = next(
        (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == class_name), None
    )
    if node is None:
        raise ConfigError(f"no class {class_name!r} in the config source")
    out = {}
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        end = stmt.end_lineno or stmt.lineno
        trailing = [
            comments[n][0] for n in range(stmt.lineno, end + 1) if n in comments and not comments[n][1]
        ]
        above: list[str] = []
        row = stmt.lineno - 1
        while row in comments and comments[row][1]:
            above.insert(0, comments[row][0])
            row -= 1
        out[stmt.target.id] = " ".join(trailing or above)
    return out


def _type_name(annotation: object) -> str:
    # `from __future__ import annotations` in config.py keeps annotations as their source text
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))


def config_keys() -> list[tuple[str, str, list[ConfigKey]]]:
    """(section, section docstring, its keys) for every section of `TrainConfig`, in declaration order."""
    source = inspect.getsource(config)
    defaults = TrainConfig()
    out = []
    for sec in dataclasses.fields(TrainConfig):
        obj = getattr(defaults, sec.name)
        cls = type(obj)
        described = field_descriptions(source, cls.__name__)
        keys = [
            ConfigKey(
                sec.name,
                f.name,
                _type_name(f.type),
                _default(getattr(obj, f.name)),
                described.get(f.name, ""),
            )
            for f in dataclasses.fields(cls)
        ]
        out.append((sec.name, inspect.cleandoc(cls.__doc__ or "") if _own_doc(cls) else "", keys))
    return out


def _default(value: object) -> str:
    text = toml_value(value)
    return "{}" if text == "{  }" else text  # config.toml's empty inline table, written as people write it


def _own_doc(cls: type) -> bool:
    # a dataclass without a docstring gets a generated one: "RunConfig(seed: int = 0, ...)"
    return bool(cls.__doc__) and not cls.__doc__.startswith(f"{cls.__name__}(")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a pipe ends a table cell, in a code span too


def _code(text: str) -> str:
    return f"`{_cell(text)}`" if text else ""


def _prose(text: str) -> str:
    """A comment as a table cell: outside its `code spans`, '*' and '<' escaped (10**digits is no
    emphasis, <recipe> no HTML tag)."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("*", "\\*").replace("<", "\\<")
    return _cell("`".join(parts))


def reference() -> str:
    """The Markdown reference: a heading, the section's docstring and a table (key, type, default,
    description) per section."""
    parts = []
    for section, doc, keys in config_keys():
        parts.append(f"### `[{section}]`\n")
        if doc:
            parts.append(doc + "\n")
        rows = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
        rows += [
            f"| {_code(k.key)} | {_code(k.type)} | {_code(k.default)} | {_prose(k.description)} |"
            for k in keys
        ]
        parts.append("\n".join(rows) + "\n")
    return "\n".join(parts)


def replace_block(text: str, block: str, where: str) -> str:
    """`text` with what lies between its `START` and `END` lines replaced by `block`."""
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise ConfigError(f"{where}: no config reference markers; add the lines {START} and {END}")
    return text[: start + len(START)] + "\n\n" + block.strip() + "\n\n" + text[end:]


def main(argv: list[str] | None = None) -> int:
    """Print the reference, or write it into / check it against a Markdown file's marked block."""
    parser = argparse.ArgumentParser(prog="python -m tokencredit.train.config_reference", description=__doc__)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="FILE", help="replace the marked block of FILE with the reference")
    group.add_argument("--check", metavar="FILE", help="exit 1 when the marked block of FILE is out of date")
    args = parser.parse_args(argv)
    block = reference()
    undescribed = [k.key for _, _, keys in config_keys() for k in keys if not k.description]
    if undescribed:  # the table is still written: the test suite fails on these until config.py says
        print(
            f"config keys without a description comment in config.py: {', '.join(undescribed)}",
            file=sys.stderr,
        )
    path = Path(args.write or args.check) if (args.write or args.check) else None
    if path is None:
        print(block, end="")
        return 0
    try:
        text = path.read_text(encoding="utf-8")
        new = replace_block(text, block, str(path))
    except (OSError, ConfigError) as e:
        print(f"config_reference: {e}", file=sys.stderr)
        return 2
    if args.check:
        if new != text:
            print(
                f"{path}: the config reference is out of date; run {parser.prog} --write {path}",
                file=sys.stderr,
            )
            return 1
        return 0
    path.write_text(new, encoding="utf-8")
    print(f"wrote the config reference into {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

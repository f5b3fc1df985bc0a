"""The commands the README and the guide show do what the pages say: each parses, each `train` command's
config (recipe, --set keys and values) is accepted, a run directory a command reads is one an earlier
command of the same block writes (or the trainer's own naming), and an inline `--set` example is valid
for the recipe it names (the default recipe otherwise). Nothing here trains: the long jobs are run by
their own tests (the default run, compare, explain, probe)."""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from pathlib import Path

import pytest

from tokencredit import cli
from tokencredit.commands import COMMANDS
from tokencredit.errors import ConfigError
from tokencredit.recipes import RECIPES
from tokencredit.train.config import check_recipe, load_config, validate_config
from tokencredit.train.trainer import resolve_recipe

ROOT = Path(__file__).resolve().parents[1]
PAGES = (
    ROOT / "README.md",
    ROOT / "docs" / "getting-started.md",
    *sorted((ROOT / "docs" / "guide").glob("*.md")),
)
FENCE = re.compile(r"^```(\w*)\s*$")
# The trainer's default run directory: runs/<recipe>-s<seed>-<YYYYmmdd-HHMMSS> (commands/train.py).
DEFAULT_RUN_DIR = re.compile(r"runs/(?P<recipe>.+)-s\d+-(\d{8}-\d{6}|TIME)")
# Stand-ins for what a reader supplies: their own model, config file or data.
PLACEHOLDER = re.compile(r"^(/path/to/|my\.toml$|my_|your)")


def _commands(page: Path) -> list[tuple[int, int, list[str]]]:
    """(block number, line number, argv after `tokencredit`) of every `tokencredit` command in the
    page's bash blocks; a line's comment and `&&`-joined commands are split off."""
    out: list[tuple[int, int, list[str]]] = []
    lang, block = None, 0
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            lang, block = (fence[1] or "text", block + 1) if lang is None else (None, block)
            continue
        if lang not in ("bash", "sh", "shell"):
            continue
        for part in re.split(r"\s&&\s", line):
            words = shlex.split(part, comments=True)
            if words[:1] == ["tokencredit"] and len(words) > 1:
                out.append((block, n, words[1:]))
    return out


ALL = [(page, *c) for page in PAGES for c in _commands(page)]


def _check_config(config: str | None, sets: list[str], recipe: str | None) -> None:
    """What `tokencredit train` checks before any model loads: the config's keys and values, the recipe
    with its overrides, and the recipe against the config."""
    cfg = load_config(config, sets, recipe)
    validate_config(cfg)
    check_recipe(resolve_recipe(cfg), cfg)


def _parse(argv: list[str]) -> argparse.Namespace:
    module = importlib.import_module(f"tokencredit.commands.{argv[0].replace('-', '_')}")
    parser = argparse.ArgumentParser(prog=f"tokencredit {argv[0]}", exit_on_error=False)
    module.add_arguments(parser)
    return parser.parse_args(argv[1:])


def test_the_pages_show_commands():
    assert len(ALL) > 20 and {c[3][0] for c in ALL} >= {"train", "explain", "compare", "probe"}


@pytest.mark.parametrize(("page", "block", "line", "argv"), ALL, ids=[f"{p.name}:{n}" for p, _, n, _ in ALL])
def test_a_shown_command_parses_and_its_config_is_accepted(page, block, line, argv):
    where = f"{page.name}:{line}: tokencredit {shlex.join(argv)}"
    assert argv[0] in COMMANDS, f"{where}: no such command"
    if argv[1:2] in (["--help"], ["-h"]):
        return
    try:
        args = _parse(argv)
    except (argparse.ArgumentError, SystemExit) as e:
        pytest.fail(f"{where}: does not parse ({e})")
    if argv[0] == "train" and not args.resume:
        sets = list(args.set)
        if args.model and not PLACEHOLDER.match(args.model):
            sets.append(f"model.name={args.model}")
        config = None if args.config is None or PLACEHOLDER.match(args.config) else args.config
        try:
            _check_config(config, sets, args.recipe)
        except ConfigError as e:
            pytest.fail(f"{where}: its config is refused: {e}")
    # A run directory the command reads: written by an earlier command of the block, or the trainer's naming.
    read = getattr(args, "run_dir", None) or getattr(args, "resume", None)
    if read and not PLACEHOLDER.match(read):
        written = {
            _parse(a).out
            for b, n, a in _commands(page)
            if b == block and n <= line and a is not argv and a[0] == "train" and "--out" in a
        }
        named = DEFAULT_RUN_DIR.fullmatch(read)
        assert read in written or (named and named["recipe"] in RECIPES), (
            f"{where}: reads {read}, which no earlier command of the block writes (add --out {read} to the train)"
        )


INLINE_SET = re.compile(r"`([^`]*--set [^`]*)`")


def _inline_sets() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        prose = " ".join(page.read_text(encoding="utf-8").split())  # a span may break across lines
        spans = INLINE_SET.findall(prose)  # less the syntax itself (`--set KEY=VALUE`) and whole commands
        found += [(page.name, s) for s in spans if not s.startswith("tokencredit ") and "KEY=VALUE" not in s]
    return found


@pytest.mark.parametrize(("page", "span"), _inline_sets())
def test_an_inline_set_example_is_valid_for_its_recipe(page, span):
    words = shlex.split(span)
    recipe = words[words.index("--recipe") + 1] if "--recipe" in words else None
    sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    if any("lamda" in s for s in sets):  # the page's example of a typo: it must be caught, naming `lam`
        with pytest.raises(ConfigError, match=r"closest: lam\b"):
            _check_config(None, sets, recipe)
        return
    try:
        _check_config(None, sets, recipe)
    except ConfigError as e:
        pytest.fail(f"{page}: `{span}` is refused: {e}")


def test_the_typo_example_is_caught_through_the_command_line(capsys):
    assert cli.main(["train", "--recipe", "strace", "--set", "algo.kernel_params.lamda=0.9"]) == 2
    assert "has no parameter 'lamda' (closest: lam)" in capsys.readouterr().err

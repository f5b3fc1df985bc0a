"""`tokencredit recipes`: the recipe table (advantage, credit method, objective, paper) and the table of
every registered credit method with its parameters and defaults (a method needs no recipe row to be
listed or used: ``credit:NAME``); `-v` adds every recipe's hyperparameters as ``key = value`` lines;
`recipes NAME` prints one recipe as the TOML of a trainer config file (``[algo]`` with the recipe's
every field as ``[algo.overrides]``, and each registered function's parameters with their defaults).

No transformers import here (nor `tokencredit.train.config`, which loads it): the command answers in
the time torch takes to import.
"""

from __future__ import annotations

import argparse
import json
import re
import textwrap
from typing import Any

from rich import box
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from tokencredit import advantages, credit, objectives
from tokencredit.errors import ConfigError
from tokencredit.recipes import CLIP_FIELDS, RECIPES, Recipe, resolve

__all__ = [
    "add_arguments",
    "credit_table",
    "parameter_defaults",
    "recipe_toml",
    "run",
    "toml_value",
    "unread_fields",
]

# Fields that describe a recipe rather than set it: comments in the TOML, the heading in `-v`.
DESCRIPTIVE = ("name", "paper", "notes", "kind")
# `-v` puts these together on one line each (each choice next to its parameters); a field in none of
# them still gets a line of its own.
LINES = (
    ("advantage", "advantage_params"),
    ("credit", "credit_params"),
    ("loss", "loss_params"),
    ("kernel", "kernel_params"),
    ("eps_low", "eps_high", "dual_clip"),
    ("loss_agg_mode", "norm_constant"),
    ("kl_coef", "kl_type"),
    ("dynamic_sampling", "overlong_buffer", "mask_truncated"),
)
PAPER_WIDTH = 120  # the table's paper column needs a terminal this wide
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name", nargs="?", help="print this recipe (or credit:METHOD) as TOML to paste into a config file"
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="also show every hyperparameter")


def toml_value(value: Any, where: str) -> str:
    """`value` (a recipe field: str, bool, number, or a table / list of them) as a TOML value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        # a JSON string is a TOML basic string, but for DEL, which TOML wants escaped
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, dict):
        items = [
            f"{k if _BARE_KEY.fullmatch(k) else json.dumps(k)} = {toml_value(v, f'{where}.{k}')}"
            for k, v in value.items()
        ]
        return "{ " + ", ".join(items) + " }" if items else "{}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v, where) for v in value) + "]"
    raise ConfigError(f"{where}: {value!r} cannot be written to TOML")


def _display(value: Any, where: str) -> str:
    return "none" if value is None else toml_value(value, where)


def _config_name(recipe: Recipe) -> str:
    # a credit method on its own that shares a recipe's name needs the prefix (`resolve` prefers recipes)
    return f"credit:{recipe.name}" if recipe.kind == "method" else recipe.name


def parameter_defaults(recipe: Recipe) -> dict[str, dict[str, Any]]:
    """Each ``*_params`` field of the recipe -> every parameter its registered function takes, with its
    default (what a parameter left out of the recipe's own table is run with)."""
    return {
        "advantage_params": dict(advantages.get_estimator(recipe.advantage).defaults),
        "credit_params": dict(credit.get(recipe.credit).defaults),
        "loss_params": {
            k: v for k, v in objectives.get_loss(recipe.loss).defaults.items() if k not in CLIP_FIELDS
        },
        "kernel_params": dict(objectives.get_kernel(recipe.kernel).defaults),
    }


def _params_text(defaults: dict[str, Any], where: str) -> str:
    return ", ".join(f"{k} = {toml_value(v, f'{where}.{k}')}" for k, v in defaults.items()) or "none"


def unread_fields(recipe: Recipe) -> list[str]:
    """The fields the recipe's policy loss never reads: the clip range of a loss without one, the ratio
    kernel of a loss without a ratio (`resolve` refuses an override of either)."""
    takes = objectives.get_loss(recipe.loss).defaults
    unread = [k for k in CLIP_FIELDS if k not in takes]
    return unread + ([] if recipe.uses_ratio else ["kernel", "kernel_params"])


def recipe_toml(recipe: Recipe) -> str:
    """The recipe as a trainer config's ``[algo]`` table: its name, and every hyperparameter as an
    override with the recipe's own value (a field left unset, None, as a comment: TOML has no null)."""
    about = [
        f"{_config_name(recipe)}: {recipe.paper}",
        recipe.notes,
        "For a trainer config file (tokencredit train --config FILE). The values are the recipe's own, "
        "pinned: edit any, delete the lines to keep following the recipe table.",
    ]
    out = [
        line
        for text in about
        if text
        for line in textwrap.wrap(text, 78, initial_indent="# ", subsequent_indent="# ")
    ]
    out += [
        "[algo]",
        f"recipe = {toml_value(_config_name(recipe), 'recipe')}",
        "",
        "[algo.overrides]",
    ]
    unread = unread_fields(recipe)
    if unread:
        note = f"not read by policy loss {recipe.loss!r}: {', '.join(unread)}"
        out += textwrap.wrap(note, 78, initial_indent="# ", subsequent_indent="# ")
    defaults = parameter_defaults(recipe)
    for key, value in recipe.to_dict().items():
        if key in DESCRIPTIVE or key in unread:
            continue
        if defaults.get(key):
            fn = recipe.to_dict()[key.removesuffix("_params")]
            note = f"{fn!r} takes (defaults): {_params_text(defaults[key], key)}"
            out += textwrap.wrap(note, 78, initial_indent="# ", subsequent_indent="#   ")
        if value is None:
            out.append(f"# {key} = (unset)")
        else:
            out.append(f"{key} = {toml_value(value, f'recipe {recipe.name!r}: {key}')}")
    return "\n".join(out) + "\n"


def _hyperparameter_lines(recipe: Recipe) -> list[str]:
    unread = unread_fields(recipe)
    fields = {k: v for k, v in recipe.to_dict().items() if k not in DESCRIPTIVE and k not in unread}
    groups = [tuple(k for k in keys if k in fields) for keys in LINES]
    rest = [(k,) for k in fields if not any(k in keys for keys in LINES)]
    lines = ["   ".join(f"{k} = {_display(fields[k], k)}" for k in keys) for keys in groups + rest if keys]
    return lines + ([f"(not read by policy loss {recipe.loss!r}: {', '.join(unread)})"] if unread else [])


def _table(width: int) -> Table:
    """The recipe table; the paper column only where it fits (`PAPER_WIDTH` columns), else a caption
    pointing at ``-v``, which prints each recipe's paper."""
    with_paper = width >= PAPER_WIDTH
    caption = None if with_paper else "papers and every hyperparameter: tokencredit recipes -v"
    table = Table(
        title="tokencredit recipes",
        box=box.SIMPLE_HEAD,
        caption=caption,
        pad_edge=False,
        collapse_padding=True,
    )
    for col in ("recipe", "advantage", "credit", "objective") + (("paper",) if with_paper else ()):
        table.add_column(col, no_wrap=col in ("recipe", "advantage", "credit"), overflow="fold")
    for r in RECIPES.values():
        table.add_row(r.name, r.advantage, r.credit, r.objective_label(), *([r.paper] if with_paper else []))
    return table


def credit_table() -> Table:
    """Every registered credit method: its parameters with their defaults, the per-token signals it
    reads, and the recipes built on it (none: use it as ``credit:NAME``)."""
    table = Table(
        title="credit methods (tokencredit recipes credit:NAME)",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for col in ("method", "parameters (defaults)", "reads", "recipes"):
        table.add_column(col, no_wrap=col == "method", overflow="fold")
    for name, method in credit.CREDIT_METHODS.items():
        used_by = [r.name for r in RECIPES.values() if r.credit == name]
        shown = ", ".join(used_by[:3]) + (f" + {len(used_by) - 3} more" if len(used_by) > 3 else "")
        table.add_row(
            name,
            _params_text(dict(method.defaults), name),
            ", ".join(sorted(method.needs)) or "-",
            shown or "-",
        )
    return table


def _print_hyperparameters(console: Console) -> None:
    for r in RECIPES.values():
        console.print()
        console.print(Text.assemble((r.name, "bold"), f"  {r.paper}"))
        if r.notes:
            console.print(Padding(Text(r.notes, style="dim"), (0, 0, 0, 2)))
        for line in _hyperparameter_lines(r):
            console.print(Padding(Text(line), (0, 0, 0, 2)))


def run(args: argparse.Namespace) -> int:
    if args.name:
        print(recipe_toml(resolve(args.name)), end="")  # plain print: rich would read [algo] as markup
        return 0
    console = Console()
    console.print(_table(console.width))
    console.print(credit_table())
    if args.verbose:
        _print_hyperparameters(console)
    return 0

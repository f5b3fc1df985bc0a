"""`tokencredit recipes`: the recipe table (advantage, credit method, objective, paper), `-v` for every field."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from tokencredit.recipes import RECIPES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verbose", "-v", action="store_true", help="also show every hyperparameter")


def run(args: argparse.Namespace) -> int:
    table = Table(title="tokencredit recipes", show_lines=False)
    for col in ("recipe", "advantage", "credit", "objective", "paper"):
        table.add_column(col, overflow="fold", no_wrap=col in ("recipe", "credit"))
    for r in RECIPES.values():
        table.add_row(r.name, r.advantage, r.credit, r.objective_label(), r.paper)
        if args.verbose:
            skip = ("name", "paper", "kind")
            table.add_row("", "", "", str({k: v for k, v in r.to_dict().items() if k not in skip}), "")
    Console().print(table)
    return 0

"""`tokencredit` command line. Each sub-command lives in its own module, imported only when used,
so `tokencredit recipes` does not pay for importing transformers.

A sub-command module exposes `add_arguments(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from tokencredit.errors import ConfigError, TrainingError

COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("tokencredit.train.cli", "train a model with a recipe (default: the embedded toy math task)"),
    "recipes": ("tokencredit.recipes", "list the recipes (advantage, credit method, objective, paper)"),
    "eval": ("tokencredit.evaluation", "evaluate a model on the shipped math benchmarks"),
    "explain": ("tokencredit.report.explain", "per-token credit heatmaps of several methods as one HTML file"),
    "compare": ("tokencredit.report.compare", "method shoot-out: recipes x seeds on equal terms"),
    "probe": ("tokencredit.report.probe", "credit-quality probe: does a method blame the first wrong token?"),
}


def _top_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tokencredit",
        description="Token-level credit assignment for RL with verifiable rewards.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n" + "\n".join(f"  {k:<9} {v[1]}" for k, v in COMMANDS.items()),
    )
    p.add_argument("command", choices=list(COMMANDS), metavar="COMMAND", help="one of: " + ", ".join(COMMANDS))
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        _top_parser().print_help()
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        _top_parser().parse_args([cmd])  # prints the usage error and exits 2
    module = importlib.import_module(COMMANDS[cmd][0])
    parser = argparse.ArgumentParser(prog=f"tokencredit {cmd}", description=COMMANDS[cmd][1])
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    try:
        return int(module.run(args) or 0)
    except ConfigError as e:
        print(f"tokencredit {cmd}: configuration error: {e}", file=sys.stderr)
        return 2
    except TrainingError as e:
        # One line, not a traceback: the message names the step and where the last good state is.
        print(f"tokencredit {cmd}: training stopped: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

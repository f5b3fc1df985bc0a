"""`tokencredit` command line: dispatch to `tokencredit.commands.<name>`, imported only when used,
and turn a ConfigError / TrainingError into one line and an exit code (2 / 1), and a run stopped by
a signal into its message and 128 + the signal number. The Hugging Face libraries' progress bars
are off unless ``TOKENCREDIT_PROGRESS_BARS=1`` (`tokencredit.hf_progress`).

Two last nets keep the promise of one line, never a traceback: an OSError that names a file (a path
that cannot be read or written) is one line naming it, exit 2; any other exception is one line that
calls itself a bug, exit 1, with the traceback shown only under ``TOKENCREDIT_DEBUG=1``. Every bad
input the tests know of has its own message before these nets (tests/commands/test_corpus_*.py)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings

from tokencredit import __version__, hf_progress
from tokencredit.commands import COMMANDS
from tokencredit.errors import ConfigError, Interrupted, TrainingError

# The libraries under tokencredit. Their warnings (FutureWarning / DeprecationWarning about their own API,
# UserWarnings raised inside them) say nothing a tokencredit user can act on.
THIRD_PARTY_MODULES = (
    r"(torch|transformers|peft|accelerate|huggingface_hub|tokenizers|safetensors|trl|datasets|math_verify"
    r"|latex2sympy2_extended|sympy|matplotlib|numpy|scipy)(\.|$)"
)


def quiet_third_party_warnings() -> None:
    """Hide the warnings of the libraries underneath (`THIRD_PARTY_MODULES`) and every FutureWarning /
    DeprecationWarning (tokencredit raises none), keeping tokencredit's own RuntimeWarning / UserWarning.
    A user's ``-W`` / ``PYTHONWARNINGS`` choice wins, and ``TOKENCREDIT_DEBUG=1`` shows everything."""
    if sys.warnoptions or os.environ.get("TOKENCREDIT_DEBUG"):
        return
    for category in (FutureWarning, DeprecationWarning, PendingDeprecationWarning):
        warnings.filterwarnings("ignore", category=category)
    warnings.filterwarnings("ignore", module=THIRD_PARTY_MODULES)


def _top_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tokencredit",
        description="Token-level credit assignment for RL with verifiable rewards.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n" + "\n".join(f"  {k:<9} {v}" for k, v in COMMANDS.items()),
    )
    p.add_argument(
        "command", choices=list(COMMANDS), metavar="COMMAND", help="one of: " + ", ".join(COMMANDS)
    )
    p.add_argument("--version", action="version", version=f"tokencredit {__version__}")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        _top_parser().print_help()
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"tokencredit {__version__}")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        _top_parser().parse_args([cmd])  # prints the usage error and exits 2
    quiet_third_party_warnings()
    try:
        # before the command imports transformers, which reads its progress-bar switch once
        hf_progress.quiet_by_default()
        # one command's dependencies only (transformers for train, not for `tokencredit recipes`)
        module = importlib.import_module(f"tokencredit.commands.{cmd.replace('-', '_')}")
        parser = argparse.ArgumentParser(prog=f"tokencredit {cmd}", description=COMMANDS[cmd])
        module.add_arguments(parser)
        args = parser.parse_args(rest)
        return int(module.run(args) or 0)
    except ConfigError as e:
        print(f"tokencredit {cmd}: configuration error: {e}", file=sys.stderr)
        return 2
    except TrainingError as e:
        # One line, not a traceback: the message names the step and where the last good state is.
        print(f"tokencredit {cmd}: training stopped: {e}", file=sys.stderr)
        return 1
    except Interrupted as e:
        print(f"tokencredit {cmd}: {e}", file=sys.stderr)
        return e.exit_code
    except Exception as e:
        if os.environ.get("TOKENCREDIT_DEBUG"):
            raise
        if isinstance(e, OSError) and e.filename:
            print(f"tokencredit {cmd}: {e.filename}: {e.strerror or e}", file=sys.stderr)
            return 2
        first = (str(e).strip().splitlines() or [""])[0][:300]
        print(
            f"tokencredit {cmd}: internal error ({type(e).__name__}: {first}); this is a bug in tokencredit, "
            "please report it with the traceback that TOKENCREDIT_DEBUG=1 shows",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""`python -m tokencredit.models build-toy ...`: the same command as `tokencredit build-toy ...`.

An entry script, not a library module: it hands its arguments to the command line, which lives
above the models (`tokencredit.commands.build_toy`).
"""

import sys

from tokencredit.cli import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    if not argv or argv[0] != "build-toy":
        print("usage: python -m tokencredit.models build-toy [--task toy|toy-hard] [--out DIR] ...", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(argv))

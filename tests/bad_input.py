"""The bad-input corpus's one check, shared by tests/commands/test_corpus_*.py: run the real CLI
entry point (`tokencredit.cli.main`, in this process) and require exit code 2 (or the one given),
exactly one line on stderr that names the input, and no traceback.

`TOKENCREDIT_DEBUG` is cleared, so the CLI's last net (one "internal error" line, exit 1) is what a
case that escapes every check meets: such a case fails here on its exit code and its wording."""

from __future__ import annotations

import re
from collections.abc import Iterable

import pytest

from tokencredit import cli

# transformers' "Loading weights: 100%|...|" progress bars go to stderr too; they are not ours
PROGRESS_BAR = re.compile(r"\d+%\|")


def one_line_error(
    argv: list[str],
    capsys: pytest.CaptureFixture[str],
    *,
    names: Iterable[str] = (),
    code: int = 2,
) -> str:
    """Run `tokencredit ARGV`; assert exit `code`, one stderr line containing every string of `names`,
    no traceback and no "internal error". Returns that line."""
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("TOKENCREDIT_DEBUG", raising=False)
        rc = cli.main(list(argv))
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip() and not PROGRESS_BAR.search(x)]
    assert "Traceback" not in err, err
    assert len(lines) == 1, lines
    line = lines[0]
    assert "internal error" not in line, line
    assert rc == code, (rc, line)
    for n in names:
        assert n in line, (n, line)
    return line

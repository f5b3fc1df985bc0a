"""Exceptions shared across tokencredit."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration names something that does not exist or cannot work together."""


class TrainingError(RuntimeError):
    """Training cannot continue (non-finite rewards, logits, log-probs or loss); the message names
    the step, and the last good state (checkpoint and metrics of earlier steps) is kept."""


class WriteFailedError(TrainingError):
    """A write into the run directory failed for a reason outside the program (the file system turned
    read-only, permission was taken away, an I/O error); `path` is the file being written. The write
    was undone (the previous version of the file, if any, is intact), so the run resumes once the
    cause is fixed."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


class DiskFullError(WriteFailedError):
    """A write failed because the disk (or the quota) is full; `path` is the file being written.
    The write was undone (the previous version of the file, if any, is intact)."""


class Interrupted(BaseException):
    """A run stopped on SIGINT / SIGTERM after saving its last finished step; the message says how
    to continue. A BaseException, like KeyboardInterrupt, so that no `except Exception` swallows it.
    `exit_code` is the shell's convention for a death by that signal (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


def closest(name: str, choices: Iterable[str]) -> str:
    """' (closest: a, b)' for an error message, or '' when nothing is close."""
    close = difflib.get_close_matches(name, list(choices), n=3, cutoff=0.5)
    return f" (closest: {', '.join(close)})" if close else ""

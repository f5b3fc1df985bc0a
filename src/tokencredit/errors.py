"""Exceptions shared across tokencredit."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration names something that does not exist or cannot work together."""


class TrainingError(RuntimeError):
    """Training cannot continue (non-finite rewards, logits, log-probs or loss); the message names
    the step, and the last good state (checkpoint and metrics of earlier steps) is kept."""


def closest(name: str, choices: Iterable[str]) -> str:
    """' (closest: a, b)' for an error message, or '' when nothing is close."""
    close = difflib.get_close_matches(name, list(choices), n=3, cutoff=0.5)
    return f" (closest: {', '.join(close)})" if close else ""

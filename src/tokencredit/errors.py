"""Exceptions shared across tokencredit."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration names something that does not exist or cannot work together."""


def closest(name: str, choices: Iterable[str]) -> str:
    """' (closest: a, b)' for an error message, or '' when nothing is close."""
    close = difflib.get_close_matches(name, list(choices), n=3, cutoff=0.5)
    return f" (closest: {', '.join(close)})" if close else ""

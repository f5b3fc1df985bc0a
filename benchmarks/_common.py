"""Helpers shared by the benchmark scripts (run as `python benchmarks/X.py`, so this folder is on sys.path)."""

from __future__ import annotations


def load_average() -> str:
    """The 1-minute load average from /proc/loadavg, or "?" where it cannot be read."""
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[0]
    except OSError:
        return "?"

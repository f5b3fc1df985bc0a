"""Helpers shared by the benchmark scripts (run as `python benchmarks/X.py`, so this folder is on sys.path)."""

from __future__ import annotations


def load_average() -> str:
    """The 1-minute load average from /proc/loadavg, or "?" where it cannot be read."""
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[0]
    except OSError:
        return "?"


def mem_available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo in bytes, or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None

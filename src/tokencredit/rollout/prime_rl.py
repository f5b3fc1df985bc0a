"""prime-rl's per-token exports, their layout: ``OUTPUT_DIR/token_exports/step_<step>/rank_<rank>.jsonl``, one
JSON object per trained sequence, and ``STABLE`` in a step's directory once every rank has written (schema
version 1, as read from src/prime_rl/trainer/rl/token_export.py of PrimeIntellect-ai/prime-rl at commit
559b44772e471d1538537b8805cc77f3824a5e64). Which files make a step, and whether a file or a record is an
export; `tokencredit.explain.prime_rl` reads the records as explain's groups. Standard library only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokencredit.errors import ConfigError

__all__ = ["SCHEMA_VERSION", "export_files", "export_record", "export_root", "is_record"]

SCHEMA_VERSION = 1  # prime-rl's token_export.SCHEMA_VERSION this reader knows
_STEP_DIR = re.compile(r"step_(\d+)")
_RANK_FILE = re.compile(r"rank_(\d+)\.jsonl")
_NAMED_STEPS = 8  # steps named in an error, the rest counted


def is_record(obj: Any) -> bool:
    """Whether a parsed JSONL value is meant as a prime-rl token-export record (not one of our rollout groups):
    one of its identifying keys, so that a record missing another field is named as such."""
    if not isinstance(obj, dict) or "completions" in obj:
        return False
    return "loss_mask" in obj or "schema_version" in obj or ("token_ids" in obj and "advantages" in obj)


def _rank_files(d: Path) -> list[Path]:
    found = [(int(m.group(1)), f) for f in d.iterdir() if (m := _RANK_FILE.fullmatch(f.name)) and f.is_file()]
    return [f for _, f in sorted(found)]


def _steps(root: Path) -> dict[int, Path]:
    """{step: its directory} of the step_N directories under `root` that hold rank files."""
    if not root.is_dir():
        return {}
    found = {}
    for d in root.iterdir():
        m = _STEP_DIR.fullmatch(d.name)
        if m and d.is_dir() and _rank_files(d):
            found[int(m.group(1))] = d
    return found


def _named(steps: Sequence[int]) -> str:
    more = f" and {len(steps) - _NAMED_STEPS} more" if len(steps) > _NAMED_STEPS else ""
    return ", ".join(map(str, steps[:_NAMED_STEPS])) + more


def export_root(path: Path) -> Path:
    """The directory holding the step_N directories of the export `path` names (OUTPUT_DIR, its token_exports/,
    or one step_N/ directory)."""
    if _STEP_DIR.fullmatch(path.name) and _rank_files(path):
        return path.parent
    return path / "token_exports" if _steps(path / "token_exports") else path


def export_files(path: Path, step: int | None, notes: list[str]) -> tuple[int, list[Path]]:
    """(step, its rank files in rank order) of a prime-rl export directory: OUTPUT_DIR, its token_exports/, or
    one step_N/ directory. Without `step` the latest step whose directory has prime-rl's STABLE marker (every
    rank written), else the latest; a newer step without it is noted. ConfigError when there is no such layout."""
    m = _STEP_DIR.fullmatch(path.name)
    if m and _rank_files(path):
        if step is not None and step != int(m.group(1)):
            raise ConfigError(f"--step {step}: {path} holds step {m.group(1)} only")
        return int(m.group(1)), _rank_files(path)
    root = export_root(path)
    steps = _steps(root)
    if not steps:
        raise ConfigError(
            f"--jsonl {path}: a directory, but not prime-rl's token exports (step_N/rank_R.jsonl, or "
            "token_exports/step_N/rank_R.jsonl); a tokencredit run directory is given without --jsonl"
        )
    if step is not None:
        if step not in steps:
            raise ConfigError(f"--step {step}: no step_{step} in {root}; its steps: {_named(sorted(steps))}")
        return step, _rank_files(steps[step])
    stable = [n for n, d in steps.items() if (d / "STABLE").is_file()]
    step = max(stable) if stable else max(steps)
    if step < max(steps):
        notes.append(
            f"{steps[max(steps)]} has no STABLE marker (prime-rl may still be writing it): step {step} shown, "
            "the latest complete one; --step chooses another"
        )
    return step, _rank_files(steps[step])


def export_record(path: Path) -> str | None:
    """file:line of the first record when `path` is prime-rl's token export (a JSONL file whose first record is
    one, or an export directory), else None; a file that cannot be read as JSON lines is left to its loader."""
    if path.is_dir():
        m = _STEP_DIR.fullmatch(path.name)
        steps = _steps(path / "token_exports") or _steps(path)
        dirs = [path] if m and _rank_files(path) else [steps[n] for n in sorted(steps)]
        files = [f for d in dirs for f in _rank_files(d)]
        return f"{files[0]}:1" if files else None
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    return f"{path}:{lineno}" if is_record(json.loads(line)) else None
    except (OSError, ValueError, RecursionError):
        return None
    return None

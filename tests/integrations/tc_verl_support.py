"""Helpers of the verl tests that start fresh processes (test_verl_entry_point.py, test_verl_e2e.py)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_GROUP = "verl.plugins"


def declared_entry_points() -> dict[str, dict[str, str]]:
    """The [project.entry-points] tables of pyproject.toml."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]


def entry_point_dir(root: Path) -> Path:
    """A directory holding a ``tokencredit`` dist-info with pyproject.toml's entry points, to put first
    on PYTHONPATH: a child process then discovers exactly what ``pip install`` of this checkout declares
    (importlib.metadata keeps the first distribution of a name), installed or not."""
    info = root / "tokencredit-0.0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tokencredit\nVersion: 0.0.0\n")
    lines = []
    for group, entries in declared_entry_points().items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in entries.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return root


def child_env(*, pythonpath: list[Path], drop: tuple[str, ...] = (), **extra: str) -> dict[str, str]:
    """os.environ for a child process: `pythonpath` first (then this checkout's src and the inherited path),
    the variables in `drop` removed, `extra` set."""
    env = {k: v for k, v in os.environ.items() if k not in drop}
    parts = [str(p) for p in pythonpath] + [str(ROOT / "src")]
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.update(extra)
    return env

"""The ``--jsonl`` input of `tokencredit explain`: a JSONL file in our rollouts format
(`tokencredit.explain.inputs`), or prime-rl's token exports (`tokencredit.explain.prime_rl`: one file, or
a directory of step_N/rank_R.jsonl), told apart by the records' keys."""

from __future__ import annotations

from pathlib import Path

from tokencredit.errors import ConfigError
from tokencredit.explain import prime_rl
from tokencredit.explain.inputs import GroupInput, data_error, groups_of_lines, read_lines
from tokencredit.rollout.prime_rl import is_record

__all__ = ["load_jsonl"]


def load_jsonl(
    path: str | Path, *, step: int | None = None, notes: list[str] | None = None
) -> list[GroupInput]:
    """Groups from a JSONL of prompts, completions and rewards (see the module docstring), or from prime-rl's
    token exports (a file, or a directory of step_N/rank_R.jsonl: `step`, default the latest; detected from the
    records' keys, `tokencredit.explain.prime_rl`), with what the reader noted appended to `notes`; errors name
    file:line."""
    p = Path(path)
    notes = [] if notes is None else notes
    if p.is_dir():
        try:
            return prime_rl.load_export(p, step, notes)
        except OSError as e:
            raise ConfigError(f"--jsonl {p}: cannot read it ({e.strerror or e})") from None
    if p.exists() and not p.is_file():
        raise ConfigError(f"--jsonl {p}: not a regular file (a device or a pipe?); give a JSONL file")
    if not p.is_file():
        raise ConfigError(f"--jsonl: file not found: {p}")
    try:
        lines = read_lines(p)
    except OSError as e:
        raise ConfigError(f"--jsonl {p}: cannot read it ({e.strerror or e})") from None
    if lines and is_record(lines[0][1]):
        return prime_rl.groups_of([(p, lines)], notes)
    if step is not None:
        raise ConfigError(
            f"--step selects a step of a run directory or of a prime-rl export directory; {p} is one file"
        )
    groups = groups_of_lines(lines, p)
    for g in groups:
        if g.prompt is None and g.problem is None:
            raise data_error(g.where, "needs a 'prompt' (the literal prompt text) or a 'problem' (templated)")
    return groups

"""Load math problems from JSONL, Parquet or a `datasets` directory saved with ``save_to_disk``.

Field mapping (first present wins unless a field is named explicitly):
  id:      id, idx, unique_id, problem_id (else ``<file stem>-<row>``)
  problem: problem, question, prompt (a chat message list uses its last user message)
  answer:  answer, ground_truth, reward_model.ground_truth, solution, final_answer
A dotted name reads a nested field. A MATH-style solution (a field named "solution", or any
answer text containing ``\\boxed``) gives its last boxed answer; a GSM8K solution ("... #### 72")
gives the text after ``####``. Errors name the file and line (JSONL; file:line:column for malformed
JSON) or row, or the problem id.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokencredit.errors import ConfigError
from tokencredit.rewards.extract import last_boxed

PROBLEM_FIELDS = ("problem", "question", "prompt")
ANSWER_FIELDS = ("answer", "ground_truth", "reward_model.ground_truth", "solution", "final_answer")
ID_FIELDS = ("id", "idx", "unique_id", "problem_id")


class DataError(ConfigError):
    """A data file is malformed or a problem cannot be used (the message names file:line or id)."""


@dataclass(frozen=True)
class Problem:
    """One math problem: `answer` is a string or a list of acceptable strings."""

    id: str
    problem: str
    answer: str | list[str]


_MISSING = object()


def _get(row: dict, name: str) -> Any:
    if name in row:
        return row[name]
    cur: Any = row
    for part in name.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return _MISSING
        cur = cur[part]
    return cur


def _first(row: dict, names: Sequence[str]) -> tuple[str | None, Any]:
    for n in names:
        v = _get(row, n)
        if v is not _MISSING and v is not None:
            return n, v
    return None, _MISSING


def _prompt_text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        users = [m.get("content") for m in value if m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1]
    raise DataError(f"{where}: problem must be a string or a chat message list, got {type(value).__name__}")


def _answer_from_text(text: str, from_solution: bool) -> str | None:
    if from_solution or "\\boxed" in text or "\\fbox" in text:
        boxed = last_boxed(text)
        if boxed is not None:
            return boxed.strip() or None
        if from_solution and "####" not in text:
            return None
    if "####" in text:
        return text.rsplit("####", 1)[1].strip() or None
    return text.strip() or None


def _answer(value: Any, from_solution: bool, where: str) -> str | list[str] | None:
    if isinstance(value, bool):
        raise DataError(f"{where}: answer must be a string, number or list, got bool")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise DataError(f"{where}: answer is {value}")
        return str(value)
    if isinstance(value, str):
        return _answer_from_text(value, from_solution)
    if isinstance(value, list | tuple):
        out = []
        for v in value:
            a = _answer(v, from_solution, where)
            if isinstance(a, list):
                out.extend(a)
            elif a is not None:
                out.append(a)
        return out or None
    raise DataError(f"{where}: answer must be a string, number or list, got {type(value).__name__}")


def problem_from_row(
    row: dict,
    *,
    default_id: str,
    where: str,
    problem_field: str | None = None,
    answer_field: str | None = None,
    id_field: str | None = None,
) -> Problem:
    """Map one record to a `Problem` (see the module docstring for the field mapping)."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    _, pid = _first(row, [id_field] if id_field else ID_FIELDS)
    pid = default_id if pid is _MISSING else str(pid)
    pname, pval = _first(row, [problem_field] if problem_field else PROBLEM_FIELDS)
    if pname is None:
        fields = problem_field or "/".join(PROBLEM_FIELDS)
        raise DataError(f"{where}: problem {pid!r} has no problem text (field {fields}); keys: {sorted(row)}")
    text = _prompt_text(pval, where)
    if not text.strip():
        raise DataError(f"{where}: problem {pid!r} has an empty problem text")
    aname, aval = _first(row, [answer_field] if answer_field else ANSWER_FIELDS)
    if aname is None:
        fields = answer_field or "/".join(ANSWER_FIELDS)
        raise DataError(f"{where}: problem {pid!r} has no answer (field {fields})")
    ans = _answer(aval, from_solution=aname.split(".")[-1] == "solution", where=where)
    if ans is None:
        raise DataError(f"{where}: problem {pid!r} has an empty answer (or a solution without \\boxed{{}})")
    return Problem(id=pid, problem=text, answer=ans)


def parse_json_line(line: str) -> Any:
    """One JSONL line's value, its line terminator left out first: json.loads skips trailing white space
    before it reports a line cut off mid-value, so with the newline it would point at "line 2, column 1"."""
    return json.loads(line.rstrip("\r\n"))


def json_line_error(path: str | os.PathLike, lineno: int, line: str, e: json.JSONDecodeError) -> str:
    """``path:line:column: malformed JSON line (why)`` for a line that `parse_json_line` refused: the
    column is `e.colno`, 1-based, in characters, as editors count it (one past the last character for a
    line cut off); a trailing comma (where JSON wants another key or value but finds ``}`` or ``]``) is
    named as such, since the decoder points past it."""
    why = e.msg
    before = line[: e.pos].rstrip()
    if before.endswith(",") and line[e.pos : e.pos + 1] in ("}", "]"):
        why += f"; a trailing comma at column {len(before)}?"
    return f"{path}:{lineno}:{e.colno}: malformed JSON line ({why})"


def _jsonl_rows(path: Path) -> Iterator[tuple[dict, str, int]]:
    # utf-8-sig: a byte-order mark that some editors write is not part of the first line's JSON
    with open(path, encoding="utf-8-sig") as f:
        row_i = 0
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = parse_json_line(line)
            except json.JSONDecodeError as e:
                raise DataError(json_line_error(path, lineno, line, e)) from None
            yield row, f"{path}:{lineno}", row_i
            row_i += 1


def _parquet_rows(path: Path) -> Iterator[tuple[dict, str, int]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise DataError(f"{path}: reading Parquet needs pyarrow (pip install 'tokencredit[data]')") from e
    try:
        table = pq.read_table(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise DataError(f"{path}: cannot read Parquet file ({e})") from e
    for i, row in enumerate(table.to_pylist()):
        yield row, f"{path} row {i}", i


def _datasets_rows(path: Path, split: str | None) -> Iterator[tuple[dict, str, int]]:
    try:
        import datasets
    except ImportError as e:
        raise DataError(
            f"{path}: reading a datasets directory needs `datasets` (pip install 'tokencredit[data]')"
        ) from e
    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        splits = list(ds.keys())
        if split is None:
            split = "train" if "train" in ds else (splits[0] if len(splits) == 1 else None)
            if split is None:
                raise DataError(f"{path}: several splits {splits}; choose one with split=")
        if split not in ds:
            raise DataError(f"{path}: no split {split!r}; available: {splits}")
        ds = ds[split]
    for i, row in enumerate(ds):
        yield dict(row), f"{path} row {i}", i


def _rows(path: Path, split: str | None) -> Iterable[tuple[dict, str, int]]:
    if path.is_dir():
        return _datasets_rows(path, split)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return _jsonl_rows(path)
    if suffix in (".parquet", ".pq"):
        return _parquet_rows(path)
    raise DataError(f"{path}: unknown data format {suffix!r}; use .jsonl, .parquet or a datasets directory")


def load_problems(
    path: str | os.PathLike,
    *,
    problem_field: str | None = None,
    answer_field: str | None = None,
    id_field: str | None = None,
    split: str | None = None,
    limit: int | None = None,
) -> list[Problem]:
    """Problems from a JSONL / Parquet file or a ``datasets.save_to_disk`` directory.

    `limit` keeps the first problems; ids must be unique (an error names the duplicate).
    """
    p = Path(path)
    if str(path).startswith("reasoning-gym:"):
        raise DataError(f"{path!r} is reasoning-gym data, not a file: load it with tokencredit.data.reasoning_gym.load")
    if not p.exists():
        raise DataError(f"{p}: no such file or directory")
    if limit is not None and limit < 0:
        raise DataError(f"limit must be >= 0, got {limit}")
    out: list[Problem] = []
    seen: dict[str, str] = {}
    for row, where, i in _rows(p, split):
        if limit is not None and len(out) >= limit:
            break
        prob = problem_from_row(
            row,
            default_id=f"{p.stem}-{i}",
            where=where,
            problem_field=problem_field,
            answer_field=answer_field,
            id_field=id_field,
        )
        if prob.id in seen:
            raise DataError(f"{where}: duplicate problem id {prob.id!r} (first at {seen[prob.id]})")
        seen[prob.id] = where
        out.append(prob)
    return out

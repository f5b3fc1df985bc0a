"""Load math problems from JSONL, Parquet or a `datasets` directory saved with ``save_to_disk``.

Field mapping (first present wins unless a field is named explicitly):
  id:      id, idx, unique_id, problem_id (else ``<file stem>-<row>``)
  problem: problem, question, prompt (a chat message list uses its last user message)
  answer:  answer, ground_truth, reward_model.ground_truth, solution, final_answer
A dotted name reads a nested field. A MATH-style solution (a field named "solution", or any
answer text containing ``\\boxed``) gives its last boxed answer; a GSM8K solution ("... #### 72")
gives the text after ``####``. Errors name the file and line (JSONL; file:line:column for malformed
JSON) or row, or the problem id: also a file that is not UTF-8 text (Latin-1, UTF-16, binary; the first
bad byte's line and column), a line that is not a JSON object or is nested too deeply to read, and a
directory that is not a `datasets` directory (before `datasets` is imported).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from tokencredit import hub
from tokencredit.errors import ConfigError, closest
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
        raise DataError(
            f"{where}: problem {pid!r} has no problem text (field {fields}); keys: {sorted(row)}; "
            "name the field that holds it with data.problem_field (a dotted name reads a nested one)"
        )
    text = _prompt_text(pval, where)
    if not text.strip():
        raise DataError(f"{where}: problem {pid!r} has an empty problem text")
    aname, aval = _first(row, [answer_field] if answer_field else ANSWER_FIELDS)
    if aname is None:
        fields = answer_field or "/".join(ANSWER_FIELDS)
        raise DataError(
            f"{where}: problem {pid!r} has no answer (field {fields}); keys: {sorted(row)}; "
            "name the field that holds it with data.answer_field"
        )
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


def _not_utf8(path: Path) -> str:
    """``path:line:column: not UTF-8 text (...)`` for the first line of `path` that is not UTF-8 (read again
    in binary: the text reader's error gives no line)."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                col = len(raw[: e.start].decode("utf-8")) + 1
                if lineno == 1 and raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
                    hint = "UTF-16 text: save it as UTF-8"
                elif b"\0" in raw:
                    hint = "a binary file? JSON lines are UTF-8 text, one object per line"
                else:
                    hint = "JSON lines must be UTF-8; a Latin-1 file converts with `iconv -f latin1 -t utf-8`"
                return f"{path}:{lineno}:{col}: not UTF-8 text (byte 0x{raw[e.start]:02x}; {hint})"
    return f"{path}: not UTF-8 text"


def _jsonl_rows(path: Path) -> Iterator[tuple[dict, str, int]]:
    # utf-8-sig: a byte-order mark that some editors write is not part of the first line's JSON
    with open(path, encoding="utf-8-sig") as f:
        row_i = 0
        lineno = 0
        try:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                if "\0" in line:
                    col = line.index("\0") + 1
                    raise DataError(
                        f"{path}:{lineno}:{col}: a NUL character: a binary file, not JSON lines (UTF-8 text)"
                    )
                try:
                    row = parse_json_line(line)
                except json.JSONDecodeError as e:
                    raise DataError(json_line_error(path, lineno, line, e)) from None
                except RecursionError:
                    raise DataError(
                        f"{path}:{lineno}: JSON nested too deeply to read (arrays / objects inside each other)"
                    ) from None
                if not isinstance(row, dict):
                    hint = (
                        "; a JSON array of problems? this reader wants JSON lines: one object per line"
                        if isinstance(row, list) and row_i == 0
                        else ""
                    )
                    raise DataError(
                        f"{path}:{lineno}: expected a JSON object (one problem per line), got {_json_kind(row)}{hint}"
                    )
                yield row, f"{path}:{lineno}", row_i
                row_i += 1
        except UnicodeDecodeError:
            raise DataError(_not_utf8(path)) from None


def _json_kind(value: Any) -> str:
    """A JSON value's kind in JSON's words (an array, a string...)."""
    kinds = ((bool, "true/false"), (int | float, "a number"), (str, "a string"), (list, "an array"))
    if value is None:
        return "null"
    return next((name for t, name in kinds if isinstance(value, t)), type(value).__name__)


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
    markers = ("dataset_dict.json", "state.json", "dataset_info.json")
    if not any((path / m).is_file() for m in markers):
        files = sorted(p.name for p in path.iterdir())[:5] if os.access(path, os.R_OK | os.X_OK) else []
        more = ", ..." if len(files) == 5 else ""
        holds = f"; it holds {', '.join(files)}{more}" if files else " (it is empty)"
        raise DataError(
            f"{path}: a directory, but not a `datasets` directory saved with save_to_disk (no {' / '.join(markers)})"
            f"{holds}; give a .jsonl or .parquet file"
        )
    try:
        import datasets
    except ImportError as e:
        raise DataError(
            f"{path}: reading a datasets directory needs `datasets` (pip install 'tokencredit[data]')"
        ) from e
    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        ds = ds[_choose_split(list(ds.keys()), split, str(path), "choose one with split=")]
    for i, row in enumerate(ds):
        yield dict(row), f"{path} row {i}", i


def _choose_split(splits: list[str], split: str | None, where: str, how: str) -> str:
    """`split`, or by default "train" (or the only split); a DataError listing the splits otherwise."""
    if split is None:
        split = "train" if "train" in splits else (splits[0] if len(splits) == 1 else None)
        if split is None:
            raise DataError(f"{where}: several splits {splits}; {how}")
    if split not in splits:
        raise DataError(f"{where}: no split {split!r}; available: {splits}{closest(split, splits)}")
    return split


# A Hugging Face dataset id, ORG/NAME[@REVISION][?config=NAME&split=NAME]; read from the local hub cache.
_HUB_DATASET = re.compile(
    r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[^\s@?]+))?(?:\?(?P<query>\S*))?"
)
HUB_DATASET_OPTIONS = ("config", "split")
DATA_SUFFIXES = (".jsonl", ".json", ".ndjson", ".parquet", ".pq")


def _hub_dataset(spec: str) -> re.Match[str] | None:
    """The parts of `spec` when it reads as a hub dataset id rather than a data file's path."""
    m = _HUB_DATASET.fullmatch(spec)
    if m is None or m["repo"].lower().endswith(DATA_SUFFIXES):
        return None
    return m


def _hub_dataset_rows(
    spec: str, m: re.Match[str], split: str | None
) -> tuple[Iterator[tuple[dict, str, int]], str]:
    """(the rows, the split read) of the cached Hugging Face dataset `spec` (`_HUB_DATASET`), read by
    `datasets` from the snapshot folder in the hub cache; a DataError with the ``hf download`` command when
    it is not cached."""
    repo, revision = m["repo"], m["revision"]
    opts: dict[str, str] = {}
    for key, value in parse_qsl(m["query"] or "", keep_blank_values=True, strict_parsing=bool(m["query"])):
        if key not in HUB_DATASET_OPTIONS:
            raise DataError(
                f"{spec!r}: unknown option {key!r}{closest(key, HUB_DATASET_OPTIONS)}; "
                f"a Hugging Face dataset takes {', '.join(HUB_DATASET_OPTIONS)}"
            )
        opts[key] = value
    folder = hub.snapshot(repo, revision, "dataset")
    at = f" at revision {revision!r}" if revision else ""
    if folder is None:
        raise DataError(
            f"{spec}: no such file or directory, and no Hugging Face dataset {repo!r}{at} in the local cache "
            f"({hub.hf_hub_cache()}, set by HF_HUB_CACHE or HF_HOME){closest(repo, hub.cached_repos('dataset'))}. "
            "Hub datasets are read only from that cache; tokencredit never downloads: "
            + hub.fetch_hint(repo, revision, "dataset")
        )
    try:
        import datasets
    except ImportError as e:
        raise DataError(
            f"{spec}: reading a Hugging Face dataset needs `datasets` (pip install 'tokencredit[data]')"
        ) from e
    try:
        dd = datasets.load_dataset(str(folder), name=opts.get("config"))
    except ValueError as e:  # e.g. several configs and none chosen: the message lists them
        first = (str(e).strip().splitlines() or [""])[0]
        raise DataError(f"{spec}: {first} (choose with {repo}?config=NAME)") from None
    name = _choose_split(
        list(dd.keys()), opts.get("split") or split, spec, f"choose one with {repo}?split=NAME"
    )
    rows = ((dict(row), f"{spec} ({name}) row {i}", i) for i, row in enumerate(dd[name]))
    return rows, name


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
    """Problems from a JSONL / Parquet file, a ``datasets.save_to_disk`` directory, or a Hugging Face
    dataset in the local hub cache (``ORG/NAME[@REVISION][?config=NAME&split=NAME]``, read with
    `datasets`; `split` defaults to "train" or the only split).

    `limit` keeps the first problems; ids must be unique (an error names the duplicate).
    """
    p = Path(path)
    if str(path).startswith("reasoning-gym:"):
        raise DataError(
            f"{path!r} is reasoning-gym data, not a file: load it with tokencredit.data.reasoning_gym.load"
        )
    if limit is not None and limit < 0:
        raise DataError(f"limit must be >= 0, got {limit}")
    hub_id = None if p.exists() else _hub_dataset(str(path))
    if hub_id is not None:
        # ids without an id field: NAME-SPLIT-ROW, distinct across the splits of one dataset
        rows, split_read = _hub_dataset_rows(str(path), hub_id, split)
        stem = f"{hub_id['repo'].rsplit('/', 1)[-1]}-{split_read}"
    else:
        if not p.exists():
            raise DataError(f"{p}: no such file or directory")
        if not p.is_dir() and not p.is_file():
            raise DataError(f"{p}: not a regular file or directory (a device or a pipe?)")
        if not os.access(p, os.R_OK):
            raise DataError(f"{p}: permission denied (cannot read it)")
        rows, stem = _rows(p, split), p.stem
    out: list[Problem] = []
    seen: dict[str, str] = {}
    for row, where, i in rows:
        if limit is not None and len(out) >= limit:
            break
        prob = problem_from_row(
            row,
            default_id=f"{stem}-{i}",
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

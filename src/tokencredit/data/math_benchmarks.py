"""The math benchmarks shipped with tokencredit (package data, offline).

Converted to JSONL (id, problem, answer) from the evaluation suite and GSM8K training split of the
Apache-2.0 repository sail-sg/oat; provenance and licences in ``math_benchmarks/README.md``.
"""

from __future__ import annotations

from importlib import resources

from tokencredit.data.loaders import DataError, Problem, load_problems
from tokencredit.errors import ConfigError, closest

# name -> number of problems in the shipped file.
COUNTS: dict[str, int] = {
    "math500": 500,
    "aime24": 30,
    "amc23": 83,
    "minerva_math": 272,
    "olympiadbench": 675,
    "gsm8k_train": 8792,
}
NAMES: tuple[str, ...] = tuple(COUNTS)


def path(name: str):
    """The packaged JSONL file of benchmark `name` (an importlib.resources Traversable)."""
    if name not in COUNTS:
        raise ConfigError(f"unknown benchmark {name!r}; available: {', '.join(NAMES)}" + closest(name, NAMES))
    return resources.files("tokencredit.data").joinpath("math_benchmarks", f"{name}.jsonl")


def load(name: str, limit: int | None = None) -> list[Problem]:
    """The problems of a shipped benchmark (the first `limit` when given), in file order."""
    src = path(name)
    with resources.as_file(src) as p:
        if not p.exists():
            raise DataError(f"benchmark file {p} is missing from the installed package")
        return load_problems(p, limit=limit)

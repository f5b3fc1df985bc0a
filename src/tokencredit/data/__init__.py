"""Math problems: loaders (JSONL / Parquet / `datasets` directories), the shipped benchmarks
(`tokencredit.data.math_benchmarks`), prompt templates (`tokencredit.data.templates`), the
synthetic arithmetic task (`tokencredit.data.synthetic`) and reasoning-gym's procedural datasets
(`tokencredit.data.reasoning_gym`, ``reasoning-gym:NAME?key=value``; optional extra).

Kept light on purpose: importing this package imports only the standard library.
"""

from tokencredit.data.loaders import DataError, Problem, load_problems

__all__ = ["DataError", "Problem", "load_problems"]

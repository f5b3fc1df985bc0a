"""Math problems: loaders (JSONL / Parquet / `datasets` directories), the shipped benchmarks
(`tokencredit.data.math_benchmarks`), prompt templates (`tokencredit.data.templates`) and the
synthetic arithmetic task (`tokencredit.data.synthetic`).

Kept light on purpose: importing this package imports only the standard library.
"""

from tokencredit.data.loaders import DataError, Problem, load_problems

__all__ = ["DataError", "Problem", "load_problems"]

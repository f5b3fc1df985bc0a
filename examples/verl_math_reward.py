"""verl custom reward function: tokencredit's math-verify verifier (1.0 correct, 0.0 otherwise).

    reward.custom_reward_function.path=examples/verl_math_reward.py
    reward.custom_reward_function.name=compute_score

verl calls compute_score(data_source, solution_str, ground_truth, extra_info) once per response;
the acceptable answers are extra_info["answers"] when examples/verl_make_parquet.py wrote the data.
"""

from __future__ import annotations

from typing import Any

from tokencredit.rewards import math_reward


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **_: Any
) -> float:
    answers = (extra_info or {}).get("answers")
    gold = list(answers) if answers is not None and len(answers) else ground_truth
    return math_reward([solution_str], [gold])[0]

"""A custom reward function for `tokencredit train` (docs/inputs.md, "Custom rewards").

    PYTHONPATH=examples tokencredit train --set reward.function=custom_reward:boxed_match

The trainer imports ``custom_reward`` (so its directory must be on PYTHONPATH) and calls
``boxed_match(completions, golds)`` once per generation round with every rollout of the round.
tests/rewards/test_custom_reward_example.py trains with it.
"""

from __future__ import annotations

from typing import Any

from tokencredit.rewards.extract import last_boxed


def _normalise(answer: str) -> str:
    """'1,234' / ' 1234 ' / '1234.0' -> '1234': the spellings of one number a strict match would refuse."""
    text = answer.replace(",", "").replace(" ", "")
    return text.removesuffix(".0") if text.removesuffix(".0").lstrip("-").isdigit() else text


def boxed_match(completions: list[str], golds: list[Any], **kwargs: Any) -> list[float]:
    """1.0 when a completion's last ``\\boxed{}`` is its gold answer (a list of golds: any of them), 0.1
    when it boxes a wrong answer (the format was followed), 0.0 with no boxed answer."""
    rewards = []
    for text, gold in zip(completions, golds, strict=True):
        answer = last_boxed(text)
        accepted = {_normalise(str(g)) for g in (gold if isinstance(gold, list) else [gold])}
        if answer is None:
            rewards.append(0.0)
        else:
            rewards.append(1.0 if _normalise(answer) in accepted else 0.1)
    return rewards

"""Custom reward functions for `tokencredit train` (docs/inputs.md, "Custom rewards"), one in each contract.

    PYTHONPATH=examples tokencredit train --set reward.function=custom_reward:boxed_match
    PYTHONPATH=examples tokencredit train --set reward.function=custom_reward:boxed_answer_reward

The trainer imports ``custom_reward`` (so its directory must be on PYTHONPATH) and calls the function once
per generation round with every rollout of the round: ``boxed_match(completions, golds)`` (tokencredit's
contract), ``boxed_answer_reward(prompts=..., completions=..., completion_ids=..., answer=..., ...)``
(TRL's, read from its signature; the same function works as a TRL GRPOTrainer reward function).
tests/rewards/test_custom_reward_example.py and tests/rewards/test_reward_contract.py train with them.
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


def boxed_answer_reward(
    completions: list[str], completion_ids: list[list[int]], answer: list, **kwargs: Any
) -> list[float]:
    """Reward in TRL's contract: 1.0 if the completion boxes the gold answer, minus 0.001 per token."""
    rewards = []
    for text, ids, gold in zip(completions, completion_ids, answer):
        golds = gold if isinstance(gold, list) else [gold]
        right = any(f"\\boxed{{{g}}}" in text for g in golds)
        rewards.append((1.0 if right else 0.0) - 0.001 * len(ids))
    return rewards

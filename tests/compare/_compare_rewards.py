"""Reward for the compare tests (imported by path `_compare_rewards:has_digit_seven`)."""


def has_digit_seven(completions, golds, **_):
    """1.0 when the completion contains a '7': a random tiny model gets it sometimes, not always."""
    return [1.0 if "7" in c else 0.0 for c in completions]

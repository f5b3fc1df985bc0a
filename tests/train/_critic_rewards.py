"""A reward for the critic tests (imported by path `_critic_rewards:fn`): one a value model can learn in a few steps."""


def first_char_is_digit(completions, golds, **_):
    """1.0 when the completion starts with a digit: every state after the first token knows its reward."""
    return [1.0 if c[:1].isdigit() else 0.0 for c in completions]

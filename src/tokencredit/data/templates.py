"""Prompt templates: turn a problem into the text the policy continues.

- "qwen-math": system prompt ``Please reason step by step, and put your final answer within
  \\boxed{}.`` + the problem as the user turn, through the tokenizer's chat template when it has
  one, else a plain "System/User/Assistant" fallback.
- "chat": the problem alone as the user turn through the tokenizer's chat template (no system
  prompt of ours: the model answers as it was tuned to, e.g. "The final answer is: 21"), else a plain
  "User/Assistant" fallback. For instruct models on tasks that do not ask for ``\\boxed{}``
  (reasoning-gym's questions say how to answer).
- "r1-zero": the plain DeepSeek-R1-Zero template for base models, ending in ``Assistant: <think>``;
  the answer goes in ``<answer> </answer>``.
- any other string containing ``{problem}``: a custom template (only ``{problem}`` is replaced,
  so LaTeX braces such as ``\\boxed{}`` need no escaping).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokencredit.errors import ConfigError, closest

QWEN_MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
R1_ZERO = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. "
    "The Assistant first thinks about the reasoning process in the mind and then provides the User "
    "with the answer. The reasoning process is enclosed within <think> </think> and answer is enclosed "
    "within <answer> </answer> tags, respectively, i.e., <think> reasoning process here </think> "
    "<answer> answer here </answer>.\nUser: {problem}\nAssistant: <think>"
)
PLAIN_CHAT_FALLBACK = "System: {system}\n\nUser: {problem}\n\nAssistant:"
PLAIN_USER_FALLBACK = "User: {problem}\n\nAssistant:"
TEMPLATES = ("qwen-math", "chat", "r1-zero")


def check_template(template: str) -> None:
    """Raise ConfigError unless `template` is a known name or a string containing ``{problem}``."""
    if template in TEMPLATES or "{problem}" in template:
        return
    raise ConfigError(
        f"unknown prompt template {template!r}: use one of {', '.join(TEMPLATES)} or a string "
        "containing {problem}" + closest(template, TEMPLATES)
    )


def render(template: str, problem: str, tokenizer: Any = None) -> str:
    """The prompt text for one problem (special tokens included when a chat template adds them)."""
    check_template(template)
    if template == "qwen-math":
        if tokenizer is not None and getattr(tokenizer, "chat_template", None):
            messages = [{"role": "system", "content": QWEN_MATH_SYSTEM}, {"role": "user", "content": problem}]
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return PLAIN_CHAT_FALLBACK.replace("{system}", QWEN_MATH_SYSTEM).replace("{problem}", problem)
    if template == "chat":
        if tokenizer is not None and getattr(tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": problem}]
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return PLAIN_USER_FALLBACK.replace("{problem}", problem)
    if template == "r1-zero":
        return R1_ZERO.replace("{problem}", problem)
    return template.replace("{problem}", problem)


def render_all(template: str, problems: Sequence[str], tokenizer: Any = None) -> list[str]:
    """`render` for each problem text."""
    check_template(template)
    return [render(template, p, tokenizer) for p in problems]

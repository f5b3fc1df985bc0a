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

A tokenizer without a chat template makes "qwen-math" and "chat" fall back to plain text that the
model may never have seen; `chat_template_warning` says so (a warning, not an error: a base model can
still learn to answer the plain prompt, so training is not certain to fail).
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
CHAT_TEMPLATES = ("qwen-math", "chat")  # rendered through the tokenizer's chat template when it has one


def check_template(template: str) -> None:
    """Raise ConfigError unless `template` is a known name or a string containing ``{problem}``."""
    if template in TEMPLATES or "{problem}" in template:
        return
    raise ConfigError(
        f"unknown prompt template {template!r}: use one of {', '.join(TEMPLATES)} or a string "
        "containing {problem}" + closest(template, TEMPLATES)
    )


def has_chat_template(tokenizer: Any) -> bool:
    """Whether `tokenizer` carries a chat template (what "qwen-math" and "chat" render through)."""
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def chat_template_warning(
    template: str, tokenizer: Any, model: str, option: str = "data.template"
) -> str | None:
    """The warning for `template` used with a tokenizer that has no chat template, else None.

    "qwen-math" and "chat" then render the plain fallback ("System: ... User: ... Assistant:"), a
    format an instruct model was not tuned on: its accuracy can stay at 0 with nothing else wrong. It
    stays a warning because a base model can learn to answer the plain prompt (R1-Zero trains from
    one). `model` and `option` (the setting that chose the template) name what to change.
    """
    if template not in CHAT_TEMPLATES or has_chat_template(tokenizer):
        return None
    fallback = "System/User/Assistant" if template == "qwen-math" else "User/Assistant"
    return (
        f"model {model!r} has no chat template, so {option}={template!r} falls back to a plain "
        f"{fallback} prompt the model may never have seen (accuracy can stay at 0); for a base model use "
        f"{option}=r1-zero or a custom template containing {{problem}} in the model's own format, or give "
        "a model whose tokenizer has a chat template"
    )


def render(template: str, problem: str, tokenizer: Any = None) -> str:
    """The prompt text for one problem (special tokens included when a chat template adds them)."""
    check_template(template)
    if template == "qwen-math":
        if has_chat_template(tokenizer):
            messages = [{"role": "system", "content": QWEN_MATH_SYSTEM}, {"role": "user", "content": problem}]
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return PLAIN_CHAT_FALLBACK.replace("{system}", QWEN_MATH_SYSTEM).replace("{problem}", problem)
    if template == "chat":
        if has_chat_template(tokenizer):
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

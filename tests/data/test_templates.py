import pytest

from tokencredit.data.templates import (
    QWEN_MATH_SYSTEM,
    R1_ZERO,
    chat_template_warning,
    check_template,
    render,
    render_all,
)
from tokencredit.errors import ConfigError


class ChatTok:
    chat_template = "x"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        return "".join(f"<|{m['role']}|>{m['content']}" for m in messages) + "<|assistant|>"


class PlainTok:
    chat_template = None


def test_qwen_math_uses_chat_template_when_present():
    out = render("qwen-math", "What is $1+1$?", ChatTok())
    assert out == f"<|system|>{QWEN_MATH_SYSTEM}<|user|>What is $1+1$?<|assistant|>"
    assert QWEN_MATH_SYSTEM == "Please reason step by step, and put your final answer within \\boxed{}."


def test_qwen_math_plain_fallback():
    for tok in (None, PlainTok()):
        out = render("qwen-math", "P?", tok)
        assert QWEN_MATH_SYSTEM in out and "P?" in out and out.rstrip().endswith("Assistant:")


def test_real_hf_chat_template():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    )
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    out = render("qwen-math", "2+2?", tok)
    assert out == (
        f"<|im_start|>system\n{QWEN_MATH_SYSTEM}<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_r1_zero_and_custom():
    out = render("r1-zero", "Find x.")
    assert out == R1_ZERO.replace("{problem}", "Find x.") and out.endswith("Assistant: <think>")
    # Only {problem} is substituted: LaTeX braces in a custom template need no escaping.
    assert render("Q: {problem}\nPut it in \\boxed{}.\nA:", "1+1") == "Q: 1+1\nPut it in \\boxed{}.\nA:"
    assert render_all("{problem}!", ["a", "b"]) == ["a!", "b!"]


def test_unknown_template():
    with pytest.raises(ConfigError, match="unknown prompt template 'qwen_math'.*closest: qwen-math"):
        check_template("qwen_math")
    with pytest.raises(ConfigError):
        render("no placeholder", "x")


def test_chat_template_warning_names_the_model_and_what_to_use():
    for template in ("qwen-math", "chat"):
        w = chat_template_warning(template, PlainTok(), "my/base-model")
        assert w is not None and "model 'my/base-model' has no chat template" in w
        assert f"data.template={template!r} falls back to a plain" in w and "data.template=r1-zero" in w
    assert "--template='chat'" in chat_template_warning("chat", None, "m", option="--template")
    # nothing to say: the tokenizer has a chat template, or the template does not use one
    assert chat_template_warning("qwen-math", ChatTok(), "m") is None
    assert chat_template_warning("r1-zero", PlainTok(), "m") is None
    assert chat_template_warning("Q: {problem}\nA:", PlainTok(), "m") is None

"""`SamplingSettings`: checked fields, and `generate`'s two ways to receive them."""

from dataclasses import FrozenInstanceError, replace

import pytest
import torch

from conftest import byte_tokenizer, tiny_qwen3
from tokencredit.rollout import SamplingSettings, generate, sampling_settings


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("temperature", -0.1, "temperature must be >= 0"),
        ("top_p", 0.0, "top_p must be in (0, 1]"),
        ("top_p", 1.5, "top_p must be in (0, 1]"),
        ("top_k", -1, "top_k must be >= 0"),
        ("max_new_tokens", 0, "max_new_tokens must be >= 1"),
        ("batch_size", 0, "batch_size must be >= 1"),
    ],
)
def test_invalid_fields_are_named(field, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[").replace("]", r"\]")):
        SamplingSettings(**{field: value})
    with pytest.raises(ValueError, match=field):
        replace(SamplingSettings(), **{field: value})  # replace checks again


def test_defaults_frozen_and_greedy():
    s = SamplingSettings()
    assert (s.temperature, s.top_p, s.top_k, s.max_new_tokens, s.batch_size) == (1.0, 1.0, 0, 256, None)
    assert not s.greedy and replace(s, temperature=0.0).greedy
    with pytest.raises(FrozenInstanceError):
        s.temperature = 0.5  # type: ignore[misc]


def test_keyword_fields_or_an_object_not_both():
    assert sampling_settings(None, temperature=0.0, top_p=None) == SamplingSettings(temperature=0.0)
    given = SamplingSettings(max_new_tokens=4)
    assert sampling_settings(given, temperature=None) is given
    with pytest.raises(ValueError, match="either sampling or temperature"):
        sampling_settings(given, temperature=0.5)


def test_generate_same_samples_from_keywords_and_settings():
    tok = byte_tokenizer()
    model = tiny_qwen3(len(tok), max_position_embeddings=256, tie_word_embeddings=True).eval()
    prompts = ["ab", "xyz"]
    a = generate(model, tok, prompts, 2, temperature=1.0, top_p=0.9, max_new_tokens=5, batch_size=3, seed=3)
    s = SamplingSettings(temperature=1.0, top_p=0.9, max_new_tokens=5, batch_size=3)
    b = generate(model, tok, prompts, 2, sampling=s, seed=3)
    assert torch.equal(a.response_ids, b.response_ids) and a.texts == b.texts
    with pytest.raises(ValueError, match="either sampling or max_new_tokens"):
        generate(model, tok, prompts, 2, sampling=s, max_new_tokens=5)

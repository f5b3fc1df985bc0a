import pytest
import torch

from conftest import BYTE_EOS, BYTE_PAD, byte_tokenizer, tiny_qwen3
from tokencredit.rollout import Rollouts, generate, response_mask_from_ids

PAD, EOS = BYTE_PAD, BYTE_EOS


@pytest.fixture(scope="module")
def tiny():
    tok = byte_tokenizer()
    model = tiny_qwen3(len(tok), max_position_embeddings=256, tie_word_embeddings=True)
    return model.eval(), tok


def force_eos_at(model, total_len: int):
    """Forward hook: EOS is impossible until a sequence holds `total_len` real tokens, then certain."""
    seen = {"calls": []}

    def hook(mod, args, kwargs, out):
        pos = kwargs["position_ids"][:, -1]
        # transformers >= 5.2x passes the KV cache as `cache` (`past_key_values` before)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        seen["calls"].append((kwargs["input_ids"].shape[1], cache is not None))
        last = out.logits[:, -1, :]
        last[:, EOS] = torch.where(pos + 1 >= total_len, 1e4, -1e4).to(last.dtype)
        return out

    return model.register_forward_hook(hook, with_kwargs=True), seen


PROMPTS = ["Hi", "Hello", "A long prompt."]  # 2, 5 and 14 byte tokens


def test_shapes_masks_and_eos(tiny):
    model, tok = tiny
    handle, seen = force_eos_at(model, 6)
    try:
        r = generate(model, tok, PROMPTS, 2, temperature=1.0, max_new_tokens=8, seed=0)
    finally:
        handle.remove()
    assert isinstance(r, Rollouts)
    assert r.prompt_ids.shape == (6, 14) and r.prompt_mask.dtype == torch.bool
    assert r.prompt_index.tolist() == [0, 0, 1, 1, 2, 2]
    # Left padding: real prompt tokens are flush right.
    assert r.prompt_mask.sum(1).tolist() == [2, 2, 5, 5, 14, 14]
    assert r.prompt_mask[:, -1].all() and not r.prompt_mask[0, 0]
    assert (r.prompt_ids[~r.prompt_mask] == PAD).all()
    # EOS after 6 real tokens: responses of 5, 2 and 1 tokens, EOS included and last.
    lengths = [5, 5, 2, 2, 1, 1]
    assert r.response_ids.shape == (6, 5)
    assert r.response_lengths.tolist() == lengths
    for i, n in enumerate(lengths):
        assert r.response_mask[i, :n].all() and not r.response_mask[i, n:].any()
        assert r.response_ids[i, n - 1] == EOS and (r.response_ids[i, : n - 1] != EOS).all()
        assert (r.response_ids[i, n:] == PAD).all()
    assert not r.truncated.any()
    assert r.texts[4] == "" and len(r.texts[0]) >= 1 and "<eos>" not in "".join(r.texts)
    # KV cache: after the prefill, each step feeds a single token with a cache.
    assert seen["calls"][0][0] == 14 and all(n == 1 and cache for n, cache in seen["calls"][1:])
    assert tok.padding_side == "right"


def test_truncation_flag(tiny):
    model, tok = tiny
    handle, _ = force_eos_at(model, 6)
    try:
        r = generate(model, tok, PROMPTS, 1, temperature=0.0, max_new_tokens=3)
    finally:
        handle.remove()
    assert r.response_ids.shape == (3, 3)
    assert r.truncated.tolist() == [True, False, False]
    assert r.response_mask.tolist() == [[True] * 3, [True, True, False], [True, False, False]]


def test_pad_equal_to_eos(tiny):
    model, _ = tiny
    tok = byte_tokenizer(with_pad=False)
    handle, _ = force_eos_at(model, 6)
    try:
        r = generate(model, tok, PROMPTS, 1, temperature=0.0, max_new_tokens=8)
    finally:
        handle.remove()
    assert r.pad_token_id == EOS
    assert r.response_lengths.tolist() == [5, 2, 1]
    assert (r.response_ids[~r.response_mask] == EOS).all()
    assert tok.pad_token is None and tok.padding_side == "right"


def test_response_mask_from_ids():
    ids = torch.tensor([[5, 1, 0, 0], [5, 6, 7, 8], [1, 1, 1, 1]])
    mask, trunc = response_mask_from_ids(ids, [1])
    assert mask.tolist() == [[True, True, False, False], [True] * 4, [True, False, False, False]]
    assert trunc.tolist() == [False, True, False]


def test_seed_determinism_and_global_rng_untouched(tiny):
    model, tok = tiny
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a = generate(model, tok, PROMPTS, 2, temperature=1.0, max_new_tokens=10, seed=7)
    assert torch.equal(torch.rand(3), expected_next)  # sampling used a forked RNG
    b = generate(model, tok, PROMPTS, 2, temperature=1.0, max_new_tokens=10, seed=7)
    c = generate(model, tok, PROMPTS, 2, temperature=1.0, max_new_tokens=10, seed=8)
    assert torch.equal(a.response_ids, b.response_ids) and a.texts == b.texts
    assert not torch.equal(a.response_ids, c.response_ids)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    d = generate(model, tok, PROMPTS, 2, temperature=1.0, max_new_tokens=10, generator=g1)
    e = generate(model, tok, PROMPTS, 2, temperature=1.0, max_new_tokens=10, generator=g2)
    assert torch.equal(d.response_ids, e.response_ids)
    with pytest.raises(ValueError, match="either seed or generator"):
        generate(model, tok, PROMPTS, 1, seed=1, generator=g1)


def test_greedy_is_argmax_and_batch_size_chunks(tiny):
    model, tok = tiny
    r = generate(model, tok, PROMPTS, 3, temperature=0.0, max_new_tokens=6)
    # All samples of a prompt agree, and the first token is the model's argmax.
    for p in range(3):
        assert torch.equal(r.response_ids[3 * p], r.response_ids[3 * p + 2])
    enc = tok(PROMPTS[1], return_tensors="pt")
    with torch.no_grad():
        first = model(**enc).logits[0, -1].argmax()
    assert r.response_ids[3, 0] == first
    chunked = generate(model, tok, PROMPTS, 3, temperature=0.0, max_new_tokens=6, batch_size=4)
    assert torch.equal(chunked.response_ids, r.response_ids)
    assert torch.equal(chunked.response_mask, r.response_mask)


class CountingTokenizer:
    """Forwards everything to a tokenizer and records each text it is asked to encode."""

    def __init__(self, tok):
        object.__setattr__(self, "_tok", tok)
        object.__setattr__(self, "encoded", [])

    def __call__(self, text, **kw):
        self.encoded.extend(text if isinstance(text, list) else [text])
        return self._tok(text, **kw)

    def encode(self, text, **kw):
        self.encoded.append(text)
        return self._tok.encode(text, **kw)

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __setattr__(self, name, value):
        setattr(self._tok, name, value)


def test_prompt_tokenised_once(tiny):
    model, tok = tiny
    counting = CountingTokenizer(tok)
    r = generate(model, counting, PROMPTS, 4, temperature=1.0, max_new_tokens=3, seed=0, batch_size=5)
    assert counting.encoded == PROMPTS
    assert r.prompt_ids.shape[0] == 12
    assert torch.equal(r.prompt_ids[0], r.prompt_ids[3]) and torch.equal(r.prompt_ids[4], r.prompt_ids[7])


def test_training_mode_restored_and_errors(tiny):
    model, tok = tiny
    model.train()
    try:
        generate(model, tok, ["x"], 1, temperature=0.0, max_new_tokens=2)
        assert model.training
    finally:
        model.eval()
    with pytest.raises(ValueError, match="num_samples"):
        generate(model, tok, ["x"], 0)
    with pytest.raises(ValueError, match="no prompts"):
        generate(model, tok, [], 1)
    with pytest.raises(ValueError, match="top_p"):
        generate(model, tok, ["x"], 1, top_p=0.0)

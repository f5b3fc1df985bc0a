"""Shared-prefix decoding attention (`tokencredit.rollout.cascade`): the same attention as SDPA over
the repeated prompt rows, the cache layer's bookkeeping, and when it is (not) used. That `generate`
returns the same tokens as plain ``model.generate`` with it is tests/test_rollout.py's job."""

import copy

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from conftest import BYTE_EOS, byte_tokenizer, tiny_qwen3
from tokencredit.rollout import generate
from tokencredit.rollout.cascade import (
    IMPLEMENTATION,
    _attention,
    _cascade_layer_class,
    _shared_prefix_attention,
    cascade_decoding,
    cascade_supported,
)  # fmt: skip

PROMPTS = ["Hi", "Hello", "A long prompt."]


@pytest.fixture(scope="module")
def tiny():
    tok = byte_tokenizer()
    model = tiny_qwen3(len(tok), max_position_embeddings=256, tie_word_embeddings=True)
    return model.eval(), tok


def _case(u=3, g=4, h=4, hk=2, p=7, t=5, d=8, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen).to(dtype)  # noqa: E731
    pk, pv, k, v, q = r(u, hk, p, d), r(u, hk, p, d), r(u * g, hk, t, d), r(u * g, hk, t, d), r(u * g, h, 1, d)
    prompt_mask = torch.ones(u, p, dtype=torch.bool)
    prompt_mask[0, :3] = False  # left padding of prompt 0
    prompt_mask[2, :1] = False
    mask = torch.cat([prompt_mask.repeat_interleave(g, 0), torch.ones(u * g, t, dtype=torch.bool)], 1)
    layer = _cascade_layer_class()(room=8, prefix_keys=pk, prefix_values=pv, group=g)
    return q, pk, pv, k, v, mask[:, None, None, :], layer


def _reference(q, pk, pv, k, v, mask, g):
    """SDPA over every row's own copy of its prompt's keys/values (what the plain cache holds)."""
    module = torch.nn.Module()
    module.num_key_value_groups = q.shape[1] // pk.shape[1]
    keys = torch.cat([pk.repeat_interleave(g, 0), k], dim=2)
    values = torch.cat([pv.repeat_interleave(g, 0), v], dim=2)
    return sdpa_attention_forward(module, q, keys, values, mask, scaling=q.shape[-1] ** -0.5)[0]


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("h, hk", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa2", "mqa"])
def test_same_attention_as_sdpa_over_repeated_rows(dtype, tol, h, hk):
    q, pk, pv, k, v, mask, layer = _case(h=h, hk=hk, dtype=dtype)
    ref = _reference(q, pk, pv, k, v, mask, layer.group)
    out = _shared_prefix_attention(q, layer, k, v, mask, q.shape[-1] ** -0.5)
    assert out.shape == ref.shape == (12, 1, h, 8) and out.dtype == dtype
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
    # No mask (no padding) and a float (additive) mask give the same as the boolean one.
    no_pad = torch.ones_like(mask)
    torch.testing.assert_close(
        _shared_prefix_attention(q, layer, k, v, None, q.shape[-1] ** -0.5).float(),
        _reference(q, pk, pv, k, v, no_pad, layer.group).float(), atol=tol, rtol=tol,
    )  # fmt: skip
    additive = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(_shared_prefix_attention(q, layer, k, v, additive, q.shape[-1] ** -0.5), out)


def test_layer_counts_the_prompt_and_flattens_to_plain_rows():
    q, pk, pv, k, v, mask, layer = _case()
    assert layer.cascading and layer.get_seq_length() == 0 + 7
    own_k, own_v = layer.update(k[:, :, :4], v[:, :, :4])
    assert torch.equal(own_k, k[:, :, :4]) and own_k is layer.keys  # the own part only
    layer.update(k[:, :, 4:], v[:, :, 4:])
    assert layer.get_seq_length() == 7 + 5 and layer.get_mask_sizes(1) == (13, 0)
    full_k = torch.cat([pk.repeat_interleave(4, 0), k], 2)
    full_v = torch.cat([pv.repeat_interleave(4, 0), v], 2)
    # A batch selection (or any reordering) first turns the layer into plain repeated rows.
    idx = torch.tensor([11, 0, 5])
    layer.batch_select_indices(idx)
    assert not layer.cascading and layer.get_seq_length() == 12
    assert torch.equal(layer.keys, full_k[idx]) and torch.equal(layer.values, full_v[idx])
    extra = torch.randn(3, 2, 1, 8)
    keys, _ = layer.update(extra, extra)  # and keeps appending as a plain layer
    assert torch.equal(keys, torch.cat([full_k[idx], extra], 2))
    # A crop of a cascading layer keeps the prompt and the uncropped own tokens.
    _, pk2, _, k2, v2, _, layer2 = _case(seed=1)
    layer2.update(k2, v2)
    layer2.crop(-2)
    assert layer2.get_seq_length() == 7 + 3
    assert torch.equal(layer2.keys, torch.cat([pk2.repeat_interleave(4, 0), k2[:, :, :3]], 2))


def test_outside_a_cascade_it_is_sdpa_itself():
    q, pk, pv, k, v, mask, _ = _case()
    keys, values = torch.cat([pk.repeat_interleave(4, 0), k], 2), torch.cat([pv.repeat_interleave(4, 0), v], 2)
    module = torch.nn.Module()
    module.layer_idx, module.num_key_value_groups = 0, 2
    got = _attention(module, q, keys, values, mask, scaling=0.3)[0]
    assert torch.equal(got, sdpa_attention_forward(module, q, keys, values, mask, scaling=0.3)[0])


def test_multi_token_query_on_a_shared_cache_is_refused():
    q, pk, pv, k, v, mask, layer = _case()
    cache = type("C", (), {"layers": [layer]})()
    own_k, own_v = layer.update(k, v)
    module = torch.nn.Module()
    module.layer_idx = 0
    with cascade_decoding(tiny_qwen3(50), cache):
        out = _attention(module, q, own_k, own_v, mask, scaling=0.3)[0]
        assert out.shape == (12, 1, 4, 8)
        with pytest.raises(RuntimeError, match="query length 2"):
            _attention(module, torch.cat([q, q], 2), own_k, own_v, None, scaling=0.3)


def test_used_for_equal_groups_and_implementation_restored(tiny):
    model, tok = tiny
    seen: list[set[str]] = []

    def hook(mod, args, kwargs, out):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        seen.append({type(x).__name__ for x in cache.layers})
        seen.append({mod.config._attn_implementation})

    handle = model.register_forward_hook(hook, with_kwargs=True)
    try:
        generate(model, tok, PROMPTS, 3, max_new_tokens=4, seed=0, eos_token_id=[BYTE_EOS])
        assert {"CascadeLayer"} in seen and {IMPLEMENTATION} in seen
        seen.clear()  # 3 samples in chunks of 5 rows: groups split across calls, the plain shared prefill
        generate(model, tok, PROMPTS, 3, max_new_tokens=4, seed=0, eos_token_id=[BYTE_EOS], batch_size=5)
        assert {"CascadeLayer"} not in seen and {"_AppendLayer"} in seen and {IMPLEMENTATION} not in seen
    finally:
        handle.remove()
    assert model.config._attn_implementation == "sdpa"

    def fail(mod, args, kwargs, out):
        raise KeyboardInterrupt

    handle = model.register_forward_hook(fail, with_kwargs=True)
    try:
        with pytest.raises(KeyboardInterrupt):
            generate(model, tok, PROMPTS, 2, max_new_tokens=4, seed=0)
    finally:
        handle.remove()
    assert model.config._attn_implementation == "sdpa"


def test_only_for_sdpa_models(tiny):
    model, tok = tiny
    assert cascade_supported(model)
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    assert not cascade_supported(eager)
    assert not cascade_supported(tiny_qwen3(50, use_sliding_window=True, sliding_window=4))
    a = generate(model, tok, PROMPTS, 3, max_new_tokens=6, seed=1, eos_token_id=[BYTE_EOS])
    b = generate(eager, tok, PROMPTS, 3, max_new_tokens=6, seed=1, eos_token_id=[BYTE_EOS])
    assert torch.equal(a.response_ids, b.response_ids)


def test_switched_off_keeps_repeated_rows(tiny):
    from tokencredit.rollout import generate_ids

    model, tok = tiny
    enc = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    seen: set[str] = set()
    handle = model.register_forward_hook(
        lambda mod, a, kw, out: seen.update(type(x).__name__ for x in kw["cache"].layers), with_kwargs=True
    )
    try:
        outs = [
            generate_ids(model, enc["input_ids"], enc["attention_mask"], 4, eos_ids=[BYTE_EOS], pad_id=0,
                         max_new_tokens=6, seed=3, shared_attention=shared)  # fmt: skip
            for shared in (False, True)
        ]
    finally:
        handle.remove()
    assert seen == {"_AppendLayer", "CascadeLayer"}
    assert all(torch.equal(a, b) for a, b in zip(*outs))

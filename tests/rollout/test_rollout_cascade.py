"""Shared-prefix decoding attention (`tokencredit.rollout.cascade`): the same attention as SDPA over
the repeated prompt rows, the cache layer's bookkeeping, and when it is (not) used. That `generate`
returns the same tokens as plain ``model.generate`` with it is tests/rollout/test_rollout.py's job."""

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
    cascade_decoding,
    cascade_supported,
    shared_prefix_attention,
)
from tokencredit.signals.prefix import common_prefix

PROMPTS = ["Hi", "Hello", "A long prompt."]


@pytest.fixture(scope="module")
def tiny():
    tok = byte_tokenizer()
    model = tiny_qwen3(len(tok), max_position_embeddings=256, tie_word_embeddings=True)
    return model.eval(), tok


def _case(u=3, g=4, h=4, hk=2, p=7, t=5, d=8, dtype=torch.float32, seed=0, common=0):
    """Queries of u x g rows, prompt part [u, hk, p, d] (prompt 0 and 2 left-padded), own part [u*g, hk, t, d];
    with `common` > 0 a first level [1, hk, common, d] shared by all rows (the padding then sits between
    the levels, where `prefill_common` puts it)."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen).to(dtype)  # noqa: E731
    pk, pv, k, v, q = (
        r(u, hk, p, d),
        r(u, hk, p, d),
        r(u * g, hk, t, d),
        r(u * g, hk, t, d),
        r(u * g, h, 1, d),
    )
    prompt_mask = torch.ones(u, p, dtype=torch.bool)
    prompt_mask[0, :3] = False  # left padding of prompt 0
    prompt_mask[2, :1] = False
    levels = [(pk, pv, g)]
    mask = torch.cat([prompt_mask.repeat_interleave(g, 0), torch.ones(u * g, t, dtype=torch.bool)], 1)
    if common:
        ck, cv = r(1, hk, common, d), r(1, hk, common, d)
        levels.insert(0, (ck, cv, u * g))
        mask = torch.cat([torch.ones(u * g, common, dtype=torch.bool), mask], 1)
    layer = _cascade_layer_class()(room=8, levels=levels)
    return q, levels, k, v, mask[:, None, None, :], layer


def _reference(q, levels, k, v, mask):
    """SDPA over every row's own copy of its levels' keys/values (what the plain cache holds)."""
    module = torch.nn.Module()
    module.num_key_value_groups = q.shape[1] // k.shape[1]
    keys = torch.cat([lk.repeat_interleave(g, 0) for lk, _, g in levels] + [k], dim=2)
    values = torch.cat([lv.repeat_interleave(g, 0) for _, lv, g in levels] + [v], dim=2)
    return sdpa_attention_forward(module, q, keys, values, mask, scaling=q.shape[-1] ** -0.5)[0]


@pytest.mark.parametrize("common", [0, 6], ids=["prompt-level", "common+prompt-levels"])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("h, hk", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa2", "mqa"])
def test_same_attention_as_sdpa_over_repeated_rows(dtype, tol, h, hk, common):
    q, levels, k, v, mask, layer = _case(h=h, hk=hk, dtype=dtype, common=common)
    ref = _reference(q, levels, k, v, mask)
    out = shared_prefix_attention(q, layer, k, v, mask, q.shape[-1] ** -0.5)
    assert out.shape == ref.shape == (12, 1, h, 8) and out.dtype == dtype
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
    # No mask (no padding) and a float (additive) mask give the same as the boolean one.
    no_pad = torch.ones_like(mask)
    torch.testing.assert_close(
        shared_prefix_attention(q, layer, k, v, None, q.shape[-1] ** -0.5).float(),
        _reference(q, levels, k, v, no_pad).float(),
        atol=tol,
        rtol=tol,
    )
    additive = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(shared_prefix_attention(q, layer, k, v, additive, q.shape[-1] ** -0.5), out)


def test_layer_counts_the_levels_and_flattens_to_plain_rows():
    q, levels, k, v, mask, layer = _case(common=6)
    assert layer.cascading and layer.get_seq_length() == 6 + 7
    own_k, own_v = layer.update(k[:, :, :4], v[:, :, :4])
    assert torch.equal(own_k, k[:, :, :4]) and own_k is layer.keys  # the own part only
    layer.update(k[:, :, 4:], v[:, :, 4:])
    assert layer.get_seq_length() == 6 + 7 + 5 and layer.get_mask_sizes(1) == (19, 0)
    full_k = torch.cat([lk.repeat_interleave(g, 0) for lk, _, g in levels] + [k], 2)
    full_v = torch.cat([lv.repeat_interleave(g, 0) for _, lv, g in levels] + [v], 2)
    # A batch selection (or any reordering) first turns the layer into plain repeated rows.
    idx = torch.tensor([11, 0, 5])
    layer.batch_select_indices(idx)
    assert not layer.cascading and layer.get_seq_length() == 18
    assert torch.equal(layer.keys, full_k[idx]) and torch.equal(layer.values, full_v[idx])
    extra = torch.randn(3, 2, 1, 8)
    keys, _ = layer.update(extra, extra)  # and keeps appending as a plain layer
    assert torch.equal(keys, torch.cat([full_k[idx], extra], 2))
    # A crop of a cascading layer keeps the levels and the uncropped own tokens.
    _, levels2, k2, v2, _, layer2 = _case(seed=1)
    layer2.update(k2, v2)
    layer2.crop(-2)
    assert layer2.get_seq_length() == 7 + 3
    assert torch.equal(layer2.keys, torch.cat([levels2[0][0].repeat_interleave(4, 0), k2[:, :, :3]], 2))
    # A layer with levels and no own part yet flattens to the levels alone.
    _, levels3, _, _, _, layer3 = _case(seed=2, common=3)
    layer3.flatten()
    assert layer3.get_seq_length() == 3 + 7 and layer3.keys.shape == (12, 2, 10, 8)


def test_outside_a_cascade_it_is_sdpa_itself():
    q, levels, k, v, mask, _ = _case()
    pk, pv, _ = levels[0]
    keys, values = (
        torch.cat([pk.repeat_interleave(4, 0), k], 2),
        torch.cat([pv.repeat_interleave(4, 0), v], 2),
    )
    module = torch.nn.Module()
    module.layer_idx, module.num_key_value_groups = 0, 2
    got = _attention(module, q, keys, values, mask, scaling=0.3)[0]
    assert torch.equal(got, sdpa_attention_forward(module, q, keys, values, mask, scaling=0.3)[0])


def test_multi_token_query_is_sdpa_over_the_expanded_levels():
    """The prefill of `prefill_common` (several query tokens on a layer with levels): SDPA over the levels
    repeated to the rows; without a mask (SDPA would align its causal mask top-left) it is refused."""
    _, levels, k, v, _, layer = _case(common=6)
    cache = type("C", (), {"layers": [layer]})()
    own_k, own_v = layer.update(k, v)
    q = torch.randn(12, 4, 3, 8)
    causal = torch.ones(3, 13 + 5, dtype=torch.bool).tril(diagonal=13 + 5 - 3)
    mask = causal[None, None].expand(12, 1, 3, 18).clone()
    mask[0, :, :, 6:9] = False  # padding
    module = torch.nn.Module()
    module.layer_idx, module.num_key_value_groups = 0, 2
    with cascade_decoding(tiny_qwen3(50), cache):
        out = _attention(module, q, own_k, own_v, mask, scaling=0.3)[0]
        keys = torch.cat([lk.repeat_interleave(g, 0) for lk, _, g in levels] + [k], 2)
        values = torch.cat([lv.repeat_interleave(g, 0) for _, lv, g in levels] + [v], 2)
        ref = sdpa_attention_forward(module, q, keys, values, mask, scaling=0.3)[0]
        assert torch.equal(out, ref) and layer.cascading
        with pytest.raises(RuntimeError, match="query length 3"):
            _attention(module, q, own_k, own_v, None, scaling=0.3)


def test_common_prefix_of_left_padded_rows():
    pad = 0
    rows = [[5, 6, 7, 8, 9], [5, 6, 7, 2], [5, 6, 7, 8, 3, 4]]
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = ids != pad
    assert common_prefix(ids, mask) == 3  # 5 6 7, then 8 / 2 differ
    assert common_prefix(ids[[0, 2]], mask[[0, 2]]) == 4
    # Never the whole of the shortest prompt: its last token is generate's first input.
    assert common_prefix(ids[[1, 1]], mask[[1, 1]]) == 3
    assert common_prefix(torch.tensor([[4, 5], [3, 5]]), torch.ones(2, 2, dtype=torch.bool)) == 0


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
    from tokencredit.rollout import SamplingSettings, generate_ids

    model, tok = tiny
    enc = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    seen: set[str] = set()
    handle = model.register_forward_hook(
        lambda mod, a, kw, out: seen.update(type(x).__name__ for x in kw["cache"].layers), with_kwargs=True
    )
    try:
        outs = [
            generate_ids(
                model,
                enc["input_ids"],
                enc["attention_mask"],
                4,
                eos_ids=[BYTE_EOS],
                pad_id=0,
                sampling=SamplingSettings(max_new_tokens=6),
                seed=3,
                shared_attention=shared,
            )
            for shared in (False, True)
        ]
    finally:
        handle.remove()
    assert seen == {"_AppendLayer", "CascadeLayer"}
    assert all(torch.equal(a, b) for a, b in zip(*outs))


def test_common_beginning_held_once(tiny):
    """Prompts that share a chat-template beginning: it becomes a level of its own (one copy for the
    batch), each prompt's rest a second level for its equal adjacent group, else the rows' own part."""
    from test_rollout import TEMPLATED

    model, tok = tiny
    seen: list[tuple[int, ...]] = []

    def hook(mod, args, kwargs, out):
        layer = kwargs["cache"].layers[0]
        if kwargs["input_ids"].shape[1] == 1 and getattr(layer, "cascading", False):
            seen.append(tuple(lk.shape[0] for lk, _, _ in layer.levels) + (layer.get_seq_length(),))

    handle = model.register_forward_hook(hook, with_kwargs=True)
    try:
        common = len(tok("<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\n")["input_ids"])
        longest = max(len(tok(p)["input_ids"]) for p in TEMPLATED)
        generate(model, tok, TEMPLATED, 3, max_new_tokens=4, seed=0, eos_token_id=[BYTE_EOS])
        # After the first decoding step: one copy of the beginning, 3 of the rests, the longest prompt cached.
        assert seen[0] == (1, 3, longest), seen[0]
        seen.clear()
        generate(model, tok, TEMPLATED, 1, max_new_tokens=4, seed=0, eos_token_id=[BYTE_EOS], temperature=0.0)
        assert seen[0] == (1, longest)  # distinct prompts: the rests are the rows' own part
        seen.clear()  # groups split across calls (prompts 0,0,0,1,1 | 1,2,2,2): rests repeated to rows
        generate(model, tok, TEMPLATED, 3, max_new_tokens=4, seed=0, eos_token_id=[BYTE_EOS], batch_size=5)
        assert seen[0] == (1, common + len("Hello")) and all(x[0] == 1 for x in seen)
    finally:
        handle.remove()
    assert common >= 16 and model.config._attn_implementation == "sdpa"

"""Our decoding loop (`tokencredit.rollout.decode`) against plain ``model.generate``, for each
architecture it serves, and where it steps aside (hooks on the model, other architectures)."""

import functools

import pytest
import torch
from test_rollout import SETTINGS, TEMPLATED, decoding_logits, frequent_stops, reference

from conftest import BYTE_EOS, byte_tokenizer, tiny_qwen3
from tokencredit.rollout import decode as decode_module
from tokencredit.rollout import generate, generation_config

SMALL = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def tiny(arch: str, vocab: int):
    """A random tiny model of `arch` (sdpa attention, GQA); Qwen2 has q/k/v biases, Llama no q/k norms."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    if arch == "qwen3":
        return tiny_qwen3(vocab, max_position_embeddings=256, tie_word_embeddings=True).eval()
    if arch == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab, **SMALL)).eval()
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, head_dim=8, **SMALL)).eval()


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
@pytest.mark.parametrize("kw", SETTINGS, ids=["greedy", "sample", "sample-top-p-k"])
def test_same_tokens_as_generate_per_architecture(arch, kw):
    tok = byte_tokenizer()
    model = tiny(arch, len(tok))
    if arch == "qwen2":  # random biases, so the bias path is exercised
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.5)
    assert decode_module.layered_supported(model)
    stops = frequent_stops(tok)
    for seed, n in enumerate((4, 1)):  # 4: groups of a shared prompt; 1: distinct prompts, common beginning
        run = functools.partial(
            generate, model, tok, TEMPLATED, n, max_new_tokens=12, seed=seed, eos_token_id=stops, **kw
        )
        r, _, ours = decoding_logits(model, run)
        assert ours > 0
        ref = reference(model, tok, TEMPLATED, n, max_new_tokens=12, seed=seed, eos=stops, **kw)
        assert torch.equal(r.response_ids, ref), (arch, seed)
        if kw["temperature"] > 0 and n > 1:
            assert r.response_lengths.min() < r.response_lengths.max()


def test_hooked_model_and_other_architectures_keep_generate():
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = byte_tokenizer()
    model = tiny("qwen3", len(tok))
    handle = model.register_forward_hook(lambda *a: None)
    try:
        assert not decode_module.layered_supported(model)
    finally:
        handle.remove()
    pre = model.model.register_forward_pre_hook(lambda *a: None)
    try:
        assert not decode_module.layered_supported(model)
    finally:
        pre.remove()
    assert decode_module.layered_supported(model)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2, n_positions=256))
    assert not decode_module.layered_supported(gpt2)
    # A hook on a layer's module runs inside our loop, as in the model's forward.
    calls = []
    handle = model.model.layers[0].mlp.register_forward_hook(lambda *a: calls.append(1))
    try:
        assert decode_module.layered_supported(model)
        generate(model, tok, TEMPLATED, 2, max_new_tokens=4, seed=0, eos_token_id=[BYTE_EOS])
    finally:
        handle.remove()
    assert len(calls) >= 4 + 2  # prefill forwards, then one call per decoding step


def test_warpers_follow_generate_order():
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    cfg = generation_config(0.7, 0.9, 20, 8, [1], 0)
    assert [type(w) for w in decode_module.warpers(cfg)] == [
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    ]
    assert len(decode_module.warpers(generation_config(1.0, 1.0, 0, 8, [1], 0))) == 0
    assert len(decode_module.warpers(generation_config(0.0, 0.9, 20, 8, [1], 0))) == 0  # greedy: none

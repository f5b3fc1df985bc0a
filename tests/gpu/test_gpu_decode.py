"""Our decoding loop (`tokencredit.rollout.decode`) against ``model.generate`` on the device.

float32: the same tokens as transformers' ``generate`` on the same device under the same seed (greedy,
sampled, top-p + top-k; a prompt's group of 4 and distinct prompts), for the two architectures the
trainer meets most (Qwen3; Llama, SmolLM2's), with the loop's own step function counted so that a
silent fall-back to ``generate`` fails. bf16 greedy: every token is the argmax of a full forward of the
finished sequences up to bf16 rounding (the loop's attention and ``generate``'s differ in rounding).
"""

from __future__ import annotations

import pytest
import torch
from _gpu import DEVICE, MARKS

from conftest import BYTE_EOS, byte_tokenizer, tiny_qwen3
from tokencredit.rollout import decode as decode_module
from tokencredit.rollout import generate, generation_config

pytestmark = MARKS

PROMPTS = ["<|im_start|>user\nHi", "<|im_start|>user\nHello there", "<|im_start|>user\nA longer prompt."]
SETTINGS = [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.7, top_p=0.9, top_k=20)]
MAX_NEW = 12


def _model(arch: str, vocab: int, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    if arch == "qwen3":
        model = tiny_qwen3(vocab, max_position_embeddings=256, tie_word_embeddings=True)
    else:
        torch.manual_seed(0)
        cfg = LlamaConfig(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            max_position_embeddings=256,
        )
        model = LlamaForCausalLM(cfg)
    return model.to(DEVICE, dtype).eval()


def _stops(tok) -> list[int]:
    """EOS and frequent letters, so that rows end at different lengths and some run to the limit."""
    return [BYTE_EOS, *tok.convert_tokens_to_ids(list("etaoinsh"))]


def _reference(model, tok, n: int, seed: int, stops: list[int], **kw) -> torch.Tensor:
    """[N, T] new tokens of one plain ``model.generate`` call on the device, seeded as `generate` seeds."""
    cfg = generation_config(
        kw["temperature"], kw.get("top_p", 1.0), kw.get("top_k", 0), MAX_NEW, stops, tok.pad_token_id
    )
    enc = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    ids = enc["input_ids"].repeat_interleave(n, 0).to(DEVICE)
    att = enc["attention_mask"].repeat_interleave(n, 0).to(DEVICE)
    devices = [DEVICE] if DEVICE.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        torch.manual_seed(seed)
        out = model.generate(input_ids=ids, attention_mask=att, generation_config=cfg)
    return out[:, ids.shape[1] :].cpu()


def _counting_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    plain = decode_module._step

    def step(*args, **kwargs):
        calls.append(1)
        return plain(*args, **kwargs)

    monkeypatch.setattr(decode_module, "_step", step)
    return calls


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("kw", SETTINGS, ids=["greedy", "sample", "top-p-k"])
@pytest.mark.parametrize("n", [4, 1])
def test_same_tokens_as_generate(monkeypatch, arch, kw, n):
    tok = byte_tokenizer()
    model = _model(arch, len(tok))
    assert decode_module.layered_supported(model)
    stops = _stops(tok)
    calls = _counting_steps(monkeypatch)
    ours = generate(model, tok, PROMPTS, n, max_new_tokens=MAX_NEW, seed=3, eos_token_id=stops, **kw)
    assert calls, "the decoding loop did not run (fell back to generate)"
    ref = _reference(model, tok, n, 3, stops, **kw)
    assert torch.equal(ours.response_ids, ref), (arch, kw, n)
    if kw["temperature"] > 0 and n > 1:
        assert ours.response_lengths.min() < ours.response_lengths.max()  # rows ended at different steps


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_bf16_greedy_tokens_are_the_argmax_of_a_full_forward(arch):
    tok = byte_tokenizer()
    model = _model(arch, len(tok), torch.bfloat16)
    ours = generate(
        model, tok, PROMPTS, 2, temperature=0.0, max_new_tokens=MAX_NEW, seed=0, eos_token_id=[BYTE_EOS]
    )
    seq, att = ours.sequences.to(DEVICE), ours.attention_mask.to(DEVICE)
    with torch.no_grad():
        logits = model(
            input_ids=seq, attention_mask=att, position_ids=(att.cumsum(-1) - 1).clamp(min=0)
        ).logits
    p = ours.prompt_ids.shape[1]
    pred = logits[:, p - 1 : -1].float().cpu()  # column p - 1 + t predicts response token t
    chosen = pred.gather(2, ours.response_ids[..., None]).squeeze(2)
    gap = (pred.max(2).values - chosen)[ours.response_mask]
    spread = float(pred.std())
    assert float(gap.max()) <= 0.05 * spread, (arch, float(gap.max()), spread)  # a near-tie at most
    assert float((gap == 0).float().mean()) >= 0.9

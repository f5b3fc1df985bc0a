"""The decoding loop of the shared-prefix path: ``generate``'s sampling loop, written out for a
Llama-style decoder, so a decoding step is the model's own modules and nothing else.

Why: on the toy model a decoding step is ~5 ms, and ``generate`` plus the model's forward wrappers
(input preparation, keyword handling and mask building each step, stopping criteria, output
records) took about 13% of a rollout round (docs/experiments/trainer-speed.md#our-own-decoding-loop). Here one step is: the
model's embedding and rotary modules, then per decoder layer its input norm, q/k/v projections (and
q/k norms where the model has them), the model's own ``apply_rotary_pos_emb``, the cache layer's
``update``, the shared-prefix attention (`tokencredit.rollout.cascade`), o_proj, the residuals, its
post-attention norm and MLP; the final norm and LM head. Modules are called, not their weights read,
so LoRA adapters, biases and the modules' hooks act as in the model's forward; a hook on the whole
model or its decoder (whose forwards are not called) keeps ``generate``.

Sampling is ``generate``'s: float32 logits of the last position, transformers' own warpers in
``generate``'s order (temperature, top-k, top-p; the only processors `generation_config` leaves
on), softmax and ``torch.multinomial`` (argmax when greedy), finished rows fed the pad id, stop at
EOS on every row or `max_new_tokens`. Same ops in the same order as the model's forward, so the
same logits and, under the same seed, the same tokens as ``generate`` on the same cache
(tests/rollout/test_rollout.py: toy, tiny Qwen3 fp32 and bf16, LoRA, top-p + top-k).

Used only for the architectures whose decoder layer is exactly the pre-norm block above
(`LAYERED`); any other model decodes with ``generate``.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import Tensor

from tokencredit.rollout.cache import _unwrapped, position_ids
from tokencredit.rollout.cascade import shared_prefix_attention

__all__ = ["LAYERED", "decode_loop", "layered_supported", "warpers"]

# Causal LMs whose decoder layer is x + attn(norm(x)), then x + mlp(norm(x)), with q/k/v/o
# projections, optional per-head q/k norms, rotary positions and no embedding scale or softcap.
LAYERED = frozenset({"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"})


def layered_supported(model: Any) -> bool:
    """True where `model` (or the model under its peft wrapper) is one of `LAYERED` and no forward hook
    sits on the whole model or its decoder, whose forwards this loop does not call (hooks on the
    layers' modules run as usual); global module hooks also keep ``generate``."""
    base = _unwrapped(model)
    if type(base).__name__ not in LAYERED:
        return False
    hooked = [getattr(base, "model", None), base, model]
    if any(m is None or m._forward_hooks or m._forward_pre_hooks for m in hooked):
        return False
    glob = torch.nn.modules.module
    return not (glob._global_forward_hooks or glob._global_forward_pre_hooks)


def warpers(gen_cfg: Any) -> Any:
    """The logits warpers ``generate`` applies for `gen_cfg` (from `rollout.generation_config`):
    temperature (if not 1), top-k (if > 0), top-p (if < 1), in that order; none when greedy."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    out = LogitsProcessorList()
    if not gen_cfg.do_sample:
        return out
    if gen_cfg.temperature is not None and gen_cfg.temperature != 1.0:
        out.append(TemperatureLogitsWarper(gen_cfg.temperature))
    if gen_cfg.top_k is not None and gen_cfg.top_k != 0:
        out.append(TopKLogitsWarper(top_k=gen_cfg.top_k, min_tokens_to_keep=1))
    if gen_cfg.top_p is not None and gen_cfg.top_p < 1.0:
        out.append(TopPLogitsWarper(top_p=gen_cfg.top_p, min_tokens_to_keep=1))
    return out


def _step(base: Any, rotary: Any, cache: Any, ids: Tensor, pos: Tensor, mask: Tensor) -> Tensor:
    """Logits [B, V] (float32) of one decoding step: token ids / positions [B, 1], `mask` [B, 1, 1, L]
    bool over the cache's L positions after this step's. The model's forward, layer by layer."""
    decoder = base.model
    h = decoder.embed_tokens(ids)
    cos, sin = decoder.rotary_emb(h, pos)
    shape = (ids.shape[0], 1, -1)
    for layer, cached in zip(decoder.layers, cache.layers):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        heads = (*shape, attn.head_dim)
        q, k, v = attn.q_proj(x).view(heads), attn.k_proj(x).view(heads), attn.v_proj(x).view(heads)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        k, v = cached.update(k, v.transpose(1, 2))
        o = shared_prefix_attention(q, cached, k, v, mask, attn.scaling)
        h = h + attn.o_proj(o.reshape(shape))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    h = decoder.norm(h)
    return base.lm_head(h[:, -1:, :])[:, -1].to(copy=True, dtype=torch.float32)


def decode_loop(model: Any, cache: Any, ids: Tensor, att: Tensor, gen_cfg: Any) -> Tensor:
    """Sample up to ``gen_cfg.max_new_tokens`` tokens for rows `ids`/`att` [B, P] whose cache holds all
    but the last prompt column, every layer a cascade layer (`rollout.cascade.prefill_common` /
    `to_cascade`). Returns [B, T] int64, T the steps until every row has ended (pad after a row's EOS),
    as ``generate`` returns past the prompt. Call under ``torch.no_grad()`` in eval mode."""
    base = _unwrapped(model)
    rotary = sys.modules[type(base).__module__].apply_rotary_pos_emb
    warp = warpers(gen_cfg)
    b, p = ids.shape
    eos = torch.as_tensor(list(gen_cfg.eos_token_id), device=ids.device)
    pad = int(gen_cfg.pad_token_id)
    n = gen_cfg.max_new_tokens
    mask = torch.ones(b, p + n, dtype=torch.bool, device=ids.device)
    mask[:, :p] = att.bool()
    out = torch.full((b, n), pad, dtype=torch.long, device=ids.device)
    unfinished = torch.ones(b, dtype=torch.long, device=ids.device)
    cur, pos = ids[:, -1:], position_ids(att)[:, -1:]
    t = 0
    while t < n:
        logits = _step(base, rotary, cache, cur, pos, mask[:, None, None, : p + t])
        if gen_cfg.do_sample:
            # the warpers here read only the scores; generate passes the ids so far
            probs = torch.softmax(warp(ids, logits), dim=-1)
            nxt = torch.multinomial(probs, num_samples=1).squeeze(1)
        else:
            nxt = torch.argmax(logits, dim=-1)
        nxt = nxt * unfinished + pad * (1 - unfinished)
        out[:, t] = nxt
        t += 1
        unfinished = unfinished & ~torch.isin(nxt, eos)
        if not bool(unfinished.any()):
            break
        cur, pos = nxt[:, None], pos + 1
    return out[:, :t]

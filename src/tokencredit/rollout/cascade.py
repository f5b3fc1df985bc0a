"""Shared-prefix ("cascade") decoding attention: keys/values that many rows share are held and read once.

Rows of a batch share keys and values at two levels. Every prompt of a chunk usually starts with the
same chat-template text (94 tokens of the toy's 122), and the G samples of a prompt share the whole
prompt. With the cache rows repeated (`Cache.batch_select_indices`) every decoding step reads the
shared part once per row, and the prefill computes it once per prompt: for 64 distinct evaluation
prompts that prefill was a third of the evaluation (docs/experiments/trainer-speed.md#the-templates-common-beginning-shared). Here the cache holds
*levels*, each a block of positions with one copy per group of adjacent rows, and then each row's own
part; a decoding query attends to all of them in one softmax:

    s_l = q K_l^T * scale   [U_l, H, g_l, p_l]  (the g_l queries of a group in one matrix product)
    s   = q K_own^T * scale [B, H, 1, t]
    a   = softmax([s_0 | s_1 | ... | s] + mask)  (one softmax over all positions, as SDPA's)
    out = sum_l a_l V_l + a_own V_own

Same attention, read differently: the result equals SDPA's to float rounding (a different summation
order), not bit for bit, so a sample can differ from plain ``generate``'s where two tokens' cumulative
probabilities straddle the uniform draw within rounding; tests/rollout/test_rollout.py checks the outputs equal
plain ``generate``'s on the toy and tiny Qwen3 models.

Mechanisms are transformers' own: a `DynamicLayer` subclass (`CascadeLayer`) keeps the levels and
appends the own part in place; a function registered in `AttentionInterface` under ``"tc_cascade"``
(with sdpa's mask function) computes the attention above for the layers of the cache made active by
`cascade_decoding` and is SDPA itself for anything else (a multi-token query on a cascade layer, as in
`prefill_common`, is SDPA over the levels expanded to its rows). Used only where the model attends with
``sdpa`` through transformers' attention interface, with no sliding window or softcap.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import Tensor

from tokencredit.rollout.cache import _append_layer_class, _unwrapped, position_ids, prefill_kwargs
from tokencredit.signals.prefix import split_common

__all__ = [
    "IMPLEMENTATION",
    "cascade_decoding",
    "cascade_supported",
    "prefill_common",
    "shared_prefix_attention",
    "to_cascade",
]

IMPLEMENTATION = "tc_cascade"
_ACTIVE: ContextVar[Any] = ContextVar("tokencredit_cascade_cache", default=None)
_MASK: ContextVar[tuple[Tensor, Tensor] | None] = ContextVar("tokencredit_cascade_mask", default=None)


@functools.cache
def _cascade_layer_class() -> type:
    """`CascadeLayer`, built on first use (transformers' cache module is imported lazily)."""

    class CascadeLayer(_append_layer_class()):
        """Shared levels ``(keys [U_l, H, p_l, D], values, g_l)``, outermost first, then each row's own
        keys/values ([B, H, t, D], appended in place); B = U_l x g_l, the g_l rows of a group adjacent.

        ``keys``/``values`` are the rows' own part only: `update` returns them and the registered
        attention adds the levels. Lengths and mask sizes count all. Anything that reorders or crops
        rows first turns the layer back into a plain one (every level repeated to its rows).
        """

        def __init__(self, room: int, levels: list[tuple[Tensor, Tensor, int]]) -> None:
            super().__init__(room)
            self.levels = list(levels)

        @property
        def cascading(self) -> bool:
            return bool(self.levels)

        def get_seq_length(self) -> int:
            return super().get_seq_length() + sum(k.shape[-2] for k, _, _ in self.levels)

        def flatten(self) -> None:
            """Become a plain layer: each level repeated to its rows, in order, before the own part."""
            if not self.cascading:
                return
            own = self.is_initialized and self.keys.numel() > 0
            keys, values = self.expanded(self.keys, self.values) if own else self.expanded()
            self.levels = []
            self.is_initialized = True
            self.device = keys.device
            self.keys, self.values = keys, values
            self._kbuf = self._vbuf = None  # the next update copies into fresh buffers

        def expanded(self, key: Tensor | None = None, value: Tensor | None = None) -> tuple[Tensor, Tensor]:
            """(keys, values) [B, H, p (+ t), D]: the levels repeated to the rows (then `key`/`value`)."""
            ks = [k.repeat_interleave(g, dim=0) for k, _, g in self.levels]
            vs = [v.repeat_interleave(g, dim=0) for _, v, g in self.levels]
            if key is not None:
                ks, vs = ks + [key], vs + [value]
            return torch.cat(ks, dim=-2), torch.cat(vs, dim=-2)

        def reset(self) -> None:
            self.levels = []
            super().reset()

    # Whatever reorders, crops or moves rows first turns the layer into plain repeated rows.
    for name in ("crop", "batch_repeat_interleave", "batch_select_indices", "reorder_cache", "offload"):
        setattr(CascadeLayer, name, _flattening(getattr(CascadeLayer, name)))
    return CascadeLayer


def _flattening(method: Any) -> Any:
    """`method` of a cache layer, run after the layer's `flatten`."""

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.flatten()
        return method(self, *args, **kwargs)

    return run


def _sdpa(*args: Any, **kwargs: Any) -> tuple[Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(*args, **kwargs)


def shared_prefix_attention(
    query: Tensor, layer: Any, key: Tensor, value: Tensor, mask: Tensor | None, scale: float
) -> Tensor:
    """Attention of decoding queries [B, H, 1, D] over `layer`'s levels (level l: [U_l, Hk, p_l, D], rows
    u*g_l .. u*g_l+g_l-1 share its block u) and the rows' own keys/values [B, Hk, t, D]; `mask`
    [B, 1, 1, p+t] (bool: True attends; float: added) or None. Returns [B, 1, H, D], SDPA's layout.
    Each level's scores are written into one [B, Hk, r, p+t] buffer and its output added in place: a
    decoding step runs this once per layer, so every op counts (docs/experiments/trainer-speed.md#the-templates-common-beginning-shared)."""
    b, h, _, d = query.shape
    hk = key.shape[1]
    r = h // hk
    work = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    q = query.to(work).reshape(b, hk, r, d)  # head = kv head x r + repeat, as repeat_kv orders them
    width = sum(lk.shape[-2] for lk, _, _ in layer.levels) + key.shape[-2]
    logits = q.new_empty(b, hk, r, width)
    start = 0
    for lk, _, g in layer.levels:
        u, _, p, _ = lk.shape
        qg = q.view(u, g, hk, r, d).transpose(1, 2).reshape(u, hk, g * r, d)
        s = torch.matmul(qg, lk.to(work).transpose(-1, -2))  # [U, Hk, g*r, p]: one product per block
        logits[..., start : start + p].view(u, g, hk, r, p).copy_(s.view(u, hk, g, r, p).transpose(1, 2))
        start += p
    logits[..., start:].copy_(torch.matmul(q, key.to(work).transpose(-1, -2)))  # [B, Hk, r, t]
    logits.mul_(scale)
    if mask is not None:
        logits.add_(_additive(mask, work).view(b, 1, 1, width))
    probs = torch.softmax(logits, dim=-1)
    out = torch.matmul(probs[..., start:], value.to(work))  # [B, Hk, r, D]
    start = 0
    for lk, lv, g in layer.levels:
        u, _, p, _ = lk.shape
        a = probs[..., start : start + p].reshape(u, g, hk, r, p).transpose(1, 2).reshape(u, hk, g * r, p)
        o = torch.matmul(a, lv.to(work))  # [U, Hk, g*r, D]
        out.view(u, g, hk, r, d).add_(o.view(u, hk, g, r, d).transpose(1, 2))
        start += p
    return out.reshape(b, 1, h, d).to(query.dtype)


def _additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """`mask` as an additive float mask (0 / -inf). The layers of a decoding step get the same mask
    object, so the conversion is made once a step (remembered for the last mask seen)."""
    if mask.dtype != torch.bool:
        return mask.to(dtype)
    memo = _MASK.get()
    if memo is not None and memo[0] is mask and memo[1].dtype == dtype:
        return memo[1]
    additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
    _MASK.set((mask, additive))
    return additive


def _attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """The ``"tc_cascade"`` attention: for an active cascade layer (`key` is its own part), shared-prefix
    attention for a decoding step and SDPA over the levels expanded to the rows for several query
    tokens (`prefill_common`); SDPA itself for every other call."""
    cache = _ACTIVE.get()
    layer_idx = getattr(module, "layer_idx", None)
    layer = None
    if cache is not None and layer_idx is not None and layer_idx < len(cache.layers):
        layer = cache.layers[layer_idx]
    if layer is None or not getattr(layer, "cascading", False) or key is not layer.keys:
        return _sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    plain = dropout == 0.0 and kwargs.get("sliding_window") is None and kwargs.get("softcap") is None
    sized = attention_mask is None or attention_mask.shape[-1] == layer.get_seq_length()
    if not plain or not sized or (attention_mask is None and query.shape[2] > 1):
        # A call neither form covers (a window, a softcap, SDPA's top-left causal alignment).
        raise RuntimeError(
            "tokencredit cascade attention: unsupported call on a shared-prefix cache "
            f"(query length {query.shape[2]}, mask {None if attention_mask is None else tuple(attention_mask.shape)}, "
            f"sliding_window={kwargs.get('sliding_window')})"
        )
    if query.shape[2] > 1:
        keys, values = layer.expanded(key, value)
        return _sdpa(module, query, keys, values, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return shared_prefix_attention(query, layer, key, value, attention_mask, scale), None


@functools.cache
def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, _attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


def _text_config(model: Any) -> Any:
    config = _unwrapped(model).config
    return config.get_text_config(decoder=True)


def cascade_supported(model: Any) -> bool:
    """True where the model attends with ``sdpa`` through transformers' attention interface (its
    decoder layers' attention modules carry a `layer_idx`), without sliding windows."""
    config = _text_config(model)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
        return False
    return True


def to_cascade(cache: Any, room: int, group: int) -> None:
    """Turn every plain layer of `cache`, holding U distinct prompts, into a `CascadeLayer` whose rows
    are the U prompts' `group` samples each (rows of a prompt adjacent)."""
    layer_cls = _cascade_layer_class()
    cache.layers = [layer_cls(room, [(x.keys, x.values, group)]) for x in cache.layers]


def prefill_common(
    model: Any,
    cache: Any,
    cache_kwarg: str,
    ids: Tensor,
    mask: Tensor,
    rows: Tensor,
    common: int,
    group: int,
    room: int,
    pad_id: int,
) -> tuple[Tensor, Tensor]:
    """Prefill distinct left-padded prompts `ids`/`mask` [U, P] (row i of the batch answers prompt
    rows[i]) whose first `common` tokens are the same, into `cache` as cascade levels: those tokens once
    for the whole batch, then each prompt's rest without its last token once per prompt, held as a
    level of `group` rows (`group` >= 2: the rows come as U equal adjacent groups) or repeated to the
    rows. The padding moves between the two parts; the positions, and so the attention, are unchanged.
    Returns the rows' (ids, mask) [B, common + S] in that layout, for ``generate``."""
    u = ids.shape[0]
    head, tail_ids, tail_mask = split_common(ids, mask, common)
    width = tail_ids.shape[1]
    tail_ids = tail_ids.masked_fill(tail_mask == 0, pad_id)
    new_ids = torch.cat([head[None, :].expand(u, common), tail_ids], dim=1)
    new_mask = torch.cat([torch.ones(u, common, dtype=torch.long, device=ids.device), tail_mask], dim=1)
    forward = functools.partial(model, **prefill_kwargs(model, cache, cache_kwarg))
    forward(input_ids=head[None, :], position_ids=torch.arange(common, device=ids.device)[None, :])
    layer_cls = _cascade_layer_class()
    cache.layers = [layer_cls(room, [(x.keys.contiguous(), x.values.contiguous(), u)]) for x in cache.layers]
    if width > 1:
        with cascade_decoding(model, cache):
            forward(
                input_ids=tail_ids[:, :-1],
                attention_mask=new_mask[:, :-1],
                position_ids=position_ids(new_mask)[:, common:-1],
            )
    b = rows.numel()
    for x in cache.layers:
        own = x.keys is not None and x.is_initialized and x.keys.numel() > 0
        levels = [(x.levels[0][0], x.levels[0][1], b)]
        if own and group:
            levels.append((x.keys.contiguous(), x.values.contiguous(), group))
        if own and not group:
            x.keys, x.values = x.keys[rows], x.values[rows]
            x._kbuf = x._vbuf = None
        else:
            x.keys = x.values = None
            x.is_initialized = False
        x.levels = levels
    return new_ids[rows], new_mask[rows]


@contextmanager
def cascade_decoding(model: Any, cache: Any) -> Iterator[None]:
    """While inside, the model attends with ``"tc_cascade"`` and `cache`'s cascade layers are read
    as shared prefix + own part; the model's attention implementation is restored afterwards."""
    _register()
    config = _text_config(model)
    previous = config._attn_implementation_internal
    token, mask_token = _ACTIVE.set(cache), _MASK.set(None)
    config._attn_implementation_internal = IMPLEMENTATION
    try:
        yield
    finally:
        config._attn_implementation_internal = previous
        _ACTIVE.reset(token)
        _MASK.reset(mask_token)

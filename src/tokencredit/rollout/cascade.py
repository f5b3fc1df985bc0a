"""Shared-prefix ("cascade") decoding attention for the G samples of a prompt.

The G samples of a prompt have the same prompt keys and values. With the cache rows repeated
(`Cache.batch_select_indices`), every decoding step reads the prompt part G times over, once per row:
on the toy model that read is half of a rollout round (BENCHMARKS.md section 6). Here the prompt part
is held once per distinct prompt and each decoding query attends to it and to its own row's generated
part in one softmax:

    s_pre = q K_pre^T * scale   [U, H, G, p]   (the G queries of a prompt in one matrix product)
    s_own = q K_own^T * scale   [B, H, 1, t]
    a     = softmax([s_pre | s_own] + mask)    (one softmax over the p + t positions, as SDPA's)
    out   = a_pre V_pre + a_own V_own

Same attention, read differently: the result equals SDPA's to float rounding (a different summation
order), not bit for bit, so a sample can differ from plain ``generate``'s where two tokens' cumulative
probabilities straddle the uniform draw within rounding; tests/test_rollout.py checks the outputs equal
plain ``generate``'s on the toy and tiny Qwen3 models.

Mechanisms are transformers' own: a `DynamicLayer` subclass (`CascadeLayer`) keeps the prompt part
and appends the generated part in place; a function registered in `AttentionInterface` under
``"tc_cascade"`` (with sdpa's mask function) computes the attention above for the layers of the cache
made active by `cascade_decoding` and is SDPA itself for anything else. Used only where the model
attends with ``sdpa`` through transformers' attention interface, with no sliding window or softcap.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import Tensor

from tokencredit.rollout.cache import _append_layer_class, _unwrapped

__all__ = ["IMPLEMENTATION", "cascade_decoding", "cascade_supported", "to_cascade"]

IMPLEMENTATION = "tc_cascade"
_ACTIVE: ContextVar[Any] = ContextVar("tokencredit_cascade_cache", default=None)


@functools.cache
def _cascade_layer_class() -> type:
    """`CascadeLayer`, built on first use (transformers' cache module is imported lazily)."""

    class CascadeLayer(_append_layer_class()):
        """Prompt keys/values once per distinct prompt ([U, H, p, D]) + each row's own keys/values
        ([B, H, t, D], appended in place); B = U x `group` rows, prompt u's rows adjacent.

        ``keys``/``values`` are the rows' own part only: `update` returns them and the registered
        attention adds the prompt part. Lengths and mask sizes count both. Anything that reorders
        or crops rows first turns the layer back into a plain one (prompt part repeated per row).
        """

        def __init__(self, room: int, prefix_keys: Tensor, prefix_values: Tensor, group: int) -> None:
            super().__init__(room)
            self.prefix_keys: Tensor | None = prefix_keys
            self.prefix_values: Tensor | None = prefix_values
            self.group = group

        @property
        def cascading(self) -> bool:
            return self.prefix_keys is not None

        def get_seq_length(self) -> int:
            own = super().get_seq_length()
            return own + (self.prefix_keys.shape[-2] if self.cascading else 0)

        def flatten(self) -> None:
            """Become a plain layer: the prompt part repeated to every row, before the own part."""
            if not self.cascading:
                return
            pk = self.prefix_keys.repeat_interleave(self.group, dim=0)
            pv = self.prefix_values.repeat_interleave(self.group, dim=0)
            if self.is_initialized and self.keys.numel():
                pk, pv = torch.cat([pk, self.keys], dim=-2), torch.cat([pv, self.values], dim=-2)
            self.prefix_keys = self.prefix_values = None
            self.is_initialized = True
            self.device = pk.device
            self.keys, self.values = pk, pv
            self._kbuf = self._vbuf = None  # the next update copies into fresh buffers

        def reset(self) -> None:
            self.prefix_keys = self.prefix_values = None
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


def _shared_prefix_attention(query: Tensor, layer: Any, key: Tensor, value: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """Attention of decoding queries [B, H, 1, D] over layer's prompt part [U, Hk, p, D] (rows
    u*G .. u*G+G-1 share prompt u) and their own keys/values [B, Hk, t, D]; `mask` [B, 1, 1, p+t]
    (bool: True attends; float: added) or None. Returns [B, 1, H, D], SDPA's output layout."""
    pk, pv = layer.prefix_keys, layer.prefix_values
    b, h, _, d = query.shape
    u, hk, p, _ = pk.shape
    g, r, t = layer.group, h // hk, key.shape[-2]
    work = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    q = query.to(work).reshape(b, hk, r, d)  # head = kv head x r + repeat, as repeat_kv orders them
    qg = q.reshape(u, g, hk, r, d).transpose(1, 2).reshape(u, hk, g * r, d)
    s_pre = torch.matmul(qg, pk.to(work).transpose(-1, -2))  # [U, Hk, G*r, p]
    s_pre = s_pre.reshape(u, hk, g, r, p).transpose(1, 2).reshape(b, hk, r, p)
    s_own = torch.matmul(q, key.to(work).transpose(-1, -2))  # [B, Hk, r, t]
    scores = torch.cat([s_pre, s_own], dim=-1).mul_(scale)
    if mask is not None:
        m = mask.reshape(b, 1, 1, p + t)
        scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + m.to(work)
    probs = torch.softmax(scores, dim=-1)
    a_pre = probs[..., :p].reshape(u, g, hk, r, p).transpose(1, 2).reshape(u, hk, g * r, p)
    o_pre = torch.matmul(a_pre, pv.to(work)).reshape(u, hk, g, r, d).transpose(1, 2).reshape(b, hk, r, d)
    out = o_pre + torch.matmul(probs[..., p:], value.to(work))
    return out.reshape(b, 1, h, d).to(query.dtype)


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
    """The ``"tc_cascade"`` attention: shared-prefix attention for a decoding step of an active cascade
    layer (`key` is that layer's own part), SDPA for every other call."""
    cache = _ACTIVE.get()
    layer_idx = getattr(module, "layer_idx", None)
    layer = None
    if cache is not None and layer_idx is not None and layer_idx < len(cache.layers):
        layer = cache.layers[layer_idx]
    usable = (
        layer is not None
        and getattr(layer, "cascading", False)
        and key is layer.keys
        and query.shape[2] == 1
        and dropout == 0.0
        and kwargs.get("sliding_window") is None
        and kwargs.get("softcap") is None
        and (attention_mask is None or attention_mask.shape[-1] == layer.get_seq_length())
    )
    if not usable:
        if layer is not None and getattr(layer, "cascading", False) and key is layer.keys:
            # A call the shared form does not cover (several query tokens, a window): plain rows.
            raise RuntimeError(
                "tokencredit cascade attention: unsupported call on a shared-prefix cache "
                f"(query length {query.shape[2]}, sliding_window={kwargs.get('sliding_window')})"
            )
        return _sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return _shared_prefix_attention(query, layer, key, value, attention_mask, scale), None


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
    cache.layers = [layer_cls(room, x.keys, x.values, group) for x in cache.layers]


@contextmanager
def cascade_decoding(model: Any, cache: Any) -> Iterator[None]:
    """While inside, the model attends with ``"tc_cascade"`` and `cache`'s cascade layers are read
    as shared prefix + own part; the model's attention implementation is restored afterwards."""
    _register()
    config = _text_config(model)
    previous = config._attn_implementation_internal
    token = _ACTIVE.set(cache)
    config._attn_implementation_internal = IMPLEMENTATION
    try:
        yield
    finally:
        config._attn_implementation_internal = previous
        _ACTIVE.reset(token)

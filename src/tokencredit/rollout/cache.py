"""The KV cache behind `tokencredit.rollout.generate`: an append-in-place `DynamicLayer` and the shared
prompt prefill (see the package docstring for why and what stays ``generate``'s own)."""

from __future__ import annotations

import functools
import inspect
from typing import Any

from torch import Tensor

__all__ = ["cache_kwarg", "decode_cache", "position_ids", "prefill_kwargs", "prefill_shared"]


@functools.cache
def _append_layer_class() -> type:
    """`_AppendLayer`, built on first use (importing transformers' cache module costs a second)."""
    from transformers.cache_utils import DynamicLayer

    class _AppendLayer(DynamicLayer):
        """A `DynamicLayer` that appends new keys/values in place instead of ``torch.cat``.

        ``keys``/``values`` [B, H, L, D] are views of buffers [B, H, L + spare, D]; an update writes at
        position L of the buffers, and a full buffer is replaced by one twice as long (capped at
        `room` spare positions). Anything that replaces ``keys`` by another tensor (batch selection,
        beam reordering, offloading) is noticed at the next update, which copies it into fresh buffers;
        a crop keeps the view, so the next update overwrites the cropped positions.
        """

        def __init__(self, room: int) -> None:
            super().__init__()
            self.room = room
            self._kbuf: Tensor | None = None
            self._vbuf: Tensor | None = None

        def _owns_views(self) -> bool:
            k, kb = self.keys, self._kbuf
            return (
                kb is not None
                and k.dim() == 4
                and k.data_ptr() == kb.data_ptr()
                and k.stride() == kb.stride()
                and k.shape[:2] == kb.shape[:2]
                and self.values.data_ptr() == self._vbuf.data_ptr()
            )

        def update(
            self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any
        ) -> tuple[Tensor, Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            length = self.keys.shape[-2] if self.keys.numel() else 0
            new = key_states.shape[-2]
            owned = length > 0 and self._owns_views()
            if not owned or length + new > self._kbuf.shape[-2]:
                batch, heads = key_states.shape[:2]
                # Spare positions: as many as held (geometric growth, so the copies cost O(1) a token
                # and memory stays within 2x of DynamicCache's), at most `room` (max_new_tokens).
                size = length + new + min(self.room, max(length + new, 16))
                kbuf = key_states.new_empty(batch, heads, size, key_states.shape[-1])
                vbuf = value_states.new_empty(batch, heads, size, value_states.shape[-1])
                if length:
                    kbuf[:, :, :length].copy_(self.keys)
                    vbuf[:, :, :length].copy_(self.values)
                self._kbuf, self._vbuf = kbuf, vbuf
            self._kbuf[:, :, length : length + new].copy_(key_states)
            self._vbuf[:, :, length : length + new].copy_(value_states)
            self.keys = self._kbuf[:, :, : length + new]
            self.values = self._vbuf[:, :, : length + new]
            return self.keys, self.values

    return _AppendLayer


def _unwrapped(model: Any) -> Any:
    """The Hugging Face model under a peft wrapper (the model itself otherwise)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def cache_kwarg(model: Any) -> str:
    """Name of the forward/generate argument taking a `Cache`: ``cache`` from transformers 5.24 on,
    ``past_key_values`` before (still accepted, with a deprecation warning, for now)."""
    return (
        "cache" if "cache" in inspect.signature(_unwrapped(model).forward).parameters else "past_key_values"
    )


def decode_cache(model: Any, room: int) -> Any:
    """The cache ``generate`` would build by default (`DynamicCache` from the model's config, one layer
    class per layer type) with each plain `DynamicLayer` replaced by an `_AppendLayer` with `room` spare
    positions. None where ``generate`` would build something else (its own cache class, an
    encoder-decoder cache, a `cache_implementation` from the model's generation config): then
    ``generate`` keeps its own."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    base = _unwrapped(model)
    config = base.config
    supports = getattr(base, "_supports_default_dynamic_cache", None)
    wanted = getattr(getattr(base, "generation_config", None), "cache_implementation", None)
    if config.is_encoder_decoder or wanted is not None or (supports is not None and not supports()):
        return None
    cache = DynamicCache(config=config.get_text_config(decoder=True))
    if not getattr(cache, "layers", None):
        return None
    layer = _append_layer_class()
    cache.layers = [layer(room) if type(x) is DynamicLayer else x for x in cache.layers]
    return cache


def position_ids(mask: Tensor) -> Tensor:
    """Positions of left-padded rows as ``generate`` derives them from the attention mask."""
    pos = mask.long().cumsum(-1) - 1
    return pos.masked_fill(mask == 0, 0)


def prefill_kwargs(model: Any, cache: Any, cache_kwarg: str) -> dict[str, Any]:
    """Forward keyword arguments of a prefill into `cache`: the cache, and only the last position's
    logits where the model can skip the others (a prefill's logits are never read)."""
    kwargs: dict[str, Any] = {cache_kwarg: cache, "use_cache": True}
    if "logits_to_keep" in inspect.signature(_unwrapped(model).forward).parameters:
        kwargs["logits_to_keep"] = 1
    return kwargs


def prefill_shared(
    model: Any,
    cache: Any,
    cache_kwarg: str,
    ids: Tensor,
    mask: Tensor,
    rows: Tensor,
    use_mask: bool,
    keep_shared: bool = False,
) -> None:
    """Run the distinct prompts `ids`/`mask` [U, P] without their last token into `cache`, then repeat
    the cache rows to the batch (row i answers prompt rows[i]); ``generate`` runs the last prompt
    token of every row from there. `use_mask` False drops an all-ones mask, as ``generate`` does, so
    the prefill takes the attention path (causal, no mask) ``generate``'s own prefill would.
    `keep_shared`: leave the cache at one row per distinct prompt (for `rollout.cascade.to_cascade`)."""
    model(
        input_ids=ids[:, :-1],
        attention_mask=mask[:, :-1] if use_mask else None,
        position_ids=position_ids(mask)[:, :-1],
        **prefill_kwargs(model, cache, cache_kwarg),
    )
    if not keep_shared:
        cache.batch_select_indices(rows.to(ids.device))

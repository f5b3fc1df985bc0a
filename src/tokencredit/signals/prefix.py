"""The decoder forward of (prompt, response) rows with each distinct prompt computed once (issue 18).

The G rollouts of a group repeat one prompt (about 120 tokens of the "qwen-math" template for the
toy task, against about 60 response tokens), so a plain forward of [N, P+T] spends most of its work
on copies of the same prompt. `decoder_hidden` instead runs each distinct prompt, all but its last
token, once into a `transformers` `DynamicCache` (the library's own cache), repeats the cache rows to
the rollouts (what `Cache.batch_select_indices` does), and runs [last prompt token + response] of
every row against it: the same causal attention over the same keys and values, so the same hidden
states up to float rounding (the kernels see other shapes). Under grad the cache entries are
ordinary autograd tensors and the row selection is an `index_select`, so the backward sums every
rollout's gradient into the shared prompt: the gradient of the [N, P+T] forward, up to float
rounding. This is the training forward's (and the signals passes') counterpart of
`tokencredit.rollout.generate`'s shared prefill.

The plain [N, P+T] forward is kept where sharing would change the result or is not supported:
active dropout (one mask per prompt instead of one per row), gradient checkpointing (transformers
turns the cache off under it), a decoder whose forward takes no cache, a model whose layers are not
all plain full-attention cache layers (sliding windows, linear attention), no repeated prompt, or a
one-token prompt.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor, nn


def _cache_argument(decoder: nn.Module) -> str | None:
    """The forward argument taking a `Cache` (``cache`` from transformers 5.24 on, ``past_key_values``
    before), or None when the decoder takes neither."""
    params = inspect.signature(decoder.forward).parameters
    return next((name for name in ("cache", "past_key_values") if name in params), None)


def _full_attention_cache(decoder: nn.Module) -> object | None:
    """An empty `DynamicCache` for `decoder`'s config when every layer is a plain `DynamicLayer`, else None."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    config = getattr(decoder, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return None
    try:
        cache = DynamicCache(config=config)
    except (AttributeError, KeyError, TypeError, ValueError):  # a config the cache cannot read: no sharing
        return None
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return None
    return cache


def _sharing_changes_result(decoder: nn.Module) -> bool:
    """True when a per-prompt forward would differ from per-row forwards: dropout active in training,
    or gradient checkpointing (which runs without a cache)."""
    if not decoder.training:
        return False
    if getattr(decoder, "gradient_checkpointing", False):
        return True
    if getattr(getattr(decoder, "config", None), "attention_dropout", 0.0):
        return True
    return any(isinstance(m, nn.Dropout) and m.p > 0 and m.training for m in decoder.modules())


def distinct_prompts(
    sequences: Tensor, attention_mask: Tensor, lead: int, stop: int
) -> tuple[Tensor, Tensor]:
    """Rows grouped by their prompt columns [lead, stop) (ids and mask): (first row of each distinct
    prompt [U], index of each row's prompt in that list [N]), distinct prompts in order of first row."""
    n = sequences.shape[0]
    key = torch.where(attention_mask[:, lead:stop] != 0, sequences[:, lead:stop], -1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    rows = torch.arange(n, device=sequences.device)
    first = torch.full((int(inverse.max()) + 1,), n, device=sequences.device).scatter_reduce(
        0, inverse, rows, "amin"
    )
    order = first.argsort()  # distinct prompts in order of their first row, whatever unique's sort order
    rank = torch.empty_like(order).scatter_(0, order, torch.arange(len(order), device=order.device))
    return first[order], rank[inverse]


def decoder_hidden(
    decoder: nn.Module,
    sequences: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    prompt_len: int,
    lead: int,
    end: int,
) -> Tensor:
    """The decoder's final hidden state at columns [prompt_len - 1, end) of every row: [N, end - P + 1, H],
    the state at column P-1+t predicting response token t. Columns before `lead` are padding in every
    row and are dropped. Each distinct prompt runs once when that is exact (module docstring)."""
    stop = prompt_len - 1  # the shared part: the prompt without its last token
    cache_arg = _cache_argument(decoder)
    cache = None
    if stop > lead and cache_arg is not None and not _sharing_changes_result(decoder):
        first, rows = distinct_prompts(sequences, attention_mask, lead, stop)
        if len(first) < sequences.shape[0]:
            cache = _full_attention_cache(decoder)
    if cache is None:
        out = decoder(
            input_ids=sequences[:, lead:end],
            attention_mask=attention_mask[:, lead:end],
            position_ids=position_ids[:, lead:end],
            use_cache=False,
        )
        return _last_hidden(out)[:, stop - lead :]
    decoder(
        input_ids=sequences[first, lead:stop],
        attention_mask=attention_mask[first, lead:stop],
        position_ids=position_ids[first, lead:stop],
        use_cache=True,
        **{cache_arg: cache},
    )
    _repeat_rows(cache, rows)
    out = decoder(
        input_ids=sequences[:, stop:end],
        attention_mask=attention_mask[:, lead:end],
        position_ids=position_ids[:, stop:end],
        use_cache=True,
        **{cache_arg: cache},
    )
    return _last_hidden(out)


def _repeat_rows(cache: object, rows: Tensor) -> None:
    """Row i of every layer's keys / values := row rows[i]: `DynamicLayer.batch_select_indices` with
    index_select instead of advanced indexing, whose backward (index_put with accumulate) costs 5x more
    on CPU; both backwards sum the rows' gradients into their shared prompt."""
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(0, rows)
        layer.values = layer.values.index_select(0, rows)


def _last_hidden(out: object) -> Tensor:
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

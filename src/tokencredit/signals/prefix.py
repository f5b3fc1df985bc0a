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

The distinct prompts themselves usually begin alike (the chat template: 94 of the toy's 121 prompt
tokens before the last). Where that common beginning is at least `MIN_COMMON` tokens it runs once,
[1, common], its cache rows are repeated to the U prompts, and only each prompt's rest runs per prompt
(left-padded between the two parts: positions, and so the attention, are unchanged); a quarter of
the toy's prompt tokens, half the cost of the update's prompt part (docs/experiments/trainer-speed.md#the-templates-common-beginning-shared).

The plain [N, P+T] forward is kept where sharing would change the result or is not supported:
active dropout (one mask per prompt instead of one per row), gradient checkpointing (transformers
turns the cache off under it), a decoder whose forward takes no cache, a model whose layers are not
all plain full-attention cache layers (sliding windows, linear attention), no repeated prompt, or a
one-token prompt.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

if TYPE_CHECKING:  # transformers is imported only when a cache is made (importing it costs seconds)
    from transformers import DynamicCache

__all__ = ["MIN_COMMON", "common_prefix", "decoder_hidden", "distinct_prompts"]

# Shortest common beginning worth its own pass: below it, the extra call costs about what sharing saves.
MIN_COMMON = 16


def common_prefix(ids: Tensor, mask: Tensor) -> int:
    """Number of leading real tokens that all left-padded rows `ids`/`mask` [U, P] share, at most the
    shortest row's length - 1 (a prompt's last token is never part of a shared pass)."""
    lengths = mask.sum(dim=1)
    m = int(lengths.min()) - 1
    if m <= 0 or ids.shape[0] < 1:
        return 0
    starts = ids.shape[1] - lengths
    toks = ids.gather(1, starts[:, None] + torch.arange(m, device=ids.device))
    same = (toks == toks[:1]).all(dim=0)
    return int(same.long().cumprod(0).sum())


def split_common(ids: Tensor, mask: Tensor, common: int) -> tuple[Tensor, Tensor, Tensor]:
    """Left-padded rows [U, P] whose first `common` real tokens are the same, as (the common tokens
    [common], the rests left-padded [U, W], their mask [U, W] long), W = longest rest."""
    u, p = ids.shape
    lengths = mask.sum(dim=1)
    width = int(lengths.max()) - common
    cols = torch.arange(width, device=ids.device)
    rest = ids[:, p - width :]  # a rest is right-aligned at the prompt's end, as the prompt is
    rest_mask = (cols[None, :] >= (width - (lengths - common))[:, None]).long()
    head = ids[0, p - int(lengths[0]) :][:common]
    return head, rest, rest_mask


def _cache_argument(decoder: nn.Module) -> str | None:
    """The forward argument taking a `Cache` (``cache`` from transformers 5.24 on, ``past_key_values``
    before), or None when the decoder takes neither."""
    params = inspect.signature(decoder.forward).parameters
    return next((name for name in ("cache", "past_key_values") if name in params), None)


def _full_attention_cache(decoder: nn.Module) -> DynamicCache | None:
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


def _sharing_plan(
    decoder: nn.Module, sequences: Tensor, attention_mask: Tensor, lead: int, stop: int
) -> tuple[str, DynamicCache, Tensor, Tensor] | None:
    """How `decoder_hidden` shares the prompt columns [lead, stop): (the decoder's cache argument, an empty
    cache, first row of each distinct prompt [U], each row's prompt [N]); None where sharing would change
    the result, is not supported, or saves nothing (no repeated prompt): then the plain forward runs."""
    cache_arg = _cache_argument(decoder)
    if stop <= lead or cache_arg is None or _sharing_changes_result(decoder):
        return None
    first, rows = distinct_prompts(sequences, attention_mask, lead, stop)
    if len(first) == sequences.shape[0]:
        return None
    cache = _full_attention_cache(decoder)
    return None if cache is None else (cache_arg, cache, first, rows)


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
    plan = _sharing_plan(decoder, sequences, attention_mask, lead, stop)
    if plan is None:
        out = decoder(
            input_ids=sequences[:, lead:end],
            attention_mask=attention_mask[:, lead:end],
            position_ids=position_ids[:, lead:end],
            use_cache=False,
        )
        return _last_hidden(out)[:, stop - lead :]
    cache_arg, cache, first, rows = plan
    run = functools.partial(decoder, use_cache=True, **{cache_arg: cache})
    ids, mask = sequences[first, lead:stop], attention_mask[first, lead:stop]
    u = len(first)
    common = common_prefix(ids, mask) if u > 1 else 0
    if common >= MIN_COMMON:  # the common beginning once, then each prompt's rest (module docstring)
        head, rest, rest_mask = split_common(ids, mask, common)
        start = stop - int(mask[0].sum())
        run(input_ids=head[None, :], position_ids=position_ids[first[:1], start : start + common])
        _repeat_rows(cache, torch.zeros(u, dtype=torch.long, device=sequences.device))
        prompt_mask = torch.cat([torch.ones_like(rest_mask[:, :1]).expand(u, common), rest_mask], 1)
        if rest.shape[1]:
            run(
                input_ids=rest,
                attention_mask=prompt_mask,
                position_ids=position_ids[first, stop - rest.shape[1] : stop],
            )
    else:
        run(input_ids=ids, attention_mask=mask, position_ids=position_ids[first, lead:stop])
        prompt_mask = mask
    _repeat_rows(cache, rows)
    out = run(
        input_ids=sequences[:, stop:end],
        attention_mask=torch.cat(
            [prompt_mask.to(attention_mask.dtype)[rows], attention_mask[:, stop:end]], 1
        ),
        position_ids=position_ids[:, stop:end],
    )
    return _last_hidden(out)


def _repeat_rows(cache: DynamicCache, rows: Tensor) -> None:
    """Row i of every layer's keys / values := row rows[i]: `DynamicLayer.batch_select_indices` with
    index_select instead of advanced indexing, whose backward (index_put with accumulate) costs 5x more
    on CPU; both backwards sum the rows' gradients into their shared prompt."""
    from transformers.cache_utils import DynamicLayer  # loaded already: the cache is one of its classes

    for layer in cache.layers:
        # `_full_attention_cache` made every layer a DynamicLayer and the prompt pass filled it; the check
        # narrows the types of `cache.layers` (any cache layer) and of keys / values (None before a pass)
        if not isinstance(layer, DynamicLayer) or layer.keys is None or layer.values is None:
            raise RuntimeError(
                f"shared-prompt cache: layer {type(layer).__name__} is not a filled DynamicLayer"
            )
        layer.keys = layer.keys.index_select(0, rows)
        layer.values = layer.values.index_select(0, rows)


def _last_hidden(out: object) -> Tensor:
    """The final hidden state [rows, cols, H] of a decoder's output (`nn.Module.__call__` is untyped): a
    transformers `ModelOutput`'s last_hidden_state, or the first item of its tuple form (return_dict=False)."""
    hidden: object = None
    if hasattr(out, "last_hidden_state"):
        hidden = getattr(out, "last_hidden_state", None)
    elif isinstance(out, Sequence):
        hidden = out[0]
    if not isinstance(hidden, Tensor):
        raise TypeError(f"the decoder returned {type(out).__name__}, which holds no final hidden state")
    return hidden

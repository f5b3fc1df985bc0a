"""`generate`: batched sampling of completions with a Hugging Face causal LM (the trainer, eval, probe).

Each prompt is tokenised once (left-padded) and its ids repeated `num_samples` times; all
prompts x samples go through one ``model.generate`` call (or chunks of `batch_size` sequences)
with the KV cache on and finished sequences stopped at EOS. The output is right-padded: for
rollout i, ``response_ids[i, :L_i]`` are the generated tokens up to and including the EOS that
ended it, and ``response_mask`` marks exactly those.

How to sample (temperature, top_p, top_k, max_new_tokens, batch_size) is one frozen `SamplingSettings`
(`tokencredit.rollout.settings`), passed as ``sampling=`` or field by field as keywords.

Four changes to what ``generate`` would do on its own make decoding cheaper without changing what it
samples (benchmarks/bench_generation.py, docs/experiments/trainer-speed.md#generation-shared-prompt-prefill-and-an-append-in-place-cache):

- *Shared prompt prefill.* The `num_samples` copies of a prompt have the same keys and values, so the
  prompt (all but its last token) runs through the model once per distinct prompt and the cache
  rows are then repeated (`Cache.batch_select_indices`); ``generate`` starts from that cache and
  runs only the last prompt token for every row. With 8 samples a prompt this is 1/8 of the prefill.
- *Append-in-place cache.* `transformers.DynamicCache` grows each layer with ``torch.cat``, copying
  the whole cache at every decoding step (a third of the toy model's decoding time). `_AppendLayer`
  keeps the same keys/values in buffers with spare positions (doubling, at most `max_new_tokens`)
  and writes each step's entries in place; attention reads a view of the filled part, the same values.
- *Shared-prefix attention* (`tokencredit.rollout.cascade`). Where the model attends with ``sdpa``,
  keys/values that rows share are held once: the prompts' common beginning (the chat template: 94 of
  the toy's 122 prompt tokens) once for the whole chunk, prefilled once, and each prompt's rest once
  for its G >= 2 adjacent samples. Each decoding step reads every shared block once, in one softmax
  with the row's own part. On the toy this halves the attention of a rollout round and cuts the
  prefill of 64 distinct evaluation prompts about 4x (docs/experiments/trainer-speed.md#shared-prefix-decoding-attention and
  #the-templates-common-beginning-shared).
- *Our decoding loop* (`tokencredit.rollout.decode`), on the shared-prefix path for Llama, Qwen2 and
  Qwen3 models: ``generate``'s sampling loop written out, each step the model's own modules layer by
  layer, without ``generate``'s and the forward's per-step bookkeeping (about 12% of a toy rollout
  round, docs/experiments/trainer-speed.md#our-own-decoding-loop). Same warpers, same draws, same tokens as ``generate``.

The first three are the library's own mechanisms (a `Cache` passed to ``generate``, `DynamicLayer`
subclasses, a function registered in `AttentionInterface`); elsewhere sampling, the logits processors
and stopping are ``generate``'s. Samples are the same as a plain ``model.generate`` call under the
same seed as long as the forward computes the same logits for a row whatever the batch around it: the shared prefill
gives the same keys and values; the shared-prefix attention equals SDPA's up to float rounding (it
sums in another order), so a sampled token could in principle flip where a uniform draw falls within
rounding of a boundary. In float32 on CPU (toy model, tiny Qwen3 with and without a template
beginning, with LoRA, in the tests; the default `tokencredit train` run, whose 43 metric records and
saved rollouts are unchanged) every output was identical. In bfloat16 a row's logits move by a
rounding step with the batch around it even under plain ``generate`` (~2e-3 on the tiny Qwen3), so
there greedy outputs were identical and sampled ones can differ where a draw sits on a boundary; the
tests check each decoding step's logits against a plain forward to 2 bf16 rounding steps. A GPU
library may pick other kernels for the smaller prefill batch, with the same effect;
`generate_ids(..., shared_attention=False)` turns the shared-prefix attention (and so our loop) off.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tokencredit.rollout.cache import cache_kwarg, decode_cache, prefill_shared
from tokencredit.rollout.cascade import cascade_decoding, cascade_supported, prefill_common, to_cascade
from tokencredit.rollout.decode import decode_loop, layered_supported
from tokencredit.rollout.settings import SamplingSettings
from tokencredit.signals.prefix import MIN_COMMON, common_prefix

__all__ = [
    "PromptResponseLayout",
    "Rollouts",
    "SamplingSettings",
    "generate",
    "generate_ids",
    "generation_config",
    "response_mask_from_ids",
    "sampling_settings",
    "special_ids",
]


@dataclass
class PromptResponseLayout:
    """`sequences` / `attention_mask` of a batch held as left-padded prompts + right-padded responses
    (fields prompt_ids, prompt_mask, response_ids, response_mask)."""

    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    response_mask: Tensor

    @property
    def sequences(self) -> Tensor:
        """[N, P+T] int64: prompt then response, the layout `tokencredit.signals` reads."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> Tensor:
        """[N, P+T] int64: 1 on real prompt tokens and valid response tokens."""
        return torch.cat([self.prompt_mask.long(), self.response_mask.long()], dim=1)


@dataclass
class Rollouts(PromptResponseLayout):
    """N = len(prompts) * num_samples sampled completions, rollout i answering prompt prompt_index[i].

    prompt_ids [N,P] int64, left-padded with the pad id; prompt_mask [N,P] bool (real tokens).
    response_ids [N,T] int64, right-padded with the pad id; response_mask [N,T] bool (generated
      tokens including the EOS that ended the answer); truncated [N] bool (hit max_new_tokens
      without EOS); texts: decoded responses without special tokens; prompt_index [N] int64.
    """

    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    response_mask: Tensor
    truncated: Tensor
    texts: list[str]
    prompt_index: Tensor
    pad_token_id: int
    eos_token_ids: tuple[int, ...]

    @property
    def num_rollouts(self) -> int:
        return int(self.response_ids.shape[0])

    @property
    def response_lengths(self) -> Tensor:
        """[N] int64 number of valid response tokens."""
        return self.response_mask.sum(dim=1)


def _as_list(x: Any) -> list[int]:
    if x is None:
        return []
    if isinstance(x, int):
        return [x]
    return [int(v) for v in x]


def special_ids(
    model: Any, tokenizer: Any, eos_token_id: int | Sequence[int] | None = None
) -> tuple[list[int], int]:
    """(eos ids, pad id): eos from the argument, else the model's generation config plus the
    tokenizer's eos; pad from the tokenizer, else the first eos id."""
    if eos_token_id is not None:
        eos = _as_list(eos_token_id)
    else:
        gen_cfg = getattr(model, "generation_config", None)
        eos = _as_list(getattr(gen_cfg, "eos_token_id", None))
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
            eos.append(int(tokenizer.eos_token_id))
    if not eos:
        raise ValueError(
            "generation needs an EOS token: the tokenizer and the model's generation config define none"
        )
    pad = tokenizer.pad_token_id
    return eos, int(eos[0] if pad is None else pad)


@contextmanager
def _generation_mode(model: Any, tokenizer: Any, pad_id: int):
    """Left padding, a pad token and eval mode while generating; everything restored afterwards."""
    side = tokenizer.padding_side
    had_pad = tokenizer.pad_token_id is not None
    was_training = bool(getattr(model, "training", False))
    tokenizer.padding_side = "left"
    if not had_pad:
        tokenizer.pad_token_id = pad_id
    model.eval()
    try:
        yield
    finally:
        tokenizer.padding_side = side
        if not had_pad:
            tokenizer.pad_token = None
        if was_training:
            model.train()


def response_mask_from_ids(response_ids: Tensor, eos_ids: Sequence[int]) -> tuple[Tensor, Tensor]:
    """(mask [N,T] bool, truncated [N] bool) from generated ids: valid up to and including the
    first EOS; a row with no EOS is truncated and fully valid."""
    is_eos = torch.isin(response_ids, torch.as_tensor(list(eos_ids), device=response_ids.device))
    seen = is_eos.long().cumsum(dim=1)
    mask = (seen - is_eos.long()) == 0
    truncated = ~is_eos.any(dim=1)
    return mask, truncated


def _equal_groups(rows: Tensor) -> int:
    """G where `rows` is 0,..,0, 1,..,1, ..., U-1 (each prompt's G rows adjacent, G >= 2), else 0."""
    n, u = rows.numel(), int(rows[-1]) + 1
    if n % u or n // u < 2:
        return 0
    g = n // u
    return g if torch.equal(rows, torch.arange(u).repeat_interleave(g)) else 0


def _seed_from(seed: int | None, generator: torch.Generator | None) -> int | None:
    if seed is not None and generator is not None:
        raise ValueError("give either seed or generator, not both")
    if generator is not None:
        return int(torch.randint(0, 2**62, (1,), generator=generator).item())
    return seed


@contextmanager
def _rng(seed: int | None, device: torch.device):
    if seed is None:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def generation_config(
    temperature: float, top_p: float, top_k: int, max_new_tokens: int, eos_ids: Sequence[int], pad_id: int
) -> Any:
    """The `GenerationConfig` of `generate`: greedy at temperature 0, else plain sampling restricted
    only by `top_p` and `top_k` (0 = off); every other processor of the model's own generation config
    (repetition penalty, min_p, ...) is switched off."""
    from transformers import GenerationConfig

    greedy = temperature == 0
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=not greedy,
        temperature=None if greedy else float(temperature),
        top_p=None if greedy else float(top_p),
        top_k=None if greedy else int(top_k),
        min_p=None,
        typical_p=1.0,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        num_beams=1,
        num_return_sequences=1,
        min_new_tokens=0,
        eos_token_id=list(eos_ids),
        pad_token_id=pad_id,
        use_cache=True,
    )


def generate_ids(
    model: Any,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    num_samples: int,
    *,
    eos_ids: Sequence[int],
    pad_id: int,
    sampling: SamplingSettings,
    seed: int | None = None,
    shared_attention: bool = True,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Sample `num_samples` continuations of each left-padded prompt of token ids [U, P] (`prompt_mask`
    marks the real tokens): (prompt_index [N], response_ids [N,T], response_mask [N,T], truncated [N]),
    N = U x num_samples, responses right-padded with `pad_id`, valid up to and including the EOS.

    The id-level core of `generate` (which tokenises text prompts and decodes the responses); the
    Monte-Carlo oracle calls it on prompt + response prefixes, token for token. `sampling`: the settings,
    batches of `sampling.batch_size` sequences (all at once by default); one seeded RNG fork for the whole call. `shared_attention` False keeps every
    row's own copy of its prompt in the cache (the shared-prefix attention of
    `tokencredit.rollout.cascade` off).
    """
    gen_cfg = generation_config(
        sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_new_tokens, eos_ids, pad_id
    )
    device = next(model.parameters()).device
    prompt_index = torch.arange(prompt_ids.shape[0]).repeat_interleave(num_samples)
    ids_all = prompt_ids.to(torch.long).repeat_interleave(num_samples, dim=0)
    mask_all = prompt_mask.to(torch.bool).repeat_interleave(num_samples, dim=0)
    n = ids_all.shape[0]
    step = n if sampling.batch_size is None else sampling.batch_size
    chunks: list[Tensor] = []
    cascade = shared_attention and cascade_supported(model)
    with _rng(seed, device), torch.no_grad():
        for s in range(0, n, step):
            ids = ids_all[s : s + step].to(device)
            att = mask_all[s : s + step].to(device).long()
            # Distinct prompts of this chunk (rows of a prompt are adjacent) and each row's one.
            distinct, rows = torch.unique_consecutive(prompt_index[s : s + step], return_inverse=True)
            shared = (prompt_ids[distinct].to(device).long(), prompt_mask[distinct].to(device).long(), rows)
            chunks.append(_generate_chunk(model, ids, att, shared, gen_cfg, cascade).to("cpu", torch.long))
    width = max(c.shape[1] for c in chunks)
    response_ids = torch.full((n, width), pad_id, dtype=torch.long)
    response_mask = torch.zeros((n, width), dtype=torch.bool)
    truncated = torch.zeros(n, dtype=torch.bool)
    row = 0
    for c in chunks:
        m, tr = response_mask_from_ids(c, eos_ids)
        k, t = c.shape
        response_mask[row : row + k, :t] = m
        truncated[row : row + k] = tr
        response_ids[row : row + k, :t] = torch.where(m, c, torch.full_like(c, pad_id))
        row += k
    return prompt_index, response_ids, response_mask, truncated


def _generate_chunk(
    model: Any, ids: Tensor, att: Tensor, shared: tuple[Tensor, Tensor, Tensor], gen_cfg: Any, cascade: bool
) -> Tensor:
    """One ``generate`` call on rows `ids`/`att` [n, P] whose prompts are `shared` = (distinct prompt ids
    and mask [U, P], each row's prompt [n]). Where `cascade`: the prompts' common beginning (the chat
    template) prefilled once and each prompt's rest once (`cascade.prefill_common`), else the distinct
    prompts prefilled once; both read once per group of rows by the shared-prefix attention where the
    rows come in equal adjacent groups (else repeated to the rows). Returns ``generate``'s [n, P' + T]
    output (P' columns of prompt, in the layout the prefill chose)."""
    room = gen_cfg.max_new_tokens + 1
    kwarg = cache_kwarg(model)
    cache = decode_cache(model, room=room)
    d_ids, d_mask, rows = shared
    group = _equal_groups(rows) if cascade else 0
    common = common_prefix(d_ids, d_mask) if cascade and cache is not None and ids.shape[1] > 1 else 0
    on = False
    if common >= MIN_COMMON:
        ids, att = prefill_common(
            model, cache, kwarg, d_ids, d_mask, rows, common, group, room, gen_cfg.pad_token_id
        )
        on = True
    elif cache is not None and len(d_ids) < len(rows) and ids.shape[1] > 1:
        # generate drops an all-ones mask (no padding): attention then runs causal without one.
        use_mask = not bool(att.all())
        prefill_shared(model, cache, kwarg, d_ids, d_mask, rows, use_mask, keep_shared=group > 0)
        if group:
            to_cascade(cache, room=room, group=group)
            on = True
    extra = {} if cache is None else {kwarg: cache}
    with cascade_decoding(model, cache) if on else nullcontext():
        if on and layered_supported(model):
            return decode_loop(model, cache, ids, att, gen_cfg)
        out = model.generate(input_ids=ids, attention_mask=att, generation_config=gen_cfg, **extra)
    return out[:, ids.shape[1] :]


def _checked_prompts(prompts: Sequence[str], num_samples: int) -> list[str]:
    """`prompts` as a list; ValueError for no prompts, a prompt that is not a str, or num_samples < 1."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("no prompts to generate from")
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise ValueError(f"prompt {i}: expected a str, got {type(p).__name__}")
    return prompts


def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    num_samples: int = 1,
    *,
    sampling: SamplingSettings | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    max_new_tokens: int | None = None,
    batch_size: int | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    add_special_tokens: bool | None = None,
    shared_attention: bool = True,
) -> Rollouts:
    """Sample `num_samples` completions for each already-templated prompt.

    The sampling settings come as one `SamplingSettings` (`sampling`) or as its fields by keyword
    (`temperature`, `top_p`, `top_k`, `max_new_tokens`, `batch_size`; those not given take the
    `SamplingSettings` defaults: 1.0, 1.0, 0, 256, None), not both. temperature == 0 decodes greedily;
    `top_k` = 0 disables top-k (the model's generation config is overridden, so sampling follows
    softmax(logits / temperature) restricted only by top_p and top_k); `batch_size` caps the sequences
    per ``generate`` call (default: all in one call).
    `seed` (or a draw from `generator`) seeds sampling without disturbing the global RNG.
    `add_special_tokens` (default: True unless the prompts already start with the BOS token)
    is passed to the tokenizer. `shared_attention`: see `generate_ids`.
    """
    sampling = sampling_settings(
        sampling,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
    )
    prompts = _checked_prompts(prompts, num_samples)
    eos_ids, pad_id = special_ids(model, tokenizer, eos_token_id)
    if add_special_tokens is None:
        bos = getattr(tokenizer, "bos_token", None)
        add_special_tokens = not (bos and all(p.startswith(bos) for p in prompts))
    with _generation_mode(model, tokenizer, pad_id):
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=add_special_tokens)
        p_ids, p_mask = enc["input_ids"].to(torch.long), enc["attention_mask"].to(torch.bool)
        prompt_index, response_ids, response_mask, truncated = generate_ids(
            model,
            p_ids,
            p_mask,
            num_samples,
            eos_ids=eos_ids,
            pad_id=pad_id,
            sampling=sampling,
            seed=_seed_from(seed, generator),
            shared_attention=shared_attention,
        )
    texts = tokenizer.batch_decode(
        [response_ids[i, response_mask[i]].tolist() for i in range(len(prompt_index))],
        skip_special_tokens=True,
    )
    return Rollouts(
        prompt_ids=p_ids.repeat_interleave(num_samples, dim=0),
        prompt_mask=p_mask.repeat_interleave(num_samples, dim=0),
        response_ids=response_ids,
        response_mask=response_mask,
        truncated=truncated,
        texts=texts,
        prompt_index=prompt_index,
        pad_token_id=pad_id,
        eos_token_ids=tuple(eos_ids),
    )


def sampling_settings(sampling: SamplingSettings | None = None, **fields: Any) -> SamplingSettings:
    """`sampling`, or a `SamplingSettings` of the keyword `fields` given (not None) over its defaults;
    a ValueError when both are given (the keyword API of `generate` / `generate_ids`)."""
    given = {k: v for k, v in fields.items() if v is not None}
    if sampling is None:
        return SamplingSettings(**given)
    if given:
        raise ValueError(f"give either sampling or {', '.join(sorted(given))}, not both")
    return sampling

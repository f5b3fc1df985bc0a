"""Token-in, token-out sampling from a Hugging Face causal LM with a KV cache (the `hf` rollout server's core).

`sample` draws one continuation the way verl's vLLM server is asked to: temperature (0 = greedy),
top-k (-1 or 0 = off), top-p, at most `max_tokens` new tokens, stop after any id in `stop_ids`
(which is kept in the output, as vLLM keeps the EOS token). It returns the log-probability of each
drawn token under the distribution it was drawn from ("processed" log-probs: after temperature and
top-k / top-p renormalisation, verl's default ``logprobs_mode``) or under the raw logits ("raw").
"""

from __future__ import annotations

import inspect
from collections.abc import Collection

import torch
from torch import Tensor, nn

__all__ = ["LOGPROB_MODES", "filter_logits", "sample"]

LOGPROB_MODES = ("processed_logprobs", "raw_logprobs")


def filter_logits(logits: Tensor, top_k: int, top_p: float) -> Tensor:
    """logits [V] float32 with -inf outside the top-k tokens and outside the smallest set whose
    probability reaches top_p (the token that crosses top_p is kept). top_k <= 0 and top_p >= 1: off."""
    out = logits
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(out, top_k).values[-1]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        srt, idx = torch.sort(out, descending=True)
        probs = srt.softmax(-1)
        before = probs.cumsum(-1) - probs  # mass of the tokens ranked above each token
        drop = torch.zeros_like(out, dtype=torch.bool).scatter(0, idx, before >= top_p)
        out = out.masked_fill(drop, float("-inf"))
    return out


@torch.no_grad()
def sample(
    model: nn.Module,
    prompt_ids: list[int],
    max_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
    stop_ids: Collection[int] = (),
    generator: torch.Generator | None = None,
    logprobs_mode: str = "processed_logprobs",
) -> tuple[list[int], list[float], bool]:
    """(new token ids, their log-probs, stopped on a stop id) for one prompt; prefill once, then one
    cached forward per token."""
    if logprobs_mode not in LOGPROB_MODES:
        raise ValueError(f"logprobs_mode must be one of {LOGPROB_MODES}, got {logprobs_mode!r}")
    if max_tokens < 1 or not prompt_ids:
        raise ValueError(
            f"need a non-empty prompt and max_tokens >= 1 (got {len(prompt_ids)} ids, {max_tokens})"
        )
    device = next(model.parameters()).device
    # transformers 5.x names the KV cache `cache` (argument and output); earlier versions `past_key_values`
    cache = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out = model(input_ids=torch.tensor([prompt_ids], device=device), use_cache=True)
    tokens: list[int] = []
    log_probs: list[float] = []
    for step in range(max_tokens):
        raw = out.logits[0, -1].float()
        if temperature > 0:
            processed = filter_logits(raw / temperature, top_k, top_p)
            token = int(torch.multinomial(processed.softmax(-1), 1, generator=generator))
        else:  # greedy: vLLM's temperature 0
            processed = raw
            token = int(raw.argmax())
        dist = processed if logprobs_mode == "processed_logprobs" else raw
        log_probs.append(float(dist.log_softmax(-1)[token]))
        tokens.append(token)
        if token in stop_ids:
            return tokens, log_probs, True
        if step + 1 < max_tokens:
            step_input = torch.tensor([[token]], device=device)
            out = model(input_ids=step_input, use_cache=True, **{cache: getattr(out, cache)})
    return tokens, log_probs, False

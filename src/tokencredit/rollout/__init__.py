"""Batched sampling of completions with a Hugging Face causal LM (used by the trainer and by eval).

`generate` samples `num_samples` completions of each prompt in one batched call and returns them
right-padded with their response mask (`Rollouts`); `generate_ids` does the same on token ids. How to
sample (temperature, top_p, top_k, max_new_tokens, batch_size) is one frozen `SamplingSettings`
(`tokencredit.rollout.settings`), passed as ``sampling=`` or field by field as keywords.

Modules: `generation` (`generate`, `generate_ids`, the rollouts' layout, and what makes decoding cheaper
without changing what it samples: its docstring), `settings` (`SamplingSettings`), `cache` (the shared
prompt prefill and the append-in-place cache), `cascade` (shared-prefix attention), `decode` (our
decoding loop for Llama / Qwen models), `records` (the saved-rollouts JSONL the trainer and the plugins
write and explain / probe read), `prime_rl` (prime-rl's per-token exports: layout and recognition);
these two are not imported here.
"""

from tokencredit.rollout.generation import (
    PromptResponseLayout,
    Rollouts,
    generate,
    generate_ids,
    generation_config,
    response_mask_from_ids,
    sampling_settings,
    special_ids,
)
from tokencredit.rollout.settings import SamplingSettings

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

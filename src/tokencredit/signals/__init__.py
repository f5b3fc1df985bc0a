"""Per-token signals of a causal LM on (prompt, response) sequences, computed without [N,T,V] tensors.

Two entry points:

- `token_log_probs(model, ...)`: log pi(y_t) [N,T] (and optionally the full-vocabulary entropy),
  differentiable when called under grad. The trainer uses it for the training forward.
- `compute_signals(model, ..., needs)`: the detached per-token signals a credit method declares
  (names from `tokencredit.batch.SIGNALS`), in the fewest forwards: ONE old-policy forward per
  micro-batch for old_log_probs + entropy + hidden (+ sum_sq_probs) together, ONE adapter-disabled forward for
  base_hidden + base_log_probs (+ ref_log_probs when the LoRA base is the reference), ONE forward
  of `ref_model` for ref_log_probs, ONE negative-prompt forward for neg_log_probs (GCPO). A signal
  that is not asked for costs nothing.

Sequence layout: `sequences` [N, P+T] int64 = left-padded prompt (P columns) then right-padded
response (T columns); `attention_mask` [N, P+T]; the logits at column P-1+t predict response
token t, so `hidden[:, t]` is the LM head's input at column P-1+t. Position ids are
cumsum(attention_mask) - 1 (0 on padding), as `transformers`' `generate` uses for left-padded
prompts, so a left-padded row gets the values it would get alone.

How the logits are formed (the design choice behind the memory bound): the model's decoder
(`get_decoder()` of the transformers model, reached through a peft wrapper; LoRA layers live inside
it, so the adapter applies) runs once and returns the final hidden state after the final norm,
which is exactly the tensor the causal-LM forward feeds to the LM head. We keep only the
response-predicting positions (and only valid tokens), then apply the LM head module itself
(`get_output_embeddings()`; if peft wrapped it because it was targeted, the LoRA term is
included) to `chunk_size` tokens at a time and reduce each chunk to float32 log-prob/entropy.
The hidden signal is that same decoder output, so no hook and no `output_hidden_states` copy of
every layer is needed. Gemma-style `final_logit_softcapping` is applied; other config-driven logit
rescalings (`logits_scaling`, `logit_scale`, `output_multiplier`) are refused with a ConfigError
rather than silently ignored.

Shared prompts: the G rollouts of a group repeat one prompt, so every pass (and the training forward,
under grad) runs each distinct prompt once into the model's KV cache and only [last prompt token +
response] per row against it (`tokencredit.signals.prefix`): the same values and gradients up to
float rounding, at about half the work of [N, P+T] for the toy task's ~120-token prompts.

Memory: under no-grad at most two [chunk_size, V] float32 buffers (plus the LM head's output in
the model dtype when that is not float32) exist at once. Under grad each chunk runs inside
`torch.utils.checkpoint`, so its logits are freed after the forward and recomputed in the
backward: the peak stays O(chunk_size x V) at the cost of one extra LM-head matmul per chunk.

Temperature: log-probs and entropy use logits / temperature (the sampling temperature; verl's
convention), for every pass (old, base, ref, negative prompt).
"""

from tokencredit.signals.compute import compute_signals, negative_prompt_inputs
from tokencredit.signals.forward import token_log_probs
from tokencredit.signals.head import DEFAULT_CHUNK_SIZE, chunked_log_probs
from tokencredit.signals.model import eval_mode, has_lora_adapter, position_ids_from_mask

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "chunked_log_probs",
    "compute_signals",
    "eval_mode",
    "has_lora_adapter",
    "negative_prompt_inputs",
    "position_ids_from_mask",
    "token_log_probs",
]

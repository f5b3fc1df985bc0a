"""verl actor extension: the per-token signals verl's actor does not compute, from its old-log-prob step.

DelTA needs the final hidden state, ARCA the hidden state with and without the LoRA adapter, policy
divergence the adapter-free log-probs, GCPO the log-probs of the response after a negative prompt.
verl 0.9's actor (the FSDP engine behind ``ActorRolloutRefWorker.compute_log_prob``) returns only
log-probs and entropy, so with the switch on this module adds, per micro-batch of that same call:

- ``hidden``: the LM head's input captured (forward hook) during verl's own forward, so log-probs,
  entropy and hidden states come from ONE forward; only the rows that predict response tokens are
  kept, in the model's compute dtype (the LM head's input dtype; casting up adds nothing);
- ``base_hidden`` / ``base_log_probs``: one more forward of the same micro-batch inside verl's
  ``engine.disable_adapter()`` (LoRA only);
- ``neg_log_probs``: one more forward of [negative prompt + the same response tokens]; the driver
  builds the negative prompts (`negative_prompts`) from the chat messages verl keeps in
  ``non_tensor_batch["raw_prompt"]``;
- ``entropy`` (verl's own signal, which sets the kept set of the 80/20 rule and S-trace): in every
  forward-only step that computes it, float32 from the same logits without cancellation
  (`float32_entropy`); verl's formula returns exactly 0 for confident tokens, which ties most of a
  late-training batch at 0. This part needs no request, so it also covers the v1 trainer.

A signal is computed only when the selected ``tc_`` estimator needs it. Each is returned as a jagged
tensor with one row per response token ([r_i] or [r_i, H], r_i = response length of sequence i), the
driver pads it to [bs, T(, H)] with zeros outside ``response_mask`` and stores it under the batch
key in `BATCH_KEYS` (``tc_hidden``, ``tc_base_hidden``, ``tc_base_log_probs``, ``tc_neg_log_probs``),
where the estimators read it; the plugin drops those keys again after the advantage step, so they
never travel to the actor update.

The switch is the environment variable `SWITCH` (``TOKENCREDIT_VERL_ACTOR_SIGNALS=1``), read by
`enabled`; it must be set in the driver and in the Ray workers. `tokencredit.integrations.verl`
(which checks the verl version) imports this module and installs both halves: `wrap_forward_step`
on ``FSDPEngineWithLMHead.forward_step`` (worker) and `requesting` around the legacy trainer's
``_compute_old_log_prob`` (driver). `check_target` refuses a verl whose wrapped methods have another
signature. Supported: the FSDP / FSDP2 engines, padded or remove-padding inputs, text-only models,
the legacy trainer (``trainer.use_v1=False``); refused with a clear error: Ulysses sequence
parallelism, fused-kernel LM heads (no LM-head call to hook), multi-modal inputs.

Modules: `keys` (the switch, the batch keys, the signature check), `worker` (the hooks run in verl's
actor workers), `driver` (the request and the padding of the results in verl's driver).
"""

from tokencredit.integrations.verl_actor.driver import collect, negative_prompts, requesting
from tokencredit.integrations.verl_actor.keys import BATCH_KEYS, SWITCH, check_target, enabled, requested
from tokencredit.integrations.verl_actor.worker import float32_entropy, wrap_forward_step

__all__ = [
    "BATCH_KEYS",
    "SWITCH",
    "check_target",
    "collect",
    "enabled",
    "float32_entropy",
    "negative_prompts",
    "requested",
    "requesting",
    "wrap_forward_step",
]

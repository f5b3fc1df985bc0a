"""verl actor extension: the per-token signals verl's actor does not compute, from its old-log-prob step.

DelTA needs the final hidden state, ARCA the hidden state with and without the LoRA adapter, policy
divergence the adapter-free log-probs, GCPO the log-probs of the response after a negative prompt.
verl 0.9's actor (the FSDP engine behind ``ActorRolloutRefWorker.compute_log_prob``) returns only
log-probs and entropy, so with the switch on this module adds, in that same call:

- ``hidden``: the LM head's input captured (forward hook) during verl's own forward, so log-probs,
  entropy and hidden states come from ONE forward; only the rows that predict response tokens are
  kept, in the model's compute dtype. Hidden states never leave a worker: the workers return the
  per-token reduction the credit method needs (`reductions`), [r_i] float32 per response:
  - ARCA (``adapter_residual`` -> ``tc_adapter_residual``): ||h_t - h_t^base||_2, per micro-batch, from
    the policy forward and one more forward of the same micro-batch inside verl's
    ``engine.disable_adapter()`` (LoRA only), the core's reduced signal ``adapter_residual``, from which the
    credit method `arca` builds its salience weights and Â;
  - DelTA (``delta_coef`` -> ``tc_delta_coef``): the coefficients c~, computed once the rank has run all
    its micro-batches (the wrapped ``infer_batch``), with the batch statistics summed over the
    data-parallel group (`tokencredit.credit.delta.discriminate` with a `tokencredit.distributed.Shard`),
    the core's reduced signal ``delta_coefficients``, from which the credit method `delta` forms Â = A c~;
- ``base_log_probs``: the log-probs of that adapter-free forward (policy divergence);
- ``neg_log_probs``: one more forward of [negative prompt + the same response tokens]; the driver
  builds the negative prompts (`negative_prompts`) from the chat messages verl keeps in
  ``non_tensor_batch["raw_prompt"]``;
- ``entropy`` (verl's own signal, which sets the kept set of the 80/20 rule and S-trace): in every
  forward-only step that computes it, float32 from the same logits without cancellation
  (`float32_entropy`); verl's formula returns exactly 0 for confident tokens, which ties most of a
  late-training batch at 0. This part needs no request, so it also covers the v1 trainer.

DelTA across data-parallel ranks. Its coefficients depend on batch-wide statistics (per-side centroid
sums, token counts, margin moments) and on the sign and size of every response's sequence advantage A.
In the legacy trainer the rewards are known before the old-log-prob step (``fit`` extracts
``rm_scores`` first), so the driver hook computes A [bs] with the baseline the estimator will use
(`tokencredit.integrations.verl.estimators.worker_advantages`: the recipe's advantage estimator on
``rm_scores``, ``uid`` groups) and sends it with the rows (``tc_seq_adv``; each rank gets the A of its
own rows), with DelTA's lam_min / lam_max / refine_iters (``tc_delta_params``). Each rank then runs
verl's micro-batches as usual; the forward-step hook keeps each micro-batch's hidden rows in the
step's model output, which verl concatenates and restores to the rank's row order; the wrapped
``infer_batch`` pads them with the old log-probs to [bs_rank, T_rank, H], calls `discriminate` with
``Shard.split(bs_rank, group=the engine's data-parallel group)`` (every rank calls the collectives,
also one without valid tokens; verl's same_micro_num_in_dp keeps the ranks in step), drops the hidden
rows and returns only c~ [r_i]. What each rank holds, between its first forward and that return: its
own responses' hidden states (sum_i r_i x H in the compute dtype, on the device; bs_rank x T_rank x H
once padded, while the statistics run), never another rank's. The estimator checks that its own A
equals the A the workers used (an in-reward KL penalty, ``algorithm.use_kl_in_reward=True``, changes
the rewards after the old-log-prob step: that is refused with a ConfigError).

A request is made only when the selected ``tc_`` estimator needs it. Each result is a jagged tensor
with one row per response token ([r_i], r_i = response length of sequence i); the driver pads it to
[bs, T] with zeros outside ``response_mask`` and stores it under its batch key (`OUTPUT_KEYS`:
``tc_delta_coef``, ``tc_adapter_residual``, ``tc_base_log_probs``, ``tc_neg_log_probs``), where the
estimators read it; the plugin drops those keys (and ``tc_seq_adv``) again after the advantage step,
so they never travel to the actor update.

The switch is the environment variable `SWITCH` (``TOKENCREDIT_VERL_ACTOR_SIGNALS=1``), read by
`enabled`; it must be set in the driver and in the Ray workers. `tokencredit.integrations.verl`
(which checks the verl version) imports this module and installs both halves: `wrap_forward_step`
on ``FSDPEngineWithLMHead.forward_step`` and `wrap_infer_batch` on its ``infer_batch`` (worker), and
`requesting` around the legacy trainer's ``_compute_old_log_prob`` (driver). `check_target` refuses a
verl whose wrapped methods have another signature. Supported: the FSDP / FSDP2 engines, padded or
remove-padding inputs, text-only models, the legacy trainer (``trainer.use_v1=False``); refused with
a clear error: Ulysses sequence parallelism, fused-kernel LM heads (no LM-head call to hook),
multi-modal inputs, a credit method that reads hidden states without a reduction.

Modules: `keys` (the switch, the requests and batch keys, the signature check), `reductions` (the
hidden-state credit split between workers and driver), `worker` (the hooks run in verl's actor
workers), `driver` (the request and the padding of the results in verl's driver).
"""

from tokencredit.integrations.verl.actor.driver import collect, negative_prompts, requesting
from tokencredit.integrations.verl.actor.keys import (
    ADDED_KEYS,
    BATCH_KEYS,
    OUTPUT_KEYS,
    SEQ_ADV,
    SWITCH,
    check_target,
    enabled,
    requested,
)
from tokencredit.integrations.verl.actor.reductions import REDUCTIONS, Reduction, reduction_for
from tokencredit.integrations.verl.actor.worker import float32_entropy, wrap_forward_step, wrap_infer_batch

__all__ = [
    "ADDED_KEYS",
    "BATCH_KEYS",
    "OUTPUT_KEYS",
    "REDUCTIONS",
    "SEQ_ADV",
    "SWITCH",
    "Reduction",
    "check_target",
    "collect",
    "enabled",
    "float32_entropy",
    "negative_prompts",
    "reduction_for",
    "requested",
    "requesting",
    "wrap_forward_step",
    "wrap_infer_batch",
]

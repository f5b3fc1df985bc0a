"""verl's DataProto -> tokencredit's RolloutBatch: where each field and per-token signal is read from (the
batch itself is assembled by `tokencredit.builder.build_batch`, as in every engine)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import Tensor
from verl import DataProto

from tokencredit.batch import RolloutBatch
from tokencredit.builder import Needs, ScoredRollouts, build_batch
from tokencredit.errors import ConfigError
from tokencredit.integrations.verl import actor

__all__ = ["FIELD_KEYS", "SIGNAL_KEYS", "batch_from_dataproto", "first_key", "group_ids_from_labels"]

# Where each per-token signal is read from in a DataProto's batch, first match wins. verl's own
# keys: old_log_probs, ref_log_prob, entropy (v1 TransferQueue field), entropys (legacy
# old-log-prob output, kept as tc_entropy by our hook); the other tc_* keys name the actor extension's
# signals (tokencredit.integrations.verl.actor, switched on by TOKENCREDIT_VERL_ACTOR_SIGNALS=1), whose
# workers return base_log_probs / neg_log_probs as they are and, in place of hidden / base_hidden, their
# reduction (actor.REDUCTIONS: tc_delta_coef, tc_adapter_residual), read as the core's reduced signals
# delta_coefficients and adapter_residual.
SIGNAL_KEYS: dict[str, tuple[str, ...]] = {
    "old_log_probs": ("old_log_probs",),
    "ref_log_probs": ("ref_log_prob",),
    "entropy": ("tc_entropy", "entropy", "entropys"),
    "sum_sq_probs": ("sum_pi_squared",),  # verl's own, with actor.calculate_sum_pi_squared=True
    **{name: (key,) for name, key in actor.BATCH_KEYS.items()},
    **{r.signal: (r.key,) for r in actor.REDUCTIONS.values()},  # adapter_residual, delta_coefficients
}
# RolloutBatch fields beyond the signals (tokencredit.advantages.FIELDS) and verl's batch key for each.
FIELD_KEYS: dict[str, str] = {"baseline_scores": "reward_baselines"}


def group_ids_from_labels(labels: Any) -> Tensor:
    """int64 [N] group ids from a sequence of labels (verl's uid strings): equal labels, equal ids."""
    _, inverse = np.unique(np.asarray(labels).astype(str), return_inverse=True)
    return torch.from_numpy(inverse.reshape(-1).astype(np.int64))


def first_key(data: DataProto, keys: Iterable[str]) -> str | None:
    present = set(data.batch.keys())
    return next((k for k in keys if k in present), None)


def batch_from_dataproto(
    data: DataProto,
    needs: Needs | None = None,
    *,
    token_level_rewards: Tensor | None = None,
    response_mask: Tensor | None = None,
    who: str = "tokencredit",
) -> RolloutBatch:
    """A RolloutBatch [bs, T] from a verl DataProto, assembled by the one builder (`builder.build_batch`).

    token ids = ``responses``; mask = ``response_mask``; score = sum of ``token_level_rewards`` over
    the response (verl puts the outcome reward at the last valid token; an in-reward KL penalty is
    summed in, as verl's GRPO does); group ids = ``non_tensor_batch["uid"]``; the signals
    `needs.forward` from the keys in SIGNAL_KEYS (verl's actor, or tokencredit's actor extension,
    computed them) and the batch `needs.fields` (remax's baseline_scores) from FIELD_KEYS. Raises
    ConfigError naming a missing field.
    """
    needs = needs or Needs()
    batch = data.batch
    rewards = batch["token_level_rewards"] if token_level_rewards is None else token_level_rewards
    mask = batch["response_mask"] if response_mask is None else response_mask
    if "responses" not in batch.keys():
        raise ConfigError(
            f"{who}: the DataProto has no 'responses' (response token ids); keys: {sorted(batch.keys())}"
        )
    if "uid" not in data.non_tensor_batch:
        raise ConfigError(
            f"{who}: the DataProto has no non_tensor_batch['uid'] (the prompt group of each response)"
        )
    token_ids = batch["responses"]
    if token_ids.shape != mask.shape:
        raise ConfigError(
            f"{who}: 'responses' has shape {tuple(token_ids.shape)} but 'response_mask' {tuple(mask.shape)}"
        )
    signals: dict[str, Tensor] = {}
    for name in sorted(needs.forward):
        key = first_key(data, SIGNAL_KEYS[name])
        if key is None:
            raise ConfigError(_missing_signal_message(who, name))
        signals[name] = batch[key].float()
    fields: dict[str, Tensor] = {}
    for name in sorted(needs.fields):
        key = FIELD_KEYS[name]
        if key not in batch.keys():
            raise ConfigError(
                f"{who} needs {name} (verl batch key {key!r}), which this DataProto lacks: verl generates the greedy "
                "baseline rollout only for its own algorithm.adv_estimator=remax, so use verl's remax (uniform credit)"
            )
        fields[name] = batch[key].float().reshape(-1)
    rollouts = ScoredRollouts(
        response_ids=token_ids,
        response_mask=mask.bool(),
        group_ids=group_ids_from_labels(data.non_tensor_batch["uid"]).to(token_ids.device),
        scores=rewards.float().sum(-1),
        **fields,
    )
    return build_batch(rollouts, needs, given=signals, who=who)


def _missing_signal_message(who: str, name: str) -> str:
    keys = " / ".join(SIGNAL_KEYS[name])
    reduced = [r.key for r in actor.REDUCTIONS.values() if name in r.replaces]
    if reduced:  # the workers never send hidden states, only their reduction for DelTA / ARCA
        keys += f", or the actor workers' reduction of it, {' / '.join(reduced)}"
    if name == "sum_sq_probs":
        how = "set actor_rollout_ref.actor.calculate_sum_pi_squared=True (verl then computes it with the old log-probs)"
    elif name == "entropy":
        how = (
            "verl computes it with the old log-probs; it is in the batch when tokencredit.integrations.verl is "
            "loaded in the trainer process (verl's plugin entry point, or VERL_USE_EXTERNAL_MODULES; its hooks keep it)"
        )
    elif actor.enabled():
        how = (
            f"{actor.SWITCH} is set in this process, but the signal did not arrive: the extension hooks the "
            "legacy trainer's old-log-prob step (trainer.use_v1=False) and needs the variable in the Ray workers "
            "too (docs/integrations.md, 'Methods that need the actor extension')"
        )
    else:
        how = (
            f"verl's actor does not compute it. Switch on tokencredit's actor extension with {actor.SWITCH}=1 "
            "in the driver and the Ray workers, and trainer.use_v1=False (docs/integrations.md, 'Methods that need "
            "the actor extension')"
        )
    return f"{who} needs the per-token signal {name!r} (batch key {keys}), which this DataProto lacks: {how}"

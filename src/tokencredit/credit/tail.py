"""The tail mask: exact credit on a task's reward-irrelevant tail, at no extra cost.

On a task with a tail (`tokencredit.data.synthetic`, ``ArithmeticTask(tail=m)``: m letters after the
answer line that no reward can read), the exact advantage of every tail token is known without sampling:
A*_t = Q(s_t, y_t) - V(s_t) = 0, since the reward is the same whatever the tail holds. The tail-mask arm
(a recipe with ``zero_tail = true``, ``--set algo.zero_tail=true``) trains its recipe's credit with that
exact value put in on the tail:

    Â'_i,t = 0 where tail_i,t,   Â'_i,t = Â_i,t elsewhere,

and leaves the loss tokens alone, so the tail still counts in the loss's denominator (token-mean:
Σ_i,t∈L ℓ_i,t / |L| with the same |L|): under a per-token objective the update differs from the recipe's
only in that the tail tokens' gradient is exactly zero, not in its scale elsewhere. GRPO with the tail
mask is GRPO with exact credit where exact credit is free.

`tokencredit.data.token_labels.tail_token_mask` is what an engine builds once per batch (the trainer: `tokencredit.tasks.tail_task` and
`Trainer.old_policy_batch`): bool [N,T], True on the response tokens whose every character the task labels
"tail"; it travels as `RolloutBatch.tail_mask`. `tail_metrics` is what the trainer logs of it each step.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["tail_metrics", "zero_tail"]


def zero_tail(token_advantages: Tensor, tail_mask: Tensor) -> Tensor:
    """Â [N,T] with 0 on the tail (tail_mask bool [N,T]) and unchanged elsewhere (a new tensor)."""
    if tuple(tail_mask.shape) != tuple(token_advantages.shape):
        raise ValueError(
            f"zero_tail: tail_mask has shape {tuple(tail_mask.shape)}, the credit {tuple(token_advantages.shape)}"
        )
    zero = torch.zeros((), dtype=token_advantages.dtype, device=token_advantages.device)
    return torch.where(tail_mask.to(token_advantages.device).bool(), zero, token_advantages)


def tail_metrics(tail_mask: Tensor, entropy: Tensor | None, mask: Tensor) -> dict[str, float]:
    """The step's tail figures: ``tail/tokens``, mean tail tokens per rollout; ``tail/entropy``, mean
    per-token entropy of the old policy on the tail tokens (nats; entropy [N,T], omitted when None or when
    no token is on the tail). tail_mask, mask [N,T] bool."""
    on = tail_mask.bool() & mask.bool()
    out = {"tail/tokens": float(on.sum()) / max(1, int(on.shape[0]))}
    if entropy is not None and bool(on.any()):
        out["tail/entropy"] = float(entropy.double()[on].mean())
    return out

"""TRL 1.16's policy losses that neither the core nor verl's registry has: VESPO.

TRL's ``GRPOConfig.loss_type`` values map onto tokencredit as follows (``tests/objectives/
test_vs_verl.py`` runs TRL's own ``_compute_loss`` for each and checks values and gradients):

| loss_type | tokencredit                                                                                |
|-----------|--------------------------------------------------------------------------------------------|
| grpo      | ppo-clip, seq-mean-token-mean; TRL averages over all B rows (pass global_seqs=B)            |
| bnpo      | ppo-clip, token-mean over the micro-batch (global_tokens unset)                             |
| dr_grpo   | ppo-clip, seq-mean-token-sum-norm, norm_constant = max_completion_length, global_seqs=B     |
| dapo      | ppo-clip, token-mean with global_tokens = the accumulated batch's token count               |
| luspo     | ppo-clip with the "gspo" kernel (importance_sampling_level="sequence"), seq-mean-token-sum, global_seqs=B |
| cispo     | cispo with eps_low = 1 (no lower bound) and eps_high = TRL's epsilon_high - 1 (TRL clips w at epsilon_high), token-mean |
| sapo      | sapo (tau_pos = sapo_temperature_pos, tau_neg = sapo_temperature_neg), seq-mean-token-mean, global_seqs=B |
| vespo     | vespo below, token-mean                                                                     |

"TRL averages over all B rows": TRL's per-sequence losses take the mean over every row, an empty
(fully masked) completion counting as 0; tokencredit's aggregation leaves empty responses out of
the count unless `global_seqs` says otherwise.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tokencredit.objectives.losses import LossInputs, _masked, register_loss

__all__ = ["vespo"]

_LOG_MIN = math.log(1e-8)


@register_loss("vespo", paper="VESPO (arXiv 2602.10693), as TRL 1.16 implements it")
def vespo(
    inputs: LossInputs,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """loss_t = -phi(w) Â_t log pi(y_t) with the detached Gamma weight of the response's importance weight
    w = exp(clamp(sum_t log w_t, log 1e-8, 20)): phi(w) = exp(lambda + k log w - lambda w) (phi(1) = 1),
    (k, lambda) = (k_pos, lambda_pos) where Â_t >= 0, else (k_neg, lambda_neg) (lambda at least 1e-4)."""
    assert inputs.log_w is not None
    m, a = inputs.mask, inputs.advantages
    with torch.no_grad():
        log_w = (inputs.log_w * m.to(inputs.log_w.dtype)).sum(-1, keepdim=True).clamp(_LOG_MIN, 20.0)
        pos = a >= 0
        k = torch.where(pos, torch.full_like(a, k_pos), torch.full_like(a, k_neg))
        lam = torch.where(pos, torch.full_like(a, lambda_pos), torch.full_like(a, lambda_neg)).clamp(min=1e-4)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    return _masked(-phi * a * inputs.log_prob, m), {}

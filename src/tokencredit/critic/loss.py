"""PPO's clipped value loss and the critic's explained variance (docs/spec/ppo.md), as verl 0.9.1 computes them.

  V_clip = clip(V, V_old - c, V_old + c)
  L      = 0.5 agg(max((V - R)^2, (V_clip - R)^2))          verl's compute_value_loss
  clipfrac = share of valid tokens where (V_clip - R)^2 > (V - R)^2
  EV     = 1 - Var(R - V) / (Var(R) + 1e-5)                 over valid tokens, unbiased (verl's vf_explained_var)

`agg` is `tokencredit.objectives.aggregate` (verl's loss_agg_mode names, and its global token / response
counts for gradient accumulation over micro-batches).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tokencredit.errors import ConfigError
from tokencredit.objectives import aggregate

__all__ = ["explained_variance", "value_loss"]


def value_loss(
    vpreds: Tensor,
    returns: Tensor,
    old_values: Tensor,
    mask: Tensor,
    cliprange_value: float = 0.5,
    loss_agg_mode: str = "token-mean",
    *,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    norm_constant: float | None = None,
) -> tuple[Tensor, Tensor]:
    """(loss, clipfrac): 0.5 agg(max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)) over `mask`, and the
    share of valid tokens where the clipped term is the larger (0-dim tensors; the loss differentiable in V).

    vpreds V [N,T] (with grad), returns R and old_values V_old [N,T] (detached), mask [N,T] bool.
    """
    if not cliprange_value > 0:
        raise ConfigError(f"critic.cliprange_value must be > 0, got {cliprange_value}")
    m = mask.bool()
    ret, old = returns.to(vpreds.dtype), old_values.to(vpreds.dtype)
    clipped = torch.maximum(torch.minimum(vpreds, old + cliprange_value), old - cliprange_value)
    unclipped_sq = (vpreds - ret) ** 2
    clipped_sq = (clipped - ret) ** 2
    loss = 0.5 * aggregate(
        torch.maximum(unclipped_sq, clipped_sq),
        m,
        loss_agg_mode,
        norm_constant=norm_constant,
        global_tokens=global_tokens,
        global_seqs=global_seqs,
    )
    hit = (clipped_sq > unclipped_sq) & m
    clipfrac = hit.sum().to(vpreds.dtype) / m.sum().clamp(min=1).to(vpreds.dtype)
    return loss, clipfrac.detach()


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 - Var(R - V) / (Var(R) + 1e-5) over the valid tokens (unbiased variances, float64); nan with
    fewer than two valid tokens. 1: V predicts R exactly; 0: no better than R's mean; < 0: worse."""
    m = mask.bool()
    if int(m.sum()) < 2:
        return float("nan")
    r, v = returns.double()[m], values.double()[m]
    return float(1.0 - torch.var(r - v) / (torch.var(r) + 1e-5))

"""Policy losses: per-token loss terms from log-probs, importance weights and token advantages Â.

The registry lives here with PPO-clip and REINFORCE (GPG's loss is REINFORCE's); the losses of
verl 0.9.1's registry are in `losses_verl.py` (CISPO, SAPO, Clip-Cov, KL-Cov, GMPO, DPPO-TV/KL)
and TRL's own in `losses_trl.py` (VESPO). Every loss takes Â [N,T] from any credit method and its
per-token terms are aggregated by the recipe's loss_agg_mode (`policy.aggregate`); a loss whose
verl or TRL original fixes its own aggregation says how to reproduce it.

A loss is a registered function of `LossInputs` and its hyperparameters (keyword defaults)
returning the per-token loss [N,T] (0 where masked) and boolean indicators for the metrics
(e.g. which tokens were clipped). Two flags say what the rest of the objective must supply:

- `uses_ratio`: the loss reads importance weights w = exp(kernel(log pi - log pi_old)), so it
  needs the old policy's log-probs and a ratio kernel; otherwise (REINFORCE) neither is used;
- `per_token`: at the on-policy point the gradient of token t's log-probability is weighted by
  Â_t alone (true for PPO-clip and REINFORCE); with a per-token kernel the effective credit of
  such a loss is Â itself (see `effective.py`).

Aggregation over tokens and responses and the KL term are the same for every loss (`policy.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

import torch
from torch import Tensor

from tokencredit.errors import ConfigError
from tokencredit.registry import Registry, keyword_defaults

__all__ = ["LOSSES", "Loss", "LossInputs", "clipped_token_loss", "get_loss", "register_loss"]

LOG_RATIO_CLAMP = 20.0


@dataclass(frozen=True)
class LossInputs:
    """What a loss may read, all [N,T]. log_ratio / log_w are None for a loss without a ratio."""

    log_prob: Tensor  # log pi_theta(y_t), with grad
    advantages: Tensor  # Â, detached, in log_prob's dtype
    mask: Tensor  # bool: tokens that carry a loss term
    log_ratio: Tensor | None = None  # clamp(log pi - log pi_old, -20, 20), 0 where masked
    log_w: Tensor | None = None  # the ratio kernel's log importance weights
    old_log_prob: Tensor | None = None  # log pi_old(y_t), detached (DPPO's probability differences)


LossFn = Callable[..., tuple[Tensor, dict[str, Tensor]]]
# `register_loss` hands back the function it was given, with its own signature (not widened to LossFn).
F = TypeVar("F", bound=LossFn)


@dataclass(frozen=True)
class Loss:
    name: str
    fn: LossFn  # fn(inputs: LossInputs, **params) -> (per-token loss [N,T], {indicator: bool [N,T]})
    uses_ratio: bool
    per_token: bool
    defaults: Mapping[str, object]
    paper: str = ""


LOSSES: Registry[Loss] = Registry("policy loss")


def register_loss(
    name: str, *, uses_ratio: bool = True, per_token: bool = True, paper: str = ""
) -> Callable[[F], F]:
    """Register `fn(inputs, **params) -> (loss [N,T], indicators)`; its keyword defaults are its hyperparameters."""

    def deco(fn: F) -> F:
        LOSSES.add(Loss(name, fn, uses_ratio, per_token, keyword_defaults(fn, skip=1), paper))
        return fn

    return deco


def get_loss(name: str) -> Loss:
    return LOSSES.get(name)


def _masked(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _clip(
    log_w: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float, dual_clip: float | None
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-clip on weights w = exp(log_w): the per-token loss [N,T] and the clip indicators."""
    if dual_clip is not None and dual_clip <= 1.0:
        raise ConfigError(f"dual_clip must be > 1 (verl default 3, DAPO 10), got {dual_clip}")
    ratio = torch.exp(log_w)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    ind = {
        "clip_high": (advantages > 0) & (ratio > 1.0 + eps_high),
        "clip_low": (advantages < 0) & (ratio < 1.0 - eps_low),
    }
    if dual_clip is not None:
        cap = -advantages * dual_clip
        ind["clip_dual"] = (advantages < 0) & (loss > cap)
        loss = torch.where(advantages < 0, torch.minimum(loss, cap), loss)
    return _masked(loss, mask), ind


@register_loss(
    "ppo-clip", paper="Schulman et al. 2017, PPO; asymmetric clip: DAPO; dual clip: Ye et al. 2020"
)
def ppo_clip(
    inputs: LossInputs, eps_low: float = 0.2, eps_high: float = 0.2, dual_clip: float | None = None
) -> tuple[Tensor, dict[str, Tensor]]:
    """loss_t = max(-Â w_t, -Â clip(w_t, 1 - eps_low, 1 + eps_high)); for Â < 0 with dual clip c: min(loss_t, -Â c)."""
    assert inputs.log_w is not None  # uses_ratio: policy_loss always supplies it
    return _clip(inputs.log_w, inputs.advantages, inputs.mask, eps_low, eps_high, dual_clip)


@register_loss("reinforce", uses_ratio=False, paper="Williams 1992; ARCA's experiments (arXiv 2606.00257)")
def reinforce(inputs: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """On-policy REINFORCE: loss_t = -Â_t log pi(y_t); no ratio, no clip."""
    return _masked(-inputs.advantages * inputs.log_prob, inputs.mask), {}


# GPG's loss (verl loss_mode "gpg") is REINFORCE's -Â log pi, under GPG's name so a recipe reads as the paper.
LOSSES.add(replace(get_loss("reinforce"), name="gpg", paper="Chu et al. 2025, GPG (arXiv 2504.02546)"))


def clipped_token_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
) -> Tensor:
    """Per-token PPO-clip loss [N,T] (0 where masked).

    r = exp(clamp(logp - logp_old, -20, 20)); loss_t = max(-Â r, -Â clip(r, 1 - eps_low, 1 + eps_high)),
    and for Â < 0 with dual clip c: min(loss_t, -Â c). advantages: [N,T] or [N] (broadcast).
    """
    mask = mask.bool()
    adv = advantages[:, None].expand_as(log_prob) if advantages.dim() == 1 else advantages
    log_ratio = (log_prob - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    loss, _ = _clip(log_ratio, adv.to(log_prob.dtype), mask, eps_low, eps_high, dual_clip)
    return loss

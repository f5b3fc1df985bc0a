"""Generalized advantage estimation with a learned critic (docs/spec/ppo.md): PPO's `gae` estimator.

The rollout's outcome reward r_i sits on its last valid token (verl's token-level reward); the
critic's values V [N,T] (`RolloutBatch.values`, V_t = the value of the state before token t) are
filled by the engine (`fields=("values",)` is what tells a trainer to build and run a critic).

  delta_t = r_t + gamma V_{t'} - V_t            t' the next valid token after t (V = 0 past the last)
  A_t     = delta_t + gamma lam A_{t'}          (A = 0 past the last valid token)
  R_t     = A_t + V_t                           the critic's target (target="gae")
  G_t     = gamma^(valid tokens after t) r_i    the critic's target (target="monte-carlo")

As verl's ``compute_gae_advantage_return``, masked positions inside a row neither discount nor earn
(they are skipped), and the policy's A is whitened over every valid token of the batch (mean 0,
unbiased variance 1; verl's ``masked_whiten`` with eps 1e-8) unless ``whiten=False`` (BPCO's
unnormalised advantages). ``length_alpha`` > 0 gives each row VAPO's length-adaptive
lam_i = 1 - 1 / (length_alpha L_i) (clamped to [0, 1]) in place of ``lam``.

The recursion runs as a reverse scan over T (T steps of [N]-wide tensor operations, as verl's loop):
a closed form needs (gamma lam)^(-t) factors that overflow for long responses or a [N,T,T] matrix.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tokencredit.advantages.core import register_estimator
from tokencredit.advantages.estimators import _whiten
from tokencredit.batch import RolloutBatch
from tokencredit.errors import ConfigError, closest

__all__ = ["TARGETS", "critic_targets", "gae", "gae_advantages", "monte_carlo_returns", "outcome_rewards"]

# What the critic regresses on: the GAE returns of its own values, or the discounted outcome itself.
TARGETS = ("gae", "monte-carlo")


def outcome_rewards(scores: Tensor, mask: Tensor) -> Tensor:
    """Token-level rewards [N,T] float64: r_i on row i's last valid token, 0 elsewhere (0 for an empty row)."""
    m = mask.bool()
    if m.shape[1] == 0:  # a data-parallel rank without rollouts (or a batch of empty responses)
        return torch.zeros(m.shape, dtype=torch.float64, device=m.device)
    cols = torch.arange(m.shape[1], device=m.device)
    last = torch.where(m, cols, torch.full_like(cols, -1)).amax(-1)  # [N], -1 for an empty row
    hit = (cols[None, :] == last[:, None]) & m
    return torch.where(hit, scores.double()[:, None], torch.zeros((), dtype=torch.float64, device=m.device))


def gae_advantages(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float | Tensor
) -> tuple[Tensor, Tensor]:
    """(A, R) [N,T] float64, unwhitened: A_t = delta_t + gamma lam A_{t'}, R = A + V (module docstring).

    rewards, values [N,T] float; mask [N,T] bool; lam a float or a per-row [N] tensor. Masked positions
    carry the next valid token's A forward (A = 0 after a row's last valid token), as verl."""
    m = mask.bool()
    r, v = rewards.double(), values.double()
    n, t = m.shape
    lam_t = torch.as_tensor(lam, dtype=torch.float64, device=m.device).expand(n)
    next_v = torch.zeros(n, dtype=torch.float64, device=m.device)
    last_a = torch.zeros_like(next_v)
    adv = torch.zeros(n, t, dtype=torch.float64, device=m.device)
    for j in range(t - 1, -1, -1):  # a reverse scan: A_t depends on A_{t'} (module docstring)
        valid = m[:, j]
        a = r[:, j] + gamma * next_v - v[:, j] + gamma * lam_t * last_a
        next_v = torch.where(valid, v[:, j], next_v)
        last_a = torch.where(valid, a, last_a)
        adv[:, j] = last_a
    return adv, adv + v


def monte_carlo_returns(scores: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """G [N,T] float64: G_t = gamma^(valid tokens after t) r_i on valid tokens, 0 elsewhere."""
    m = mask.bool()
    after = (m.flip(-1).long().cumsum(-1).flip(-1) - m.long()).double()
    g = scores.double()[:, None] * torch.pow(torch.tensor(gamma, dtype=torch.float64, device=m.device), after)
    return torch.where(m, g, torch.zeros((), dtype=torch.float64, device=m.device))


def _check(
    gamma: float, lam: float, length_alpha: float, target: str, value_min: float, value_max: float
) -> None:
    if not 0.0 <= gamma <= 1.0:
        raise ConfigError(f"advantage estimator 'gae': gamma must be in [0, 1], got {gamma}")
    if not 0.0 <= lam <= 1.0:
        raise ConfigError(f"advantage estimator 'gae': lam must be in [0, 1], got {lam}")
    if not (math.isfinite(length_alpha) and length_alpha >= 0):
        raise ConfigError(
            f"advantage estimator 'gae': length_alpha must be >= 0 (0 = a fixed lam), got {length_alpha}"
        )
    if target not in TARGETS:
        raise ConfigError(
            f"advantage estimator 'gae': target must be one of {', '.join(TARGETS)}, got {target!r}"
            f"{closest(str(target), TARGETS)}"
        )
    if not value_min < value_max or math.isnan(value_min) or math.isnan(value_max):
        raise ConfigError(
            f"advantage estimator 'gae': value_min must be below value_max, got [{value_min}, {value_max}]"
        )


def _row_lam(batch: RolloutBatch, lam: float, length_alpha: float) -> float | Tensor:
    """lam, or VAPO's lam_i = 1 - 1 / (length_alpha L_i) per row, in [0, 1]."""
    if length_alpha <= 0:
        return lam
    lengths = batch.lengths.double().clamp(min=1)
    return (1.0 - 1.0 / (length_alpha * lengths)).clamp(0.0, 1.0)


def _values(batch: RolloutBatch, value_min: float, value_max: float) -> Tensor:
    assert batch.values is not None  # estimate() checks the declared field
    # a bounded critic's values already lie in range; values from elsewhere are held to the same bounds
    return batch.values.double().clamp(value_min, value_max)


@register_estimator(
    "gae",
    fields=("values",),
    token_level=True,
    sharded=True,
    paper="Schulman et al. 2016, GAE (arXiv 1506.02438); PPO with a learned critic as verl's adv_estimator=gae",
)
def gae(
    batch: RolloutBatch,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
    length_alpha: float = 0.0,
    target: str = "gae",
    value_min: float = -math.inf,
    value_max: float = math.inf,
    eps: float = 1e-8,
) -> Tensor:
    """A [N,T]: GAE of the outcome reward against the critic's values `batch.values`, whitened over the
    batch's valid tokens (all ranks under a shard) when `whiten`. `target`, `value_min` and `value_max`
    are the critic's (its regression target and output range, read by `critic_targets` and the trainer's
    critic); values are clamped to [value_min, value_max] here too, so A and the critic agree."""
    _check(gamma, lam, length_alpha, target, value_min, value_max)
    m = batch.mask
    v = _values(batch, value_min, value_max)
    adv, _ = gae_advantages(outcome_rewards(batch.scores, m), v, m, gamma, _row_lam(batch, lam, length_alpha))
    if not whiten:
        return adv
    return _whiten(adv, m, eps, batch.shard)


def critic_targets(
    batch: RolloutBatch,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
    length_alpha: float = 0.0,
    target: str = "gae",
    value_min: float = -math.inf,
    value_max: float = math.inf,
    eps: float = 1e-8,
) -> Tensor:
    """The critic's regression target R [N,T] float64 (0 off the mask) under the `gae` estimator's parameters:
    target="gae": R = A + V with the unwhitened GAE A of the same gamma, lam (verl's returns);
    target="monte-carlo": R = G_t = gamma^(valid tokens after t) r_i (lam = 1), clamped to the value range."""
    del whiten, eps  # the policy's A only
    _check(gamma, lam, length_alpha, target, value_min, value_max)
    m = batch.mask
    if target == "monte-carlo":
        ret = monte_carlo_returns(batch.scores, m, gamma).clamp(value_min, value_max)
    else:
        v = _values(batch, value_min, value_max)
        _, ret = gae_advantages(
            outcome_rewards(batch.scores, m), v, m, gamma, _row_lam(batch, lam, length_alpha)
        )
    return torch.where(m, ret, torch.zeros((), dtype=torch.float64, device=m.device))

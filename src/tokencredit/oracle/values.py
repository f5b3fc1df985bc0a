"""Monte-Carlo values as data: the result types and the pure estimation from sampled values to A*.

`OracleCredit` / `OracleCost` (what an estimate holds and cost), the `ContinuationSampler` interface,
and pure functions on tensors: which positions the delta rule skips, which states need a value,
V^ and its standard error from K rewards, A* (token level) and step advantages (VinePPO) from values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

__all__ = [
    "DEFAULT_DELTA",
    "DEFAULT_K",
    "VINE_K",
    "VINE_MAX_STEPS",
    "ContinuationSampler",
    "OracleCost",
    "OracleCredit",
    "SampledRewards",
    "advantages_from_values",
    "half_means",
    "mc_value",
    "skip_positions",
    "step_advantages_from_values",
    "step_ids_from_boundaries",
    "value_states",
]

DEFAULT_DELTA = 1e-3
"""Positions whose token had probability >= 1 - DEFAULT_DELTA get A* = 0 (|A*| <= DEFAULT_DELTA)."""
DEFAULT_K = 16
"""Continuations per state for the token-level oracle (se of V^ <= 0.5 / sqrt(K) = 0.125)."""
VINE_K = 9
"""Continuations per step boundary in VinePPO's main configs."""
VINE_MAX_STEPS = 20
"""VinePPO estimates values at most at the first 20 step boundaries (later states take the reward)."""


@dataclass
class OracleCost:
    """What an estimate cost: `states` sampled (distinct prefixes), `continuations` generated
    (states x K), `generated_tokens` (continuation tokens within each state's budget, EOS
    included), wall `seconds`; `positions` valid tokens, of which `skipped` were given A* = 0
    by the delta rule without sampling."""

    states: int = 0
    continuations: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0
    positions: int = 0
    skipped: int = 0

    def as_dict(self) -> dict[str, float]:
        return {
            "states": self.states,
            "continuations": self.continuations,
            "generated_tokens": self.generated_tokens,
            "seconds": self.seconds,
            "positions": self.positions,
            "skipped": self.skipped,
        }

    def summary(self) -> str:
        return (
            f"{self.states} states x K = {self.continuations} continuations, "
            f"{self.generated_tokens} generated tokens, {self.seconds:.1f}s "
            f"({self.skipped}/{self.positions} positions skipped by delta)"
        )


@dataclass
class OracleCredit:
    """Monte-Carlo advantages of N rollouts right-padded to T response tokens.

    advantages [N,T] float32: A*_t (token level) or the advantage of the step holding token t
      (step level); exactly 0 off the mask and at skipped positions.
    stderr [N,T] float32: its standard error (0 off the mask, at skipped positions and where both
      values are exact).
    mask [N,T] bool: valid response tokens.
    skipped [N,T] bool: valid positions given 0 by the delta rule (token, or every token of a
      skipped step).
    bound [N,T] float32: at skipped positions the bound on |A*| ((r_max - r_min)(1 - p)), else 0.
    values [N,T+1] float32: V^(s_t) at column t (t = 0: the prompt) where `known`, the rollout's
      reward at column L_i, 0 elsewhere; value_stderr [N,T+1] its standard error.
    known [N,T+1] bool: columns holding a sampled value or the final reward.
    rewards [N] float32: each rollout's own reward (the value after its last token).
    steps [N,T] int64 (step level only): index of the step holding each token, -1 off the mask.
    cost: `OracleCost`.
    half_advantages [2,N,T] float32 (token level, when asked for): A* from the first and from the last
      K/2 continuations of every state (same states, same skips, the same final rewards); A* is linear
      in the value means, so `advantages` = (half_advantages[0] + half_advantages[1]) / 2 up to rounding.
    """

    advantages: Tensor
    stderr: Tensor
    mask: Tensor
    skipped: Tensor
    bound: Tensor
    values: Tensor
    value_stderr: Tensor
    known: Tensor
    rewards: Tensor
    cost: OracleCost
    steps: Tensor | None = None
    half_advantages: Tensor | None = None

    def significant(self, z: float = 2.0) -> Tensor:
        """bool [N,T]: estimated (not skipped) valid positions with |A*| > z * stderr."""
        return self.mask & ~self.skipped & (self.advantages.abs() > z * self.stderr)


@dataclass
class SampledRewards:
    """A sampler's answer: rewards [M,K] float64 of K continuations of each of M states, and the
    cost of producing them (distinct states actually sampled, tokens generated)."""

    rewards: Tensor
    states: int
    generated_tokens: int


class ContinuationSampler(Protocol):
    """Samples K continuations of states and scores them.

    State m is rollout `rows[m]`'s prompt plus its first `cuts[m]` response tokens (0 <= cut <
    that rollout's length); the policy continues it with the rollout's sampling settings and the
    completed response is scored by the rollout's reward. Deterministic in `seed`.
    """

    def __call__(self, rows: Tensor, cuts: Tensor, k: int, seed: int) -> SampledRewards: ...


def _check_mask(mask: Tensor, who: str) -> Tensor:
    if mask.dim() != 2:
        raise ValueError(f"{who}: mask must be [N, T], got shape {tuple(mask.shape)}")
    m = mask.bool()
    # Right padding: valid tokens are a prefix of every row (column t+1 is state s_{t+1}).
    if bool((m[:, 1:] & ~m[:, :-1]).any()):
        i = int((m[:, 1:] & ~m[:, :-1]).any(1).nonzero()[0])
        raise ValueError(f"{who}: mask row {i} is not right-padded (a valid token after padding)")
    return m


def skip_positions(log_probs: Tensor, mask: Tensor, delta: float) -> Tensor:
    """bool [N,T]: valid positions whose token had probability p = exp(log_probs) >= 1 - delta.

    log_probs [N,T]: log pi(y_t | s_t) at the sampling temperature (any value off the mask).
    delta = 0 skips only tokens of probability exactly 1 (A* = 0 there exactly).
    """
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta}")
    m = _check_mask(mask, "skip_positions")
    if tuple(log_probs.shape) != tuple(m.shape):
        raise ValueError(
            f"skip_positions: log_probs shape {tuple(log_probs.shape)} differs from mask {tuple(m.shape)}"
        )
    lp = log_probs.detach().double()
    bad = m & ~torch.isfinite(lp)
    if bool(bad.any()):
        i, j = (int(v) for v in bad.nonzero()[0])
        raise ValueError(f"skip_positions: non-finite log-prob at rollout {i}, token {j}")
    return m & (lp.exp() >= 1.0 - delta)


def value_states(mask: Tensor, skip: Tensor) -> Tensor:
    """bool [N,T+1]: the states s_t (column t = prompt + first t tokens) whose value must be sampled:
    t and t+1 for every valid unskipped position t, except the final state (column L_i), whose
    value is the rollout's reward."""
    m = _check_mask(mask, "value_states")
    need_pos = m & ~skip.bool()
    n, t = m.shape
    need = torch.zeros(n, t + 1, dtype=torch.bool, device=m.device)
    need[:, :t] |= need_pos
    need[:, 1:] |= need_pos
    final = torch.zeros_like(need)
    final.scatter_(1, m.sum(1, keepdim=True), True)
    return need & ~final


def mc_value(rewards: Tensor) -> tuple[Tensor, Tensor]:
    """(mean [M], standard error [M]) float64 of K sampled rewards per state (rewards [M,K], K >= 2):
    V^ = mean, se = unbiased standard deviation / sqrt(K)."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"mc_value: rewards must be [M, K] with K >= 2, got shape {tuple(rewards.shape)}")
    r = rewards.double()
    return r.mean(1), r.std(1, unbiased=True) / math.sqrt(r.shape[1])


def half_means(rewards: Tensor) -> Tensor:
    """[2, M] float64: the mean of the first and of the last K/2 of K sampled rewards per state
    (rewards [M,K], K even); their average is `mc_value`'s mean."""
    if rewards.dim() != 2 or rewards.shape[1] < 2 or rewards.shape[1] % 2:
        raise ValueError(
            f"half_means: rewards must be [M, K] with K even and >= 2, got shape {tuple(rewards.shape)}"
        )
    r = rewards.double()
    return torch.stack([h.mean(1) for h in r.chunk(2, dim=1)])


def _final_columns(mask: Tensor) -> Tensor:
    return mask.sum(1)


def advantages_from_values(
    values: Tensor, value_stderr: Tensor, mask: Tensor, skip: Tensor
) -> tuple[Tensor, Tensor]:
    """(A* [N,T], se [N,T]) float32 from state values.

    values / value_stderr [N,T+1]: V(s_t) at column t for every state adjacent to an unskipped
    position, the reward (se 0) at column L_i. A*_t = values[t+1] - values[t] and
    se_t = sqrt(se[t]^2 + se[t+1]^2) on valid unskipped positions, exactly 0 elsewhere.
    """
    m = _check_mask(mask, "advantages_from_values")
    n, t = m.shape
    if tuple(values.shape) != (n, t + 1) or tuple(value_stderr.shape) != (n, t + 1):
        raise ValueError(
            f"advantages_from_values: values and value_stderr must be ({n}, {t + 1}), got "
            f"{tuple(values.shape)} and {tuple(value_stderr.shape)}"
        )
    keep = m & ~skip.bool()
    v, s = values.double(), value_stderr.double()
    adv = torch.where(keep, v[:, 1:] - v[:, :-1], 0.0)
    se = torch.where(keep, torch.sqrt(s[:, 1:] ** 2 + s[:, :-1] ** 2), 0.0)
    return adv.float(), se.float()


def step_ids_from_boundaries(mask: Tensor, boundaries: Tensor) -> Tensor:
    """int64 [N,T]: index of the step holding each valid token (-1 off the mask); a step ends after
    every valid token marked in `boundaries` [N,T] (and at the end of the response)."""
    m = _check_mask(mask, "step_ids_from_boundaries")
    if tuple(boundaries.shape) != tuple(m.shape):
        raise ValueError(
            f"step_ids_from_boundaries: boundaries shape {tuple(boundaries.shape)} differs from mask {tuple(m.shape)}"
        )
    b = (boundaries.bool() & m).long()
    ids = b.cumsum(1) - b  # a boundary token still belongs to the step it ends
    return torch.where(m, ids, -1)


def step_advantages_from_values(
    step_values: Tensor, step_value_stderr: Tensor, steps: Tensor, skip_step: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """(Â [N,T], se [N,T]) float32: step j's advantage V(s_{j+1}) - V(s_j) on every token of step j.

    step_values / step_value_stderr [N,S+1]: V at the start of step j (column j; column 0 = the
    prompt) and the reward at the column after the row's last step. steps [N,T]: step index per
    token (-1 off the mask). skip_step [N,S] bool (optional): steps given 0.
    """
    m = steps >= 0
    s_max = step_values.shape[1] - 1
    if bool((steps >= s_max).any()):
        raise ValueError(
            f"step_advantages_from_values: a step index reaches {int(steps.max())} but values hold {s_max} steps"
        )
    v, s = step_values.double(), step_value_stderr.double()
    step_adv = v[:, 1:] - v[:, :-1]
    step_se = torch.sqrt(s[:, 1:] ** 2 + s[:, :-1] ** 2)
    if skip_step is not None:
        step_adv = torch.where(skip_step, 0.0, step_adv)
        step_se = torch.where(skip_step, 0.0, step_se)
    idx = steps.clamp(min=0)
    adv = torch.where(m, step_adv.gather(1, idx), 0.0)
    se = torch.where(m, step_se.gather(1, idx), 0.0)
    return adv.float(), se.float()

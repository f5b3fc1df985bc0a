"""Ground-truth token credit: Monte-Carlo token advantages A*_t of a policy under a verifier.

For a policy pi, a reward r in [0, 1] and a sampled response y_1..y_L (EOS included), let
s_t = prompt + y_<t (so s_1 = the prompt and s_{L+1} the whole response) and V(s) the policy's
expected reward from s. The true advantage of response token t is

    A*_t = Q(s_t, y_t) - V(s_t) = V(s_{t+1}) - V(s_t),      V(s_{L+1}) = r(y),

the quantity every token-credit method tries to estimate. V(s_t) is estimated by sampling K
continuations of s_t with the rollout's own sampling settings (temperature, top_p, top_k, the
length budget left) and scoring the completed responses with the same reward function:
V^(s) = mean of the K rewards, its standard error the sample standard deviation (Bessel) / sqrt(K).
V(s_t) and V(s_{t+1}) come from independent samples, so

    se(A*_t) = sqrt(se(V^(s_t))^2 + se(V^(s_{t+1}))^2)                (se(V^(s_{L+1})) = 0).

Adjacent positions share one estimate (V^(s_{t+1}) enters A*_t and A*_{t+1}), so neighbouring
errors are negatively correlated; each position's own standard error is exact. A state whose K
rewards are all equal has standard error 0 (no spread observed); with K = 8 that happens often
near V = 0 or 1, so "|A*| > 2 se" should be read with K in mind.

The delta skip (with its bound). Write p = pi(y_t | s_t). Since
V(s_t) = p Q(s_t, y_t) + (1 - p) Qbar, with Qbar = E[Q(s_t, y) | y != y_t],

    |A*_t| = |Q(s_t, y_t) - V(s_t)| = (1 - p) |Q(s_t, y_t) - Qbar| <= (1 - p) (r_max - r_min),

so a position whose token had p >= 1 - delta gets A*_t = 0 (no sampling) with the recorded bound
`bound[i, t]` = (r_max - r_min)(1 - p) <= delta (r_max - r_min). p is exp(old log-prob) at the
sampling temperature (`tokencredit.signals`, logits / temperature). With top_p < 1 or top_k > 0
the sampler renormalises over a subset that contains y_t, which can only raise y_t's
probability, so the bound computed from the plain tempered p stays valid (conservative). Only
states adjacent to an unskipped position are sampled: V(s_t) and V(s_{t+1}) for every position t
with p < 1 - delta. `DEFAULT_DELTA` = 1e-3: on a batch of the toy warm start (128 rollouts) it
skips 90% of the tokens, and the skipped positions can hold at most 1.24% of the batch's |A*| mass
(their summed bound against a lower bound of the mass; benchmarks/bench_oracle.py, BENCHMARKS.md).

Step-level values (VinePPO; Kazemnejad et al., "VinePPO: Refining Credit Assignment in RL
Training of LLMs", ICML 2025, arXiv 2410.01679). VinePPO replaces PPO's value network by the same
Monte-Carlo estimate taken only at reasoning-step boundaries: the response is split into steps
(its MATH / GSM8K configs split on a line-break delimiter, the answer joined to the last step),
V is estimated at the prompt and after every step from K fresh continuations (K = 9 in the
paper's main configs), the last step's target is the reward (terminal value 0 plus the
outcome reward), and step j's advantage V(s_{j+1}) - V(s_j) is given to every token of the
step (EOS gets the last step's). Its code estimates values for at most the first 20 steps
(``max_step_for_value_estimation``); later states take the reward as their value.
`step_advantages` / `vine_credit` implement this with steps ending after every token whose text
contains a line break (so a final answer line is a step of its own, where VinePPO's MATH split
joins it to the last reasoning line); the delta skip is off by default there (VinePPO has none),
and when on it uses the step-level bound 1 - prod_t p_t over the step's tokens (same argument,
the step as one action).

Layers: pure estimation functions on tensors (`skip_positions`, `value_states`, `mc_value`,
`advantages_from_values`, `step_ids_from_boundaries`, `step_advantages_from_values`), drivers that
take any `ContinuationSampler` (`token_advantages`, `step_advantages`; the tests drive them with a
hand-made policy whose A* is known in closed form), the Hugging Face sampler `ModelSampler`
with the one-call entry points `oracle_credit` / `vine_credit`, and the fidelity of a method's
credit against A* (`fidelity`: Spearman correlation pooled and per response, sign agreement and
share of |Â| on the significant tokens; `oracle_targets`: the most negative A* per response, the
target of blame@k).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from tokencredit.errors import ConfigError
from tokencredit.rollout import response_mask_from_ids, special_ids

__all__ = [
    "DEFAULT_DELTA",
    "DEFAULT_K",
    "VINE_K",
    "VINE_MAX_STEPS",
    "ContinuationSampler",
    "ModelSampler",
    "OracleCost",
    "OracleCredit",
    "SampledRewards",
    "advantages_from_values",
    "average_ranks",
    "fidelity",
    "line_break_boundaries",
    "mc_value",
    "oracle_credit",
    "oracle_targets",
    "policy_log_probs",
    "skip_positions",
    "spearman",
    "step_advantages",
    "step_advantages_from_values",
    "step_ids_from_boundaries",
    "token_advantages",
    "value_states",
    "vine_credit",
]

DEFAULT_DELTA = 1e-3
"""Positions whose token had probability >= 1 - DEFAULT_DELTA get A* = 0 (|A*| <= DEFAULT_DELTA)."""
DEFAULT_K = 16
"""Continuations per state for the token-level oracle (se of V^ <= 0.5 / sqrt(K) = 0.125)."""
VINE_K = 9
"""Continuations per step boundary in VinePPO's main configs."""
VINE_MAX_STEPS = 20
"""VinePPO estimates values at most at the first 20 step boundaries (later states take the reward)."""

RewardFn = Callable[[Sequence[str], Sequence[Any]], Sequence[float]]


# ============================================================================ results
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


# ============================================================================ pure estimation
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


# ============================================================================ drivers
def _check_inputs(
    mask: Tensor, rewards: Tensor, k: int, reward_range: tuple[float, float], who: str
) -> Tensor:
    m = _check_mask(mask, who)
    n = m.shape[0]
    if k < 2:
        raise ValueError(f"{who}: k (continuations per state) must be >= 2 for a standard error, got {k}")
    lo, hi = reward_range
    if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
        raise ValueError(f"{who}: reward_range must be finite with max > min, got {reward_range}")
    if tuple(rewards.shape) != (n,):
        raise ValueError(f"{who}: rewards must be [N] = ({n},), got shape {tuple(rewards.shape)}")
    _check_range(rewards.double().reshape(-1, 1), reward_range, torch.arange(n), torch.full((n,), -1), who)
    if bool((m.sum(1) == 0).any()):
        i = int((m.sum(1) == 0).nonzero()[0])
        raise ValueError(f"{who}: rollout {i} has no valid response token")
    return m


def _check_range(r: Tensor, reward_range: tuple[float, float], rows: Tensor, cuts: Tensor, who: str) -> None:
    lo, hi = reward_range
    bad = ~torch.isfinite(r) | (r < lo) | (r > hi)
    if bool(bad.any()):
        m, j = (int(v) for v in bad.nonzero()[0])
        where = f"rollout {int(rows[m])}" + (
            "" if int(cuts[m]) < 0 else f", continuation {j} of the state after {int(cuts[m])} tokens"
        )
        raise ValueError(
            f"{who}: reward {float(r[m, j])} at {where} is outside reward_range {reward_range} "
            "(the delta bound and the [0, 1] scale need bounded rewards; pass reward_range)"
        )


def _sample_values(
    sampler: ContinuationSampler,
    need: Tensor,
    k: int,
    seed: int,
    reward_range: tuple[float, float],
    who: str,
) -> tuple[Tensor, Tensor, int, int]:
    """(values, stderr) float64 shaped like `need` ([N, C]) at the needed columns, plus (states, tokens)."""
    rows, cuts = need.nonzero(as_tuple=True)
    values = torch.zeros(need.shape, dtype=torch.float64)
    se = torch.zeros(need.shape, dtype=torch.float64)
    if rows.numel() == 0:
        return values, se, 0, 0
    out = sampler(rows.cpu(), cuts.cpu(), k, seed)
    r = out.rewards
    if tuple(r.shape) != (rows.numel(), k):
        raise ValueError(
            f"{who}: the sampler returned rewards of shape {tuple(r.shape)}, expected ({rows.numel()}, {k})"
        )
    _check_range(r.double(), reward_range, rows, cuts, who)
    mean, err = mc_value(r)
    values[rows, cuts] = mean
    se[rows, cuts] = err
    return values, se, out.states, out.generated_tokens


def token_advantages(
    sampler: ContinuationSampler,
    mask: Tensor,
    log_probs: Tensor,
    rewards: Tensor,
    *,
    k: int = DEFAULT_K,
    delta: float = DEFAULT_DELTA,
    seed: int = 0,
    reward_range: tuple[float, float] = (0.0, 1.0),
) -> OracleCredit:
    """Token-level Monte-Carlo advantages A*_t = V(s_{t+1}) - V(s_t) of N rollouts (module docstring).

    mask [N,T]: valid response tokens (right-padded); log_probs [N,T]: log pi(y_t | s_t) at the
    sampling temperature (decides the delta skip and its bound); rewards [N]: each rollout's own
    reward (the value after its last token). `sampler` gives K rewards for every needed state.
    """
    t0 = time.perf_counter()
    m = _check_inputs(mask, rewards, k, reward_range, "token_advantages")
    m, log_probs, rewards = m.cpu(), log_probs.cpu(), rewards.cpu()
    n, t = m.shape
    skip = skip_positions(log_probs, m, delta)
    need = value_states(m, skip)
    values, se, n_states, n_tokens = _sample_values(sampler, need, k, seed, reward_range, "token_advantages")
    final = _final_columns(m)
    values[torch.arange(n), final] = rewards.double()
    adv, adv_se = advantages_from_values(values, se, m, skip)
    span = reward_range[1] - reward_range[0]
    bound = torch.where(skip, span * (1.0 - log_probs.double().exp()).clamp(min=0.0), 0.0).float()
    known = need.clone()
    known[torch.arange(n), final] = True
    cost = OracleCost(
        states=n_states,
        continuations=n_states * k,
        generated_tokens=n_tokens,
        seconds=time.perf_counter() - t0,
        positions=int(m.sum()),
        skipped=int(skip.sum()),
    )
    return OracleCredit(
        advantages=adv,
        stderr=adv_se,
        mask=m,
        skipped=skip,
        bound=bound,
        values=torch.where(known, values, 0.0).float(),
        value_stderr=torch.where(known, se, 0.0).float(),
        known=known,
        rewards=rewards.float(),
        cost=cost,
    )


def step_advantages(
    sampler: ContinuationSampler,
    mask: Tensor,
    boundaries: Tensor,
    rewards: Tensor,
    *,
    k: int = VINE_K,
    max_steps: int | None = VINE_MAX_STEPS,
    log_probs: Tensor | None = None,
    delta: float = 0.0,
    seed: int = 0,
    reward_range: tuple[float, float] = (0.0, 1.0),
) -> OracleCredit:
    """Step-level Monte-Carlo advantages (VinePPO): values at the prompt and after every step,
    step j's advantage V(s_{j+1}) - V(s_j) on each of its tokens (module docstring).

    boundaries [N,T] bool: a step ends after each marked valid token (`line_break_boundaries`).
    max_steps: values are sampled at most at the first `max_steps` step ends (VinePPO: 20); later
    states take the reward as their value (their steps get 0). None = no cap.
    delta > 0 (needs log_probs) skips steps whose whole probability prod_t p_t >= 1 - delta,
    bound (r_max - r_min)(1 - prod_t p_t); 0 = VinePPO (no skip).
    `values` / `known` of the result are per token column (the state before token t), like
    `token_advantages`'; `steps` holds each token's step index.
    """
    t0 = time.perf_counter()
    m = _check_inputs(mask, rewards, k, reward_range, "step_advantages")
    m, rewards = m.cpu(), rewards.cpu()
    n, t = m.shape
    if max_steps is not None and max_steps < 0:
        raise ValueError(f"step_advantages: max_steps must be >= 0 or None, got {max_steps}")
    if delta > 0 and log_probs is None:
        raise ValueError(
            "step_advantages: delta > 0 needs log_probs (the step's probability decides the skip)"
        )
    steps = step_ids_from_boundaries(m, boundaries.cpu())
    n_steps = int(steps.max()) + 1
    lengths = m.sum(1)
    # Column of step j's start state: 0 for j = 0, else one past the token that ends step j - 1.
    starts = torch.full((n, n_steps + 1), -1, dtype=torch.long)
    starts[:, 0] = 0
    b = boundaries.cpu().bool() & m
    ends_rows, ends_cols = b.nonzero(as_tuple=True)
    ends_step = steps[ends_rows, ends_cols]
    starts[ends_rows, ends_step + 1] = ends_cols + 1
    rows_steps = steps.max(1).values + 1  # steps per row
    starts[torch.arange(n), rows_steps] = lengths  # the final state (reward)
    is_start = (starts >= 0) & (starts < lengths[:, None])  # step-start states that need a value
    step_idx = torch.arange(n_steps + 1)[None, :]
    if max_steps is not None:
        is_start &= step_idx <= max_steps

    skip_step = torch.zeros(n, n_steps, dtype=torch.bool)
    bound_step = torch.zeros(n, n_steps, dtype=torch.float64)
    if delta > 0:
        assert log_probs is not None
        lp = torch.where(m, log_probs.cpu().double(), 0.0)
        bad = m & ~torch.isfinite(lp)
        if bool(bad.any()):
            i, j = (int(v) for v in bad.nonzero()[0])
            raise ValueError(f"step_advantages: non-finite log-prob at rollout {i}, token {j}")
        step_lp = torch.zeros(n, n_steps, dtype=torch.float64).scatter_add_(1, steps.clamp(min=0), lp)
        p_step = step_lp.exp()
        exists = step_idx[:, :n_steps] < rows_steps[:, None]
        skip_step = exists & (p_step >= 1.0 - delta)
        bound_step = torch.where(
            skip_step, (reward_range[1] - reward_range[0]) * (1 - p_step).clamp(min=0), 0.0
        )
        # A start state is needed only when one of its two adjacent steps is estimated.
        kept = exists & ~skip_step
        adjacent = torch.zeros(n, n_steps + 1, dtype=torch.bool)
        adjacent[:, :n_steps] |= kept
        adjacent[:, 1:] |= kept
        is_start &= adjacent

    need = torch.zeros(n, t + 1, dtype=torch.bool)
    r_idx, j_idx = is_start.nonzero(as_tuple=True)
    need[r_idx, starts[r_idx, j_idx]] = True
    values, se, n_states, n_tokens = _sample_values(sampler, need, k, seed, reward_range, "step_advantages")

    # Step-start values: sampled where needed, the reward at the final state and past the cap.
    step_values = rewards.double()[:, None].expand(n, n_steps + 1).clone()
    step_se = torch.zeros(n, n_steps + 1, dtype=torch.float64)
    step_values[r_idx, j_idx] = values[r_idx, starts[r_idx, j_idx]]
    step_se[r_idx, j_idx] = se[r_idx, starts[r_idx, j_idx]]
    # A skipped step's start value may be left unsampled: its advantage is 0 regardless.
    adv, adv_se = step_advantages_from_values(step_values, step_se, steps, skip_step)
    skipped = m & skip_step.gather(1, steps.clamp(min=0))
    bound = torch.where(skipped, bound_step.gather(1, steps.clamp(min=0)), 0.0).float()
    final = _final_columns(m)
    values[torch.arange(n), final] = rewards.double()
    known = need.clone()
    known[torch.arange(n), final] = True
    cost = OracleCost(
        states=n_states,
        continuations=n_states * k,
        generated_tokens=n_tokens,
        seconds=time.perf_counter() - t0,
        positions=int(m.sum()),
        skipped=int(skipped.sum()),
    )
    return OracleCredit(
        advantages=adv,
        stderr=adv_se,
        mask=m,
        skipped=skipped,
        bound=bound,
        values=torch.where(known, values, 0.0).float(),
        value_stderr=torch.where(known, se, 0.0).float(),
        known=known,
        rewards=rewards.float(),
        cost=cost,
        steps=steps,
    )


# ============================================================================ fidelity of a method's credit
def average_ranks(x: Tensor) -> Tensor:
    """float64 ranks 1..n of a 1-D tensor, tied values sharing their average rank."""
    v = x.detach().double().flatten()
    order = torch.argsort(v, stable=True)
    _, inverse, counts = torch.unique(v[order], return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    avg = ends - (counts.double() - 1) / 2  # mean of the positions start+1 .. end of each run
    ranks = torch.empty_like(v)
    ranks[order] = avg[inverse]
    return ranks


def spearman(x: Tensor, y: Tensor) -> float | None:
    """Spearman rank correlation of two 1-D tensors (Pearson of average ranks); None when there are
    fewer than 2 values or either is constant (undefined)."""
    if x.numel() != y.numel():
        raise ValueError(f"spearman: {x.numel()} vs {y.numel()} values")
    if x.numel() < 2:
        return None
    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = float(torch.sqrt((rx * rx).sum() * (ry * ry).sum()))
    return None if den == 0.0 else float((rx * ry).sum()) / den


def oracle_targets(credit: OracleCredit, z: float = 2.0) -> Tensor:
    """[N] int64: each response's most negative A* position when that A* is significantly negative
    (A* < 0 and |A*| > z se), else -1 (the first such position on ties): blame@k's target."""
    a = torch.where(credit.mask, credit.advantages.double(), math.inf)
    low, pos = a.min(1)
    se = credit.stderr.double().gather(1, pos[:, None]).squeeze(1)
    ok = (low < 0) & (low.abs() > z * se) & ~credit.skipped.gather(1, pos[:, None]).squeeze(1)
    return torch.where(ok, pos, -1)


def fidelity(
    adv_hat: Tensor, credit: OracleCredit, *, z: float = 2.0, rows: Tensor | None = None
) -> dict[str, float | int | None]:
    """How a method's per-token credit Â [N,T] matches A* on the same rollouts (valid tokens of `rows`,
    bool [N], default all). Float statistics in float64.

    spearman: rank correlation of Â and A* pooled over the tokens (average ranks on ties; skipped
      positions enter with their A* = 0). spearman_per_response: mean of each response's own rank
      correlation over the responses where both are non-constant (`responses` of them; None when
      there is none: e.g. uniform credit). sign_agreement: share of the significant tokens
      (|A*| > z se, estimated) where sign(Â) = sign(A*), Â = 0 counting as disagreement.
      significant_share: share of sum |Â| on the significant tokens (None when sum |Â| = 0);
      significant_tokens / tokens: counts.
    """
    m = credit.mask.bool()
    if tuple(adv_hat.shape) != tuple(m.shape):
        raise ValueError(
            f"fidelity: Â shape {tuple(adv_hat.shape)} differs from the oracle's {tuple(m.shape)}"
        )
    if rows is not None:
        m = m & rows.bool().cpu()[:, None]
    ah = adv_hat.detach().double().cpu()
    bad = m & ~torch.isfinite(ah)
    if bool(bad.any()):
        i, j = (int(v) for v in bad.nonzero()[0])
        raise ValueError(f"fidelity: non-finite credit at rollout {i}, token {j}")
    a = credit.advantages.double()
    sig = credit.significant(z) & m
    per = [spearman(ah[i][m[i]], a[i][m[i]]) for i in range(m.shape[0]) if bool(m[i].any())]
    per = [r for r in per if r is not None]
    mass = float(ah.abs()[m].sum())
    n_sig = int(sig.sum())
    return {
        "spearman": spearman(ah[m], a[m]),
        "spearman_per_response": sum(per) / len(per) if per else None,
        "responses": len(per),
        "sign_agreement": float(((ah * a)[sig] > 0).double().mean()) if n_sig else None,
        "significant_share": float(ah.abs()[sig].sum()) / mass if mass > 0 else None,
        "significant_tokens": n_sig,
        "tokens": int(m.sum()),
    }


# ============================================================================ Hugging Face sampler
def line_break_boundaries(
    tokenizer: Any, response_ids: Tensor, mask: Tensor, delimiter: str = "\n"
) -> Tensor:
    """bool [N,T]: valid tokens whose decoded text contains `delimiter` (a step ends after them).

    Each distinct id is decoded on its own once; a delimiter split over several tokens is not seen.
    """
    if not delimiter:
        raise ValueError("line_break_boundaries: the delimiter must be a non-empty string")
    m = mask.bool()
    ids = response_ids.long()
    uniq = torch.unique(ids[m]).tolist()
    pieces = tokenizer.batch_decode([[i] for i in uniq], skip_special_tokens=True) if uniq else []
    hits = [i for i, piece in zip(uniq, pieces) if delimiter in piece]
    if not hits:
        return torch.zeros_like(m)
    return m & torch.isin(ids, torch.tensor(hits, dtype=torch.long, device=ids.device))


def _generation_config(
    eos_ids: list[int], pad_id: int, temperature: float, top_p: float, top_k: int, budget: int
) -> Any:
    """Plain ancestral sampling from softmax(logits / temperature) restricted by top_p / top_k only
    (every other processor of the model's own generation config switched off), as `rollout.generate`."""
    from transformers import GenerationConfig

    return GenerationConfig(
        max_new_tokens=budget,
        do_sample=True,
        temperature=float(temperature),
        top_p=float(top_p),
        top_k=int(top_k),
        min_p=None,
        typical_p=1.0,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        num_beams=1,
        num_return_sequences=1,
        min_new_tokens=0,
        eos_token_id=eos_ids,
        pad_token_id=pad_id,
        use_cache=True,
    )


class ModelSampler:
    """`ContinuationSampler` for a Hugging Face causal LM and one batch of rollouts.

    `rollouts`: any object with prompt_ids [N,P] (left-padded) / prompt_mask, response_ids [N,T]
    (right-padded) / response_mask, e.g. `tokencredit.rollout.Rollouts` or the trainer's step
    rollouts. `golds[i]` is rollout i's reference answer, `reward_fn(texts, golds) -> list[float]`
    the verifier (`tokencredit.rewards.Reward` or any callable). The state (i, c) is rollout i's
    prompt tokens plus its first c response tokens, token for token (never re-tokenised text).

    Sampling: the rollout's settings (temperature > 0, top_p, top_k; the budget left,
    max_new_tokens - c, per state). Identical states (same prompt, prefix and gold) are sampled
    once. States are sorted by prefix length and generated `batch_size` sequences per
    ``model.generate`` call (K copies of each state in one call; 64 suits a CPU, a GPU wants more);
    each call samples under its own
    seed drawn from `seed`, so the result is deterministic for a given seed and batch size.
    A continuation longer than its state's budget (the call runs to the longest budget in it) is
    cut at the budget. The completed response (prefix + continuation, special tokens skipped) is
    scored by `reward_fn`.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        rollouts: Any,
        golds: Sequence[Any],
        reward_fn: RewardFn,
        *,
        temperature: float,
        max_new_tokens: int,
        top_p: float = 1.0,
        top_k: int = 0,
        batch_size: int = 64,
        eos_token_id: int | Sequence[int] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        if not temperature > 0:
            raise ConfigError(
                f"the Monte-Carlo oracle needs a sampling temperature > 0, got {temperature} "
                "(a greedy policy has A* = 0 everywhere)"
            )
        if not 0 < top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {top_p}")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        self.model, self.tokenizer, self.reward_fn = model, tokenizer, reward_fn
        self.temperature, self.top_p, self.top_k = float(temperature), float(top_p), int(top_k)
        self.max_new_tokens, self.batch_size = int(max_new_tokens), int(batch_size)
        self.log = log or (lambda _msg: None)
        p_ids, p_mask = rollouts.prompt_ids.cpu().long(), rollouts.prompt_mask.cpu().bool()
        self.response_ids = rollouts.response_ids.cpu().long()
        self.mask = _check_mask(rollouts.response_mask.cpu(), "ModelSampler")
        n = self.response_ids.shape[0]
        if p_ids.shape[0] != n or len(golds) != n:
            raise ValueError(
                f"ModelSampler: {p_ids.shape[0]} prompts, {n} responses and {len(golds)} golds: one of each per rollout"
            )
        self.lengths = self.mask.sum(1)
        if bool((self.lengths > self.max_new_tokens).any()):
            i = int((self.lengths > self.max_new_tokens).nonzero()[0])
            raise ValueError(
                f"ModelSampler: rollout {i} has {int(self.lengths[i])} response tokens, more than "
                f"max_new_tokens={self.max_new_tokens} (pass the budget the rollouts were sampled with)"
            )
        self.prompts = [p_ids[i][p_mask[i]] for i in range(n)]
        self.golds = list(golds)
        self.eos_ids, self.pad_id = special_ids(model, tokenizer, eos_token_id)

    def _texts(self, rows: Sequence[int], cuts: Sequence[int], conts: Sequence[Tensor]) -> list[str]:
        seqs = [torch.cat([self.response_ids[r, :c], x]).tolist() for r, c, x in zip(rows, cuts, conts)]
        return self.tokenizer.batch_decode(seqs, skip_special_tokens=True)

    def _score(self, texts: list[str], golds: list[Any], who: str) -> Tensor:
        from tokencredit.rewards.custom import check_rewards

        return torch.tensor(check_rewards(self.reward_fn(texts, golds), len(texts), who), dtype=torch.float64)

    def final_rewards(self) -> Tensor:
        """[N] float64: each rollout's own reward (its valid tokens decoded, scored by reward_fn)."""
        n = self.response_ids.shape[0]
        texts = self._texts(range(n), self.lengths.tolist(), [self.response_ids[i, :0] for i in range(n)])
        return self._score(texts, self.golds, "reward_fn (rollouts)")

    @torch.no_grad()
    def __call__(self, rows: Tensor, cuts: Tensor, k: int, seed: int) -> SampledRewards:
        rows_l, cuts_l = rows.tolist(), cuts.tolist()
        for r, c in zip(rows_l, cuts_l):
            if not 0 <= c < int(self.lengths[r]):
                raise ValueError(
                    f"ModelSampler: state after {c} tokens of rollout {r} (length {int(self.lengths[r])})"
                )
        # Identical states share one estimate.
        key_of: dict[tuple[Any, ...], int] = {}
        uniq: list[tuple[int, int]] = []
        index: list[int] = []
        for r, c in zip(rows_l, cuts_l):
            key = (
                tuple(self.prompts[r].tolist()),
                tuple(self.response_ids[r, :c].tolist()),
                repr(self.golds[r]),
            )
            if key not in key_of:
                key_of[key] = len(uniq)
                uniq.append((r, c))
            index.append(key_of[key])
        order = sorted(range(len(uniq)), key=lambda u: (uniq[u][1], len(self.prompts[uniq[u][0]]), u))
        per_call = max(1, self.batch_size // k)
        device = next(self.model.parameters()).device
        gen = torch.Generator().manual_seed(int(seed))
        texts: list[str] = [""] * (len(uniq) * k)
        n_tokens = 0
        was_training = bool(getattr(self.model, "training", False))
        self.model.eval()
        try:
            for start in range(0, len(order), per_call):
                chunk = order[start : start + per_call]
                call_seed = int(torch.randint(0, 2**62, (1,), generator=gen))
                prefixes = [
                    torch.cat([self.prompts[uniq[u][0]], self.response_ids[uniq[u][0], : uniq[u][1]]])
                    for u in chunk
                ]
                width = max(len(p) for p in prefixes)
                ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
                att = torch.zeros((len(chunk), width), dtype=torch.long)
                for j, p in enumerate(prefixes):
                    ids[j, width - len(p) :] = p
                    att[j, width - len(p) :] = 1
                budgets = torch.tensor([self.max_new_tokens - uniq[u][1] for u in chunk]).repeat_interleave(k)
                cfg = _generation_config(
                    self.eos_ids, self.pad_id, self.temperature, self.top_p, self.top_k, int(budgets.max())
                )
                with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                    torch.manual_seed(call_seed)
                    out = self.model.generate(
                        input_ids=ids.repeat_interleave(k, 0).to(device),
                        attention_mask=att.repeat_interleave(k, 0).to(device),
                        generation_config=cfg,
                    )
                new = out[:, width:].cpu().long()
                valid, _ = response_mask_from_ids(new, self.eos_ids)
                valid &= torch.arange(new.shape[1])[None, :] < budgets[:, None]
                n_tokens += int(valid.sum())
                rows_k = [uniq[u][0] for u in chunk for _ in range(k)]
                cuts_k = [uniq[u][1] for u in chunk for _ in range(k)]
                chunk_texts = self._texts(rows_k, cuts_k, [new[j][valid[j]] for j in range(new.shape[0])])
                for j, u in enumerate(chunk):
                    texts[u * k : (u + 1) * k] = chunk_texts[j * k : (j + 1) * k]
                self.log(f"oracle: {min(start + per_call, len(order))}/{len(order)} states sampled")
        finally:
            if was_training:
                self.model.train()
        golds = [self.golds[uniq[u][0]] for u in range(len(uniq)) for _ in range(k)]
        scores = self._score(texts, golds, "reward_fn (continuations)").reshape(len(uniq), k)
        return SampledRewards(
            rewards=scores[torch.tensor(index, dtype=torch.long)], states=len(uniq), generated_tokens=n_tokens
        )


def policy_log_probs(model: Any, rollouts: Any, *, temperature: float, batch_size: int = 64) -> Tensor:
    """log pi(y_t | s_t) [N,T] float32 of the rollouts' response tokens at `temperature` (one no-grad
    pass, `tokencredit.signals`; 0 off the mask): the p of the delta rule."""
    from tokencredit.signals import compute_signals

    seq = torch.cat([rollouts.prompt_ids, rollouts.response_ids], 1).long()
    att = torch.cat([rollouts.prompt_mask.long(), rollouts.response_mask.long()], 1)
    device = next(model.parameters()).device
    sig = compute_signals(
        model,
        seq.to(device),
        att.to(device),
        int(rollouts.prompt_ids.shape[1]),
        rollouts.response_mask.bool().to(device),
        {"old_log_probs"},
        temperature=temperature,
        batch_size=batch_size,
    )
    return sig["old_log_probs"].cpu()


def oracle_credit(
    model: Any,
    tokenizer: Any,
    rollouts: Any,
    golds: Sequence[Any],
    reward_fn: RewardFn,
    *,
    temperature: float,
    max_new_tokens: int,
    top_p: float = 1.0,
    top_k: int = 0,
    k: int = DEFAULT_K,
    delta: float = DEFAULT_DELTA,
    old_log_probs: Tensor | None = None,
    seed: int = 0,
    batch_size: int = 64,
    reward_range: tuple[float, float] = (0.0, 1.0),
    log: Callable[[str], None] | None = None,
) -> OracleCredit:
    """Token-level A* (and standard errors) of a batch of rollouts sampled from `model`.

    `rollouts`, `golds`, `reward_fn` and the sampling settings as `ModelSampler` (pass the settings
    the rollouts were sampled with). `old_log_probs` [N,T]: log pi(y_t | s_t) at `temperature`
    (computed in one no-grad pass when None). Each rollout's own reward is recomputed with
    `reward_fn` so that V after the last token and the continuations' rewards are the same function.
    """
    sampler = ModelSampler(
        model, tokenizer, rollouts, golds, reward_fn, temperature=temperature, max_new_tokens=max_new_tokens,
        top_p=top_p, top_k=top_k, batch_size=batch_size, log=log,
    )  # fmt: skip
    t0 = time.perf_counter()
    lp = (
        policy_log_probs(model, rollouts, temperature=temperature, batch_size=batch_size)
        if old_log_probs is None
        else old_log_probs.cpu()
    )
    out = token_advantages(
        sampler,
        sampler.mask,
        lp,
        sampler.final_rewards(),
        k=k,
        delta=delta,
        seed=seed,
        reward_range=reward_range,
    )
    out.cost.seconds = time.perf_counter() - t0
    return out


def vine_credit(
    model: Any,
    tokenizer: Any,
    rollouts: Any,
    golds: Sequence[Any],
    reward_fn: RewardFn,
    *,
    temperature: float,
    max_new_tokens: int,
    top_p: float = 1.0,
    top_k: int = 0,
    k: int = VINE_K,
    delimiter: str = "\n",
    max_steps: int | None = VINE_MAX_STEPS,
    delta: float = 0.0,
    old_log_probs: Tensor | None = None,
    seed: int = 0,
    batch_size: int = 64,
    reward_range: tuple[float, float] = (0.0, 1.0),
    log: Callable[[str], None] | None = None,
) -> OracleCredit:
    """VinePPO's step-level Monte-Carlo advantages of a batch of rollouts sampled from `model`:
    steps end after every token containing `delimiter` (default a line break), K continuations per
    step boundary, step advantage V(s_{j+1}) - V(s_j) on the step's tokens (`step_advantages`)."""
    sampler = ModelSampler(
        model, tokenizer, rollouts, golds, reward_fn, temperature=temperature, max_new_tokens=max_new_tokens,
        top_p=top_p, top_k=top_k, batch_size=batch_size, log=log,
    )  # fmt: skip
    t0 = time.perf_counter()
    lp = old_log_probs
    if delta > 0 and lp is None:
        lp = policy_log_probs(model, rollouts, temperature=temperature, batch_size=batch_size)
    boundaries = line_break_boundaries(tokenizer, sampler.response_ids, sampler.mask, delimiter)
    out = step_advantages(
        sampler, sampler.mask, boundaries, sampler.final_rewards(), k=k, max_steps=max_steps,
        log_probs=None if lp is None else lp.cpu(), delta=delta, seed=seed, reward_range=reward_range,
    )  # fmt: skip
    out.cost.seconds = time.perf_counter() - t0
    return out


# ============================================================================ as signals of a rollout batch
@dataclass(frozen=True)
class MCSettings:
    """How the Monte-Carlo signals are estimated: K continuations per state and the delta skip of the
    token-level oracle; K, the step delimiter and the value horizon of VinePPO; rows per generate call."""

    k: int = DEFAULT_K
    delta: float = DEFAULT_DELTA
    vine_k: int = VINE_K
    vine_max_steps: int = VINE_MAX_STEPS
    delimiter: str = "\n"
    batch_size: int = 64


def mc_signals(
    model: Any,
    tokenizer: Any,
    rollouts: Any,
    golds: Sequence[Any],
    reward_fn: RewardFn,
    needs: Sequence[str] | set[str],
    *,
    temperature: float,
    max_new_tokens: int,
    top_p: float = 1.0,
    settings: MCSettings = MCSettings(),
    old_log_probs: Tensor | None = None,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> tuple[dict[str, Tensor], OracleCost]:
    """The Monte-Carlo signals in `needs` of a rollout batch (`tokencredit.batch.MC_SIGNALS`):
    mc_advantages [N,T] (token-level A*, `oracle_credit`) and mc_step_advantages [N,T] (VinePPO,
    `vine_credit`), on the CPU, with their summed cost. The rollouts' own sampling settings are
    passed; `reward_fn` must score in [0, 1] (the verifier's correctness, not shaped scores)."""
    common = dict(temperature=temperature, max_new_tokens=max_new_tokens, top_p=top_p, seed=seed,
                  batch_size=settings.batch_size, log=log)  # fmt: skip
    out: dict[str, Tensor] = {}
    total = OracleCost()
    if "mc_advantages" in needs:
        c = oracle_credit(model, tokenizer, rollouts, golds, reward_fn, k=settings.k, delta=settings.delta,
                          old_log_probs=old_log_probs, **common)  # fmt: skip
        out["mc_advantages"] = c.advantages.float()
        total = _add_costs(total, c.cost)
    if "mc_step_advantages" in needs:
        c = vine_credit(model, tokenizer, rollouts, golds, reward_fn, k=settings.vine_k, delimiter=settings.delimiter,
                        max_steps=settings.vine_max_steps, **common)  # fmt: skip
        out["mc_step_advantages"] = c.advantages.float()
        total = _add_costs(total, c.cost)
    return out, total


def _add_costs(a: OracleCost, b: OracleCost) -> OracleCost:
    return OracleCost(**{k: getattr(a, k) + getattr(b, k) for k in a.as_dict()})

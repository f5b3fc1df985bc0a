"""The estimators: which states need a value, K sampled continuations for each (from any
`ContinuationSampler`), then A* (`token_advantages`) or VinePPO's step advantages (`step_advantages`)."""

from __future__ import annotations

import math
import time

import torch
from torch import Tensor

from tokencredit.oracle.values import (
    DEFAULT_DELTA,
    DEFAULT_K,
    VINE_K,
    VINE_MAX_STEPS,
    ContinuationSampler,
    OracleCost,
    OracleCredit,
    _check_mask,
    advantages_from_values,
    half_means,
    mc_value,
    skip_positions,
    step_advantages_from_values,
    step_ids_from_boundaries,
    value_states,
)

__all__ = ["step_advantages", "token_advantages"]


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
    *,
    halves: bool = False,
) -> tuple[Tensor, Tensor, int, int, Tensor | None]:
    """(values, stderr) float64 shaped like `need` ([N, C]) at the needed columns, (states, tokens),
    and with `halves` the [2, N, C] values of the first and of the last K/2 rewards per state (else None)."""
    rows, cuts = need.nonzero(as_tuple=True)
    values = torch.zeros(need.shape, dtype=torch.float64)
    se = torch.zeros(need.shape, dtype=torch.float64)
    half = torch.zeros(2, *need.shape, dtype=torch.float64) if halves else None
    if rows.numel() == 0:
        return values, se, 0, 0, half
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
    if half is not None:
        half[:, rows, cuts] = half_means(r)
    return values, se, out.states, out.generated_tokens, half


def _half_advantages(half: Tensor, rewards: Tensor, m: Tensor, skip: Tensor) -> Tensor:
    """[2,N,T] float32: A* of each half's values [2,N,T+1] (final column: the reward, as for the full A*)."""
    n = m.shape[0]
    half[:, torch.arange(n), m.sum(1)] = rewards.double()
    zero = torch.zeros_like(half[0])
    return torch.stack([advantages_from_values(h, zero, m, skip)[0] for h in half])


def _result(
    adv: Tensor,
    adv_se: Tensor,
    m: Tensor,
    skipped: Tensor,
    bound: Tensor,
    values: Tensor,
    se: Tensor,
    need: Tensor,
    rewards: Tensor,
    *,
    states: int,
    tokens: int,
    k: int,
    t0: float,
    steps: Tensor | None = None,
) -> OracleCredit:
    """The OracleCredit of an estimate: the final column of each row holds its reward (se 0)."""
    n = m.shape[0]
    final = m.sum(1)
    values[torch.arange(n), final] = rewards.double()
    known = need.clone()
    known[torch.arange(n), final] = True
    cost = OracleCost(
        states=states,
        continuations=states * k,
        generated_tokens=tokens,
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
    split_halves: bool = False,
    known_zero: Tensor | None = None,
) -> OracleCredit:
    """Token-level Monte-Carlo advantages A*_t = V(s_{t+1}) - V(s_t) of N rollouts (package docstring).

    mask [N,T]: valid response tokens (right-padded); log_probs [N,T]: log pi(y_t | s_t) at the
    sampling temperature (decides the delta skip and its bound); rewards [N]: each rollout's own
    reward (the value after its last token). `sampler` gives K rewards for every needed state.
    split_halves (K even): also A* from the first and from the last K/2 of those rewards
    (`OracleCredit.half_advantages`, no extra sampling; A* itself is unchanged).
    known_zero bool [N,T]: positions whose A* is known to be exactly 0 without sampling (a toy-tail task's
    reward-irrelevant tail, `tokencredit.credit.tail`): A* = 0 and se 0 there, their states are not sampled
    unless a sampled position needs them, and they are not counted as skipped (no bound: the value is exact).
    """
    t0 = time.perf_counter()
    m = _check_inputs(mask, rewards, k, reward_range, "token_advantages").cpu()
    if known_zero is not None and tuple(known_zero.shape) != tuple(m.shape):
        raise ValueError(
            f"token_advantages: known_zero has shape {tuple(known_zero.shape)}, the mask {tuple(m.shape)}"
        )
    exact = m & known_zero.cpu().bool() if known_zero is not None else torch.zeros_like(m)
    if split_halves and k % 2:
        raise ValueError(
            f"token_advantages: split_halves needs an even k (two halves of K/2 continuations), got {k}"
        )
    log_probs, rewards = log_probs.cpu(), rewards.cpu()
    n = m.shape[0]
    skip = skip_positions(log_probs, m, delta) & ~exact
    unsampled = skip | exact
    need = value_states(m, unsampled)
    values, se, n_states, n_tokens, half = _sample_values(
        sampler, need, k, seed, reward_range, "token_advantages", halves=split_halves
    )
    values[torch.arange(n), m.sum(1)] = rewards.double()
    adv, adv_se = advantages_from_values(values, se, m, unsampled)
    span = reward_range[1] - reward_range[0]
    bound = torch.where(skip, span * (1.0 - log_probs.double().exp()).clamp(min=0.0), 0.0).float()
    out = _result(
        adv, adv_se, m, skip, bound, values, se, need, rewards, states=n_states, tokens=n_tokens, k=k, t0=t0
    )
    if half is not None:
        out.half_advantages = _half_advantages(half, rewards, m, unsampled)
    return out


def _step_starts(
    m: Tensor, boundaries: Tensor, steps: Tensor, max_steps: int | None
) -> tuple[Tensor, Tensor, Tensor]:
    """(starts [N, S+1]: the column of step j's start state (-1: no such step), is_start: step-start
    states that need a value, steps per row [N]). Step 0 starts at the prompt; the final state holds
    the reward; past `max_steps`, states take the reward as their value."""
    n, n_steps = m.shape[0], int(steps.max()) + 1
    lengths = m.sum(1)
    starts = torch.full((n, n_steps + 1), -1, dtype=torch.long)
    starts[:, 0] = 0
    b = boundaries.bool() & m
    ends_rows, ends_cols = b.nonzero(as_tuple=True)
    starts[ends_rows, steps[ends_rows, ends_cols] + 1] = ends_cols + 1  # one past the token ending step j - 1
    rows_steps = steps.max(1).values + 1
    starts[torch.arange(n), rows_steps] = lengths
    is_start = (starts >= 0) & (starts < lengths[:, None])
    if max_steps is not None:
        is_start &= torch.arange(n_steps + 1)[None, :] <= max_steps
    return starts, is_start, rows_steps


def _step_skips(
    m: Tensor, steps: Tensor, rows_steps: Tensor, log_probs: Tensor, delta: float, span: float
) -> tuple[Tensor, Tensor]:
    """(skip_step [N,S], bound_step [N,S]): steps whose whole probability prod_t p_t >= 1 - delta, and the
    bound span (1 - prod_t p_t) on their advantage (the token bound with the step as one action)."""
    lp = torch.where(m, log_probs.cpu().double(), 0.0)
    bad = m & ~torch.isfinite(lp)
    if bool(bad.any()):
        i, j = (int(v) for v in bad.nonzero()[0])
        raise ValueError(f"step_advantages: non-finite log-prob at rollout {i}, token {j}")
    n_steps = int(steps.max()) + 1
    p_step = (
        torch.zeros(m.shape[0], n_steps, dtype=torch.float64).scatter_add_(1, steps.clamp(min=0), lp).exp()
    )
    exists = torch.arange(n_steps)[None, :] < rows_steps[:, None]
    skip_step = exists & (p_step >= 1.0 - delta)
    return skip_step, torch.where(skip_step, span * (1 - p_step).clamp(min=0), 0.0)


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
    step j's advantage V(s_{j+1}) - V(s_j) on each of its tokens (package docstring).

    boundaries [N,T] bool: a step ends after each marked valid token (`line_break_boundaries`).
    max_steps: values are sampled at most at the first `max_steps` step ends (VinePPO: 20); later
    states take the reward as their value (their steps get 0). None = no cap.
    delta > 0 (needs log_probs) skips steps whose whole probability prod_t p_t >= 1 - delta,
    bound (r_max - r_min)(1 - prod_t p_t); 0 = VinePPO (no skip).
    `values` / `known` of the result are per token column (the state before token t), like
    `token_advantages`'; `steps` holds each token's step index.
    """
    t0 = time.perf_counter()
    m = _check_inputs(mask, rewards, k, reward_range, "step_advantages").cpu()
    rewards = rewards.cpu()
    if max_steps is not None and max_steps < 0:
        raise ValueError(f"step_advantages: max_steps must be >= 0 or None, got {max_steps}")
    if delta > 0 and log_probs is None:
        raise ValueError(
            "step_advantages: delta > 0 needs log_probs (the step's probability decides the skip)"
        )
    n, t = m.shape
    steps = step_ids_from_boundaries(m, boundaries.cpu())
    n_steps = int(steps.max()) + 1
    starts, is_start, rows_steps = _step_starts(m, boundaries.cpu(), steps, max_steps)
    skip_step = torch.zeros(n, n_steps, dtype=torch.bool)
    bound_step = torch.zeros(n, n_steps, dtype=torch.float64)
    if delta > 0:
        skip_step, bound_step = _step_skips(
            m, steps, rows_steps, log_probs, delta, reward_range[1] - reward_range[0]
        )
        kept = (torch.arange(n_steps)[None, :] < rows_steps[:, None]) & ~skip_step
        adjacent = torch.zeros(n, n_steps + 1, dtype=torch.bool)
        adjacent[:, :n_steps] |= kept
        adjacent[:, 1:] |= kept
        is_start &= adjacent  # a start state is needed only when one of its two steps is estimated
    need = torch.zeros(n, t + 1, dtype=torch.bool)
    r_idx, j_idx = is_start.nonzero(as_tuple=True)
    need[r_idx, starts[r_idx, j_idx]] = True
    values, se, n_states, n_tokens, _ = _sample_values(
        sampler, need, k, seed, reward_range, "step_advantages"
    )
    # Step-start values: sampled where needed, the reward at the final state and past the cap.
    step_values = rewards.double()[:, None].expand(n, n_steps + 1).clone()
    step_se = torch.zeros(n, n_steps + 1, dtype=torch.float64)
    step_values[r_idx, j_idx] = values[r_idx, starts[r_idx, j_idx]]
    step_se[r_idx, j_idx] = se[r_idx, starts[r_idx, j_idx]]
    adv, adv_se = step_advantages_from_values(step_values, step_se, steps, skip_step)  # skipped steps: 0
    skipped = m & skip_step.gather(1, steps.clamp(min=0))
    bound = torch.where(skipped, bound_step.gather(1, steps.clamp(min=0)), 0.0).float()
    return _result(
        adv,
        adv_se,
        m,
        skipped,
        bound,
        values,
        se,
        need,
        rewards,
        states=n_states,
        tokens=n_tokens,
        k=k,
        t0=t0,
        steps=steps,
    )

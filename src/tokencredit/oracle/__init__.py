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

Modules: `values` (result types and the pure estimation functions on tensors: `skip_positions`,
`value_states`, `mc_value`, `half_means`, `advantages_from_values`, `step_ids_from_boundaries`,
`step_advantages_from_values`), `drivers` (`token_advantages`, `step_advantages` over any
`ContinuationSampler`; the tests drive them with a hand-made policy whose A* is known in closed
form), `sampler` (the Hugging Face `ModelSampler`), this package's one-call entry points
`oracle_credit` / `vine_credit` / `mc_signals` (the trainer's), and `fidelity` of a method's
credit against A* (`fidelity`: Spearman correlation pooled and per response, sign agreement and
share of |Â| on the significant tokens; `oracle_targets`: the most negative A* per response, the
target of blame@k).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from tokencredit.oracle.agreement import average_ranks, fidelity, fidelity_stderr, oracle_targets, spearman
from tokencredit.oracle.drivers import step_advantages, token_advantages
from tokencredit.oracle.sampler import ModelSampler, RewardFn, line_break_boundaries, policy_log_probs
from tokencredit.oracle.values import (
    DEFAULT_DELTA,
    DEFAULT_K,
    VINE_K,
    VINE_MAX_STEPS,
    ContinuationSampler,
    OracleCost,
    OracleCredit,
    SampledRewards,
    advantages_from_values,
    half_means,
    mc_value,
    skip_positions,
    step_advantages_from_values,
    step_ids_from_boundaries,
    value_states,
)
from tokencredit.rollout.settings import SamplingSettings

__all__ = [
    "DEFAULT_DELTA",
    "DEFAULT_K",
    "VINE_K",
    "VINE_MAX_STEPS",
    "ContinuationSampler",
    "MCSettings",
    "ModelSampler",
    "OracleCost",
    "OracleCredit",
    "RewardFn",
    "SampledRewards",
    "advantages_from_values",
    "average_ranks",
    "fidelity",
    "fidelity_stderr",
    "half_means",
    "line_break_boundaries",
    "mc_signals",
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
    split_halves: bool = False,
    log: Callable[[str], None] | None = None,
) -> OracleCredit:
    """Token-level A* (and standard errors) of a batch of rollouts sampled from `model`.

    `rollouts`, `golds`, `reward_fn` and the sampling settings as `ModelSampler` (pass the settings
    the rollouts were sampled with). `old_log_probs` [N,T]: log pi(y_t | s_t) at `temperature`
    (computed in one no-grad pass when None). Each rollout's own reward is recomputed with
    `reward_fn` so that V after the last token and the continuations' rewards are the same function.
    split_halves (k even): also A* of each half of the K continuations (`OracleCredit.half_advantages`).
    """
    sampler = ModelSampler(
        model,
        tokenizer,
        rollouts,
        golds,
        reward_fn,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        top_p=top_p,
        top_k=top_k,
        batch_size=batch_size,
        log=log,
    )
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
        split_halves=split_halves,
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
        model,
        tokenizer,
        rollouts,
        golds,
        reward_fn,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        top_p=top_p,
        top_k=top_k,
        batch_size=batch_size,
        log=log,
    )
    t0 = time.perf_counter()
    lp = old_log_probs
    if delta > 0 and lp is None:
        lp = policy_log_probs(model, rollouts, temperature=temperature, batch_size=batch_size)
    boundaries = line_break_boundaries(tokenizer, sampler.response_ids, sampler.mask, delimiter)
    out = step_advantages(
        sampler,
        sampler.mask,
        boundaries,
        sampler.final_rewards(),
        k=k,
        max_steps=max_steps,
        log_probs=None if lp is None else lp.cpu(),
        delta=delta,
        seed=seed,
        reward_range=reward_range,
    )
    out.cost.seconds = time.perf_counter() - t0
    return out


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
    sampling: SamplingSettings,
    settings: MCSettings = MCSettings(),
    old_log_probs: Tensor | None = None,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> tuple[dict[str, Tensor], OracleCost]:
    """The Monte-Carlo signals in `needs` of a rollout batch (`tokencredit.batch.MC_SIGNALS`):
    mc_advantages [N,T] (token-level A*, `oracle_credit`) and mc_step_advantages [N,T] (VinePPO,
    `vine_credit`), on the CPU, with their summed cost. `sampling`: the rollouts' own sampling settings
    (temperature, top_p, top_k, max_new_tokens; the continuations go `settings.batch_size` rows per
    generate call, not `sampling.batch_size`); `reward_fn` must score in [0, 1] (the verifier's
    correctness, not shaped scores)."""
    common = dict(
        temperature=sampling.temperature,
        max_new_tokens=sampling.max_new_tokens,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        seed=seed,
        batch_size=settings.batch_size,
        log=log,
    )
    out: dict[str, Tensor] = {}
    total = OracleCost()
    if "mc_advantages" in needs:
        c = oracle_credit(
            model,
            tokenizer,
            rollouts,
            golds,
            reward_fn,
            k=settings.k,
            delta=settings.delta,
            old_log_probs=old_log_probs,
            **common,
        )
        out["mc_advantages"] = c.advantages.float()
        total = _add_costs(total, c.cost)
    if "mc_step_advantages" in needs:
        c = vine_credit(
            model,
            tokenizer,
            rollouts,
            golds,
            reward_fn,
            k=settings.vine_k,
            delimiter=settings.delimiter,
            max_steps=settings.vine_max_steps,
            **common,
        )
        out["mc_step_advantages"] = c.advantages.float()
        total = _add_costs(total, c.cost)
    return out, total


def _add_costs(a: OracleCost, b: OracleCost) -> OracleCost:
    return OracleCost(**{k: getattr(a, k) + getattr(b, k) for k in a.as_dict()})

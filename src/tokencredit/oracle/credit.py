"""The oracle in one call on a batch of rollouts: `oracle_credit` (token-level A*, the delta skip),
`vine_credit` (VinePPO's step-level values) and `mc_signals` (the Monte-Carlo signals a recipe needs, with
`MCSettings`: what the trainer calls). Each samples with the Hugging Face `sampler.ModelSampler` and runs
the estimation of `drivers`; the package's docstring has the definitions and the bound of the delta skip.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from tokencredit.oracle.drivers import step_advantages, token_advantages
from tokencredit.oracle.sampler import ModelSampler, RewardFn, line_break_boundaries, policy_log_probs
from tokencredit.oracle.values import (
    DEFAULT_DELTA,
    DEFAULT_K,
    VINE_K,
    VINE_MAX_STEPS,
    OracleCost,
    OracleCredit,
)
from tokencredit.rollout.settings import SamplingSettings

__all__ = ["MCSettings", "mc_signals", "oracle_credit", "vine_credit"]


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
    known_zero: Tensor | None = None,
    log: Callable[[str], None] | None = None,
) -> OracleCredit:
    """Token-level A* (and standard errors) of a batch of rollouts sampled from `model`.

    `rollouts`, `golds`, `reward_fn` and the sampling settings as `ModelSampler` (pass the settings
    the rollouts were sampled with). `old_log_probs` [N,T]: log pi(y_t | s_t) at `temperature`
    (computed in one no-grad pass when None). Each rollout's own reward is recomputed with
    `reward_fn` so that V after the last token and the continuations' rewards are the same function.
    split_halves (k even): also A* of each half of the K continuations (`OracleCredit.half_advantages`).
    known_zero [N,T] bool: positions whose A* is exactly 0 by construction (a toy-tail task's tail), not
    sampled (`drivers.token_advantages`).
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
        known_zero=known_zero,
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
    known_zero: Tensor | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[dict[str, Tensor], OracleCost]:
    """The Monte-Carlo signals in `needs` of a rollout batch (`tokencredit.batch.MC_SIGNALS`):
    mc_advantages [N,T] (token-level A*, `oracle_credit`) and mc_step_advantages [N,T] (VinePPO,
    `vine_credit`), on the CPU, with their summed cost. `sampling`: the rollouts' own sampling settings
    (temperature, top_p, top_k, max_new_tokens; the continuations go `settings.batch_size` rows per
    generate call, not `sampling.batch_size`); `reward_fn` must score in [0, 1] (the verifier's
    correctness, not shaped scores). known_zero [N,T] bool: positions whose A* is exactly 0 by construction
    (a toy-tail task's tail), which the token-level oracle does not sample (VinePPO's step values do not
    read it)."""
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
            known_zero=known_zero,
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

"""Credit fidelity against Monte-Carlo A*: the probe's ground truth on any data with a verifier.

`tokencredit.oracle.oracle_credit` estimates each token's true advantage under the probed policy,
A*_t = V(s_{t+1}) - V(s_t), from K continuations per state (the delta skip gives A* = 0 to tokens
of probability >= 1 - delta), on the probe's own rollouts of mixed groups: those whose group
advantage is not 0, the rows every group-based method credits and the checker metrics score. The
continuations use the rollouts' sampling settings and the same reward: the synthetic task's checker,
or the math verifier on other data. Each method's effective credit Â on those rollouts is scored
against A* (`tokencredit.oracle.agreement`, z = `ORACLE_Z`):

- rho pooled / rho per response: Spearman correlation of Â and A* over all their tokens, and the
  mean of each response's own correlation (over the responses where both vary);
- sign agreement: share of the significant tokens (|A*| > z se, estimated) where Â has A*'s sign
  (Â = 0 disagrees);
- significant share: share of the response's sum |Â| on those tokens (pooled);
- blame@k vs A*: share of the responses whose most negative A* is significantly negative
  (`tokencredit.oracle.oracle_targets`) with that token among its k most negative Â (ties in
  expectation, `metrics.blame_hits`); responses without such a token are left out. The JSON also
  splits it by the response's outcome (reward 0 / > 0): a method whose credit takes the sign of the
  sequence advantage cannot rank a token of a correct response below the others by its sign.

The chance baselines (random: mean over draws; uniform: rho undefined) get the same numbers, and
the oracle's own A* is scored by the checker like a method (its blame@k of the first wrong token).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor

from tokencredit.columns import MethodCredit
from tokencredit.oracle import (
    OracleCost,
    OracleCredit,
    fidelity,
    fidelity_stderr,
    oracle_credit,
    oracle_targets,
)
from tokencredit.probe.config import ProbeConfig
from tokencredit.probe.metrics import blame_hits, mean_of, random_credit, stderr_of, uniform_credit
from tokencredit.probe.sample import problem_and_copy, select_rollouts
from tokencredit.probe.score import method_row, score_credit
from tokencredit.probe.truth import ProbeTruth
from tokencredit.rollout import Rollouts

__all__ = [
    "ORACLE_Z",
    "ProbeOracle",
    "fidelity_baselines",
    "oracle_cost",
    "oracle_section",
    "run_oracle",
    "score_fidelity",
    "split_halves",
]

ORACLE_Z = 2.0
"""A* is significant where |A*| > ORACLE_Z standard errors."""


@dataclass
class ProbeOracle:
    """A* of some rows of a probe batch.

    rows [M] int64: the batch rows estimated (in this order); credit: their `OracleCredit` ([M,T],
    T the batch's response width); targets [M] int64: `oracle_targets(credit, z)` (-1: none);
    groups [M] int64: each row's problem, the unit the standard errors resample (None: each row its
    own); bootstrap: resamples for those standard errors (0: none); seed: draws them; copies [M] int64
    (0 / 1): with two independent groups per problem (`ProbeConfig.two_groups`), which one each row is in
    (None: one group per problem).
    """

    rows: Tensor
    credit: OracleCredit
    targets: Tensor
    z: float = ORACLE_Z
    groups: Tensor | None = None
    bootstrap: int = 0
    seed: int = 0
    copies: Tensor | None = None

    def full_advantages(self, n: int) -> Tensor:
        """[n,T] float32: A* on the estimated rows, 0 on the others (for the checker's scoring)."""
        out = torch.zeros(n, self.credit.advantages.shape[1])
        out[self.rows] = self.credit.advantages.float()
        return out


def run_oracle(
    model: Any,
    tokenizer: Any,
    ro: Rollouts,
    golds: Sequence[Any],
    reward_fn: Callable[[Sequence[str], Sequence[Any]], Sequence[float]],
    rows: Tensor,
    cfg: ProbeConfig,
    *,
    old_log_probs: Tensor | None = None,
    known_zero: Tensor | None = None,
    log: Callable[[str], None] | None = None,
) -> ProbeOracle | None:
    """A* (`oracle_credit`, `cfg.oracle_k` continuations per state, `cfg.oracle_delta`) of the
    rollouts where `rows` (bool [N]) holds, sampled as the probe sampled them; None when no row is
    selected. golds[i]: rollout i's gold for `reward_fn`; old_log_probs [N,T]: the probe's signal
    at `cfg.sampling.temperature` when it has one (else computed for the selected rows). With the
    gradient cosines (`cfg.grad_batches` > 0) and K even, also A* of each half of the continuations
    (`OracleCredit.half_advantages`, for the gradients' noise ceiling; A* itself is unchanged).
    known_zero [N,T] bool: tokens whose A* is exactly 0 by construction (a toy-tail task's tail), not sampled."""
    idx = rows.bool().cpu().nonzero().squeeze(1)
    if not idx.numel():
        return None
    credit = oracle_credit(
        model,
        tokenizer,
        select_rollouts(ro, idx),
        [golds[i] for i in idx.tolist()],
        reward_fn,
        temperature=cfg.sampling.temperature,
        max_new_tokens=cfg.sampling.max_new_tokens,
        top_p=cfg.sampling.top_p,
        k=cfg.oracle_k,
        delta=cfg.oracle_delta,
        old_log_probs=None if old_log_probs is None else old_log_probs.cpu()[idx],
        seed=cfg.seed,
        batch_size=cfg.sampling.batch_size,
        split_halves=split_halves(cfg),
        known_zero=None if known_zero is None else known_zero.cpu()[idx],
        log=log,
    )
    groups, copies = ro.prompt_index.cpu()[idx], None
    if cfg.two_groups:  # the unit of the standard errors and of the gradient batches is the problem
        groups, copies = problem_and_copy(groups)
    return ProbeOracle(
        idx,
        credit,
        oracle_targets(credit, ORACLE_Z),
        groups=groups,
        bootstrap=cfg.bootstrap,
        seed=cfg.seed,
        copies=copies,
    )


def split_halves(cfg: ProbeConfig) -> bool:
    """Whether the oracle also keeps A* of each half of its K continuations: with the gradient cosines
    (their noise ceiling, `gradients`) and K even."""
    return cfg.grad_batches > 0 and cfg.oracle_k >= 2 and cfg.oracle_k % 2 == 0


def _hits(c: Tensor, oracle: ProbeOracle, rows: Tensor, k: int) -> Tensor:
    """[R] float64 expected blame hits@k of credit c [M,T] on the oracle's targets of `rows` (bool [M])."""
    if not bool(rows.any()):
        return torch.zeros(0, dtype=torch.float64)
    return blame_hits(c[rows], oracle.credit.mask[rows], oracle.targets[rows], k)


def _blame_vs_oracle(c: Tensor, oracle: ProbeOracle, ks: Sequence[int]) -> dict[str, Any]:
    """oracle_blame_rollouts, oracle_blame@k (+ _se) of credit c [M,T] on the oracle's rows with a
    target, and oracle_blame_by_outcome {"wrong" (reward 0), "correct" (reward > 0): {n, blame@k}}."""
    has = oracle.targets >= 0
    out: dict[str, Any] = {"oracle_blame_rollouts": int(has.sum())}
    for k in ks:
        hits = _hits(c, oracle, has, k)
        out[f"oracle_blame@{k}"] = mean_of(hits)
        out[f"oracle_blame@{k}_se"] = stderr_of(hits)
    rewarded = oracle.credit.rewards.cpu() > 0
    by_outcome: dict[str, dict[str, Any]] = {}
    for name, rows in (("wrong", has & ~rewarded), ("correct", has & rewarded)):
        by_outcome[name] = {
            "n": int(rows.sum()),
            **{f"blame@{k}": mean_of(_hits(c, oracle, rows, k)) for k in ks},
        }
    out["oracle_blame_by_outcome"] = by_outcome
    return out


def _scores(c: Tensor, oracle: ProbeOracle, ks: Sequence[int]) -> dict[str, Any]:
    out = {**fidelity(c, oracle.credit, z=oracle.z), **_blame_vs_oracle(c, oracle, ks)}
    if oracle.bootstrap:
        groups = oracle.groups if oracle.groups is not None else torch.arange(c.shape[0])
        se = fidelity_stderr(
            c, oracle.credit, groups, z=oracle.z, resamples=oracle.bootstrap, seed=oracle.seed
        )
        out.update(se)
    return out


def score_fidelity(credit: Tensor, oracle: ProbeOracle, ks: Sequence[int]) -> dict[str, Any]:
    """The fidelity numbers of a credit tensor [N,T] of the whole batch, on the oracle's rows.

    Keys: spearman, spearman_per_response, responses, sign_agreement, significant_share,
    significant_tokens, tokens (`tokencredit.oracle.agreement`), with `oracle.bootstrap` the first
    four's standard errors `<key>_se` (`fidelity_stderr`, resampling problems), oracle_blame_rollouts,
    oracle_blame@k, oracle_blame@k_se and oracle_blame_by_outcome (None where no rollout qualifies).
    """
    c = credit.detach().float().cpu()
    if c.dim() != 2 or c.shape[1] != oracle.credit.mask.shape[1]:
        raise ValueError(
            f"score_fidelity: credit shape {tuple(c.shape)} does not match the oracle's "
            f"{oracle.credit.mask.shape[1]} response tokens"
        )
    return _scores(c[oracle.rows], oracle, ks)


def _average_draws(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Key-wise mean over draws (nested dicts recursively); counts (ints) are the same in every draw
    and kept; None where any draw's number is undefined."""
    out: dict[str, Any] = {}
    for key, first in results[0].items():
        values = [r[key] for r in results]
        if isinstance(first, dict):
            out[key] = _average_draws(values)
        elif isinstance(first, int):
            out[key] = first
        elif any(v is None for v in values):
            out[key] = None
        else:
            out[key] = sum(values) / len(values)
    return out


def fidelity_baselines(
    oracle: ProbeOracle, ks: Sequence[int], *, draws: int = 20, seed: int = 0
) -> dict[str, dict[str, Any]]:
    """{"random": mean over `draws` i.i.d. N(0, 1) credits, "uniform": -1 on every token}, scored
    against A* on the oracle's rows (uniform: rho undefined, None)."""
    if draws < 1:
        raise ValueError(f"random draws must be >= 1, got {draws}")
    g = torch.Generator().manual_seed(seed)
    m = oracle.credit.mask
    rand = _average_draws([_scores(random_credit(m, g), oracle, ks) for _ in range(draws)])
    return {"random": rand, "uniform": _scores(uniform_credit(m), oracle, ks)}


def oracle_cost(cost: OracleCost) -> dict[str, Any]:
    """The oracle's cost (`OracleCost.as_dict`) and skipped_share: the share of the valid positions
    given A* = 0 by the delta rule."""
    return {**cost.as_dict(), "skipped_share": cost.skipped / cost.positions if cost.positions else None}


def oracle_section(
    oracle: ProbeOracle | None,
    got: Mapping[str, MethodCredit],
    cfg: ProbeConfig,
    *,
    reward: str,
    truth: ProbeTruth | None = None,
) -> dict[str, Any]:
    """The point's "oracle" result: settings (k, delta, z, the `reward`'s name), "status", the rows
    estimated, "cost", "checker" (the oracle's A* scored by `score_credit` against `truth`, on the
    synthetic task only), "methods" ({name: `method_row` of `score_fidelity`}) and "baselines"."""
    head = {"k": cfg.oracle_k, "delta": cfg.oracle_delta, "z": ORACLE_Z, "reward": reward}
    if oracle is None:
        reason = "no rollout in a mixed group (every group scored alike): no credit to compare"
        return {**head, "status": "n/a", "reason": reason, "rollouts": 0}
    out: dict[str, Any] = {
        **head,
        "status": "ok",
        "rollouts": int(oracle.rows.numel()),
        "cost": oracle_cost(oracle.credit.cost),
    }
    if truth is not None:
        out["checker"] = score_credit(oracle.full_advantages(truth.mask.shape[0]), truth, cfg.ks)
    numbers = partial(score_fidelity, oracle=oracle, ks=cfg.ks)
    out["methods"] = {name: method_row(g, numbers) for name, g in got.items()}
    out["baselines"] = fidelity_baselines(oracle, cfg.ks, draws=cfg.random_draws, seed=cfg.seed)
    return out

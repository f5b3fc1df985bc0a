"""Advantage estimators (docs/spec/baselines.md#group-advantages): A [N] per rollout, or a token-level A [N,T], vectorised over the batch.

An estimator is a registered function of the `RolloutBatch` and its hyperparameters (keyword
defaults). Most read only `batch.scores` and `batch.group_ids` (GRPO, Dr.GRPO, RLOO, ...); the
others declare what else they read: per-token signals (`needs`, names from
`tokencredit.batch.SIGNALS`; OTB reads old_log_probs and sum_sq_probs), optional batch fields an
engine must fill (`fields`; ReMax reads `baseline_scores`, the reward of a greedy rollout per
prompt), and whether they return a token-level A [N,T] (`token_level`; REINFORCE++, OTB).

`estimate(name, batch, **params)` is the entry point the pipeline uses
(`tokencredit.recipes.token_credit`); `compute(name, scores, group_ids, **params)` remains for
the estimators that read only scores and group ids. The score-only functions (`grpo`, `rloo`,
...) are public too. The batch-reading estimators live in `tokencredit.advantages.estimators` (the
estimators of verl 0.9.1's registry, re-implemented; differences from verl are listed there).

All statistics in float64; groups are found with `unique(return_inverse=True)` and reduced with
`index_add_`, so there is no Python loop over groups. A group of size 1 gets A = 0 (with one
warning per process); a zero-variance group gets A = 0.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch import Tensor

from tokencredit.batch import SIGNALS, BatchValidationError, RolloutBatch, check_finite_scores
from tokencredit.distributed import gather_rows
from tokencredit.errors import ConfigError
from tokencredit.registry import Registry, keyword_defaults

__all__ = [
    "ESTIMATORS",
    "Estimator",
    "compute",
    "consecutive_group_ids",
    "dr_grpo",
    "estimate",
    "get_estimator",
    "grpo",
    "grpo_batch",
    "on_whole_batch",
    "register_estimator",
    "rloo",
]

_warned_singleton = False


def _group_stats(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(index [N] into groups, count [G], sum [G]) per rollout's group, float64."""
    if scores.dim() != 1 or group_ids.shape != scores.shape:
        raise BatchValidationError(
            f"scores and group_ids must both have shape [N]; got scores {tuple(scores.shape)}, "
            f"group_ids {tuple(group_ids.shape)}"
        )
    if group_ids.dtype.is_floating_point:
        raise BatchValidationError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
    check_finite_scores(scores, "scores")
    _, inv = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    s = scores.double()
    cnt = torch.zeros(n_groups, dtype=torch.float64, device=s.device).index_add_(0, inv, torch.ones_like(s))
    tot = torch.zeros(n_groups, dtype=torch.float64, device=s.device).index_add_(0, inv, s)
    return inv, cnt, tot


def _warn_singletons(cnt: Tensor) -> None:
    global _warned_singleton
    if not _warned_singleton and bool((cnt == 1).any()):
        _warned_singleton = True
        warnings.warn(
            "a group of size 1 has no baseline; its advantage is set to 0 (warned once)",
            RuntimeWarning,
            stacklevel=3,
        )


def grpo(scores: Tensor, group_ids: Tensor, eps: float = 1e-6, scale: str = "std") -> Tensor:
    """Group-relative advantage A[N] (float32).

    scale="std":   A_i = (r_i - mean_g) / (std_g + eps), std unbiased (Bessel)  -- GRPO.
    scale="none":  A_i = r_i - mean_g                                           -- Dr.GRPO.
    scale="batch": A_i = (r_i - mean_g) / (std over the whole batch + eps)       -- TRL's option.
    Groups of size 1 and zero-variance groups give A = 0.
    """
    if scale not in ("std", "none", "batch"):
        raise ConfigError(f"grpo scale must be 'std', 'none' or 'batch', got {scale!r}")
    inv, cnt, tot = _group_stats(scores, group_ids)
    _warn_singletons(cnt)
    s = scores.double()
    mean = (tot / cnt)[inv]
    centred = s - mean
    sq = torch.zeros_like(cnt).index_add_(0, inv, centred * centred)
    var = sq / (cnt - 1).clamp(min=1)  # unbiased
    g_cnt = cnt[inv]
    zero_var = var[inv] <= 0
    if scale == "std":
        adv = centred / (var.sqrt()[inv] + eps)
    elif scale == "batch":
        batch_std = s.std(unbiased=True) if s.numel() > 1 else s.new_zeros(())
        adv = centred / (batch_std + eps)
    else:
        adv = centred
    adv = torch.where((g_cnt <= 1) | zero_var, torch.zeros_like(adv), adv)
    return adv.float()


def rloo(scores: Tensor, group_ids: Tensor) -> Tensor:
    """Leave-one-out advantage A[N] (float32): A_i = r_i - mean of the other G-1 rewards in its group."""
    inv, cnt, tot = _group_stats(scores, group_ids)
    _warn_singletons(cnt)
    s = scores.double()
    g_cnt = cnt[inv]
    loo_mean = (tot[inv] - s) / (g_cnt - 1).clamp(min=1)
    adv = torch.where(g_cnt <= 1, torch.zeros_like(s), s - loo_mean)
    return adv.float()


def dr_grpo(scores: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """Dr.GRPO's mean-only baseline, A_i = r_i - mean_g (same as grpo(scale="none"))."""
    return grpo(scores, group_ids, eps=eps, scale="none")


def grpo_batch(scores: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """Group mean, batch std (TRL's scale_rewards="batch"): grpo(scale="batch")."""
    return grpo(scores, group_ids, eps=eps, scale="batch")


# ---------------------------------------------------------------------------------------------- registry
EstimatorFn = Callable[..., Tensor]
# `register_estimator` hands back the function it was given, with its own signature (not widened).
F = TypeVar("F", bound=EstimatorFn)


@dataclass(frozen=True)
class Estimator:
    name: str
    fn: EstimatorFn  # fn(batch: RolloutBatch, **params) -> A [N] (or [N,T] when token_level)
    defaults: Mapping[str, Any]
    needs: frozenset[str] = frozenset()  # per-token signals it reads (tokencredit.batch.SIGNALS)
    fields: frozenset[str] = (
        frozenset()
    )  # optional RolloutBatch fields an engine must fill (baseline_scores, values)
    token_level: bool = False  # A [N,T]: only credit methods that take token advantages accept it
    paper: str = ""
    scores_fn: Callable[..., Tensor] | None = field(
        default=None, repr=False
    )  # fn(scores, group_ids, **params)
    # fn reduces its batch statistics over `batch.shard` itself (tokencredit.distributed)
    sharded: bool = False


ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")

# Batch fields an estimator may read besides the per-token signals, and how an engine fills them.
FIELDS: dict[str, str] = {
    "baseline_scores": "the reward of one greedy (temperature 0) rollout of each row's prompt",
    "values": "a learned critic's value V_t [N,T] of the state before each response token (tokencredit.critic)",
}


def register_estimator(
    name: str,
    *,
    needs: tuple[str, ...] = (),
    fields: tuple[str, ...] = (),
    token_level: bool = False,
    paper: str = "",
    sharded: bool = False,
) -> Callable[[F], F]:
    """Register `fn(batch, **params) -> A`; its keyword defaults are its hyperparameters.

    sharded=True: fn computes the whole batch's statistics when `batch.shard` is set (this rank's rows of
    a batch split across ranks), e.g. with `on_whole_batch` or `tokencredit.distributed`; without it, a
    sharded batch is refused."""
    unknown = [n for n in needs if n not in SIGNALS] + [f for f in fields if f not in FIELDS]
    if unknown:
        raise ValueError(f"advantage estimator {name!r}: unknown signal or field(s) {unknown}")

    def deco(fn: F) -> F:
        ESTIMATORS.add(
            Estimator(
                name,
                fn,
                keyword_defaults(fn, skip=1),
                frozenset(needs),
                frozenset(fields),
                token_level,
                paper,
                sharded=sharded,
            )
        )
        return fn

    return deco


def _register_scores(name: str, fn: Callable[..., Tensor], paper: str) -> None:
    """Register a score-only estimator fn(scores, group_ids, **params) -> A [N]."""

    def from_batch(batch: RolloutBatch, **params: Any) -> Tensor:
        return fn(batch.scores, batch.group_ids, **params)

    ESTIMATORS.add(Estimator(name, from_batch, keyword_defaults(fn, skip=2), paper=paper, scores_fn=fn))


for _name, _fn, _paper in (
    ("grpo", grpo, "Shao et al. 2024, DeepSeekMath (arXiv 2402.03300)"),
    ("dr-grpo", dr_grpo, "Liu et al. 2025, Dr.GRPO (arXiv 2503.20783)"),
    ("rloo", rloo, "Ahmadian et al. 2024, RLOO (arXiv 2402.14740)"),
    ("grpo-batch", grpo_batch, "TRL's scale_rewards='batch'"),
):
    _register_scores(_name, _fn, _paper)


def get_estimator(name: str) -> Estimator:
    return ESTIMATORS.get(name)


def consecutive_group_ids(n: int, group_size: int, device: torch.device | str | None = None) -> Tensor:
    """group_ids [N] int64 for a batch laid out as consecutive groups of `group_size` completions
    (prompt 0's G completions, then prompt 1's, ...); a size that does not divide N is an error,
    not a silently ragged last group."""
    if group_size < 1:
        raise ConfigError(f"group size must be >= 1, got {group_size}")
    if n % group_size:
        raise ConfigError(
            f"group size G={group_size} does not divide the batch of {n} rollouts "
            f"({n // group_size} full groups and {n % group_size} left over)"
        )
    return torch.arange(n, device=device) // group_size


def compute(name: str, scores: Tensor, group_ids: Tensor, **params: Any) -> Tensor:
    """A[N] from a score-only estimator `name` in ESTIMATORS (grpo, dr-grpo, rloo, grpo-batch); unknown
    names and parameters are a ConfigError naming the closest valid one. An estimator that reads more
    of the batch (OTB, REINFORCE++, ReMax, ...) is a ConfigError pointing to `estimate`."""
    est = ESTIMATORS.get(name)
    ESTIMATORS.check_params(name, params)
    if est.scores_fn is None:
        raise ConfigError(
            f"advantage estimator {name!r} reads more of the batch than scores and group ids (response "
            "lengths, per-token signals or baseline rewards): use tokencredit.advantages.estimate(name, batch)"
        )
    return est.scores_fn(scores, group_ids, **params)


def on_whole_batch(batch: RolloutBatch, fn: Callable[..., Tensor], *per_rollout: Tensor) -> Tensor:
    """fn(*per_rollout) -> [N, ...] evaluated on the whole batch, this rank's rows returned.

    per_rollout: [N] values of this batch's rollouts (scores, prompt ids, lengths: scalars, never per-token
    tensors). Without a shard this is fn(*per_rollout); with one, each is gathered over the ranks first
    (a few bytes per rollout), so a prompt's responses may sit on different ranks.
    """
    if batch.shard is None:
        return fn(*per_rollout)
    gathered = [gather_rows(v, batch.shard) for v in per_rollout]
    return fn(*gathered)[batch.shard.rows.to(gathered[0].device)]


def _sharded(est: Estimator, name: str, batch: RolloutBatch, params: Mapping[str, Any]) -> Tensor:
    """An estimator on one rank's part of a split batch (`RolloutBatch.shard`): a score-only one on the
    whole batch's gathered scores and prompt ids; one that reads more must say it reduces over the ranks
    itself (`register_estimator(..., sharded=True)`), any other is refused."""
    scores_fn = est.scores_fn  # bound here: the lambda below sees it narrowed (not None)
    if scores_fn is not None:
        return on_whole_batch(
            batch, lambda s, g: scores_fn(s, g, **params), batch.scores, batch.group_ids
        ).float()
    if not est.sharded:
        raise ConfigError(
            f"advantage estimator {name!r} reads more than scores and prompt ids and does not reduce its statistics "
            "over data-parallel ranks; it is not supported on a batch split across ranks (RolloutBatch.shard)"
        )
    return est.fn(batch, **params).float()


def estimate(name: str, batch: RolloutBatch, **params: Any) -> Tensor:
    """The estimator `name` on `batch`: A [N] float32, or A [N,T] float32 (0 off `batch.mask`) for a
    token-level estimator; detached. A missing signal is a BatchValidationError, a missing batch field
    (ReMax's baseline_scores) a ConfigError saying what the engine must supply; non-finite output is
    a FloatingPointError naming the rollout."""
    est = ESTIMATORS.get(name)
    ESTIMATORS.check_params(name, params)
    batch.require(est.needs, f"advantage estimator {name!r}")
    missing = [f for f in sorted(est.fields) if getattr(batch, f, None) is None]
    if missing:
        raise ConfigError(
            f"advantage estimator {name!r} needs RolloutBatch.{missing[0]} ({FIELDS[missing[0]]}), which this "
            "engine did not supply"
        )
    with torch.no_grad():
        out = (
            _sharded(est, name, batch, params) if batch.shard is not None else est.fn(batch, **params).float()
        )
    want = tuple(batch.mask.shape) if est.token_level else (batch.num_rollouts,)
    if tuple(out.shape) != want:
        raise ValueError(f"advantage estimator {name!r} returned shape {tuple(out.shape)}, expected {want}")
    if est.token_level:
        out = torch.where(batch.mask, out, torch.zeros((), dtype=out.dtype, device=out.device))
    bad = ~torch.isfinite(out)
    if bool(bad.any()):
        where = bad.nonzero()[0].tolist()
        at = f"rollout {where[0]}" + (f", token {where[1]}" if len(where) > 1 else "")
        raise FloatingPointError(f"advantage estimator {name!r} produced a non-finite advantage at {at}")
    return out.detach()

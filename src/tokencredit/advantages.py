"""Sequence-level group advantages A[N] (baselines.md), vectorised over the batch.

All statistics in float64; groups are found with `unique(return_inverse=True)` and reduced with
`index_add_`, so there is no Python loop over groups. A group of size 1 gets A = 0 (with one
warning per process); a zero-variance group gets A = 0.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tokencredit.batch import BatchValidationError, check_finite_scores
from tokencredit.errors import ConfigError
from tokencredit.registry import Registry, keyword_defaults

_warned_singleton = False


def _group_stats(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(index [N] into groups, count [N], sum [N]) per rollout's group, float64."""
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
            "a group of size 1 has no baseline; its advantage is set to 0 (warned once)", RuntimeWarning, stacklevel=3
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


@dataclass(frozen=True)
class Estimator:
    name: str
    fn: Callable[..., Tensor]  # fn(scores [N], group_ids [N], **params) -> A [N]
    defaults: Mapping[str, Any]


ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")
for _name, _fn in (("grpo", grpo), ("dr-grpo", dr_grpo), ("rloo", rloo), ("grpo-batch", grpo_batch)):
    ESTIMATORS.add(Estimator(_name, _fn, keyword_defaults(_fn, skip=2)))


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


def compute(name: str, scores: Tensor, group_ids: Tensor, **params: float) -> Tensor:
    """A[N] from the estimator `name` in ESTIMATORS (grpo, dr-grpo, rloo, grpo-batch); unknown
    names and parameters are a ConfigError naming the closest valid one."""
    est = ESTIMATORS.get(name)
    ESTIMATORS.check_params(name, params)
    return est.fn(scores, group_ids, **params)

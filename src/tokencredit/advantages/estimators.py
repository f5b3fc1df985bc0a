"""Advantage estimators that read more of the batch than scores: the rest of verl 0.9.1's registry.

Re-implemented from the formulas of verl's ``core_algos`` (the registered function named in the
table), vectorised over groups; ``tests/objectives/test_vs_verl.py`` checks each against verl's
function. r_i is the rollout's score (verl: the outcome reward at the last valid token), L_i its
number of valid tokens, g its group.

| name                 | verl name                    | A                                                             |
|----------------------|------------------------------|---------------------------------------------------------------|
| reinforce++          | reinforce_plus_plus          | [N,T]: G_t = gamma^(valid tokens after t) r_i, whitened over all valid tokens |
| reinforce++-baseline | reinforce_plus_plus_baseline | r_i - mean_g, whitened over all valid tokens (row i counted L_i times) |
| remax                | remax                        | r_i - b_i, b_i the reward of a greedy rollout of i's prompt (`baseline_scores`) |
| opo                  | opo                          | r_i - sum_g L r / sum_g L (length-weighted group mean)         |
| gpg                  | gpg                          | (N / M) (r_i - mean_g) / f_norm, M = rollouts of the batch with r != 0 |
| grpo-passk           | grpo_passk                   | the best response of g: (r_max - r_second) / (std_g + eps); the others 0 |
| otb                  | optimal_token_baseline       | [N,T]: r_i - B_t, B_t = sum_g r W_t / (sum_g W_t + eps) over the rows valid at t, W_t = sum_{j<=t} (1 - 2 pi_j + sum_v pi_j(v)^2) |

Deliberate differences from verl, each a rule tokencredit applies to every estimator:
- a group of size 1 gets A = 0 (verl: baseline 0, so A = r for the mean-based ones and OTB);
- whitening over one or no valid token gives A = 0 (verl raises).
grpo-passk needs two responses per group, as verl; its ties (r_max = r_second) give 0 whichever row
verl's topk picks. OTB's rollout importance weights (verl's ``rollout_is_weights``) are not supported.

Data-parallel ranks (`RolloutBatch.shard`): every estimator here is registered ``sharded=True``. The ones
whose A is a function of per-rollout scalars (scores, prompt ids, lengths) evaluate it on the whole
batch's gathered scalars (`on_whole_batch`); the whitening sums and OTB's per-prompt, per-position
sums are all-reduced (`tokencredit.distributed`). So each rank gets its rows of the single-process A.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tokencredit.advantages.core import (
    _group_stats,
    _warn_singletons,
    dr_grpo,
    on_whole_batch,
    register_estimator,
)
from tokencredit.batch import BatchValidationError, RolloutBatch
from tokencredit.distributed import Shard, all_max, all_sum, sum_by_key
from tokencredit.errors import ConfigError

__all__ = [
    "gpg",
    "grpo_passk",
    "opo",
    "optimal_token_baseline",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "remax",
]


def _whiten(values: Tensor, weights: Tensor, eps: float, shard: Shard | None) -> Tensor:
    """(x - mean) / sqrt(var + eps) with the weighted mean and unbiased variance over `weights`
    (token counts) of the whole batch (sums over the ranks under a shard); 0 when the total weight is
    at most 1 (the variance is undefined)."""
    w = weights.double()
    x = values.double()
    n, total = all_sum(torch.stack([w.sum(), (x * w).sum()]), shard).unbind()
    if float(n) <= 1:
        return torch.zeros_like(values, dtype=torch.float64)
    mean = total / n
    var = all_sum(((x - mean) ** 2 * w).sum(), shard) / (n - 1)
    return (x - mean) / torch.sqrt(var + eps)


def _check_eps(name: str, eps: float) -> None:
    if not eps >= 0:
        raise ConfigError(f"advantage estimator {name!r}: eps must be >= 0, got {eps}")


@register_estimator(
    "reinforce++", token_level=True, sharded=True, paper="Hu et al. 2025, REINFORCE++ (arXiv 2501.03262)"
)
def reinforce_pp(batch: RolloutBatch, gamma: float = 1.0, eps: float = 1e-8) -> Tensor:
    """A [N,T]: the discounted return of the outcome reward, G_t = gamma^(valid tokens after t) r_i
    (masked positions neither discount nor earn), whitened over every valid token of the batch."""
    _check_eps("reinforce++", eps)
    if not 0.0 <= gamma <= 1.0:
        raise ConfigError(f"advantage estimator 'reinforce++': gamma must be in [0, 1], got {gamma}")
    m = batch.mask
    after = (m.flip(-1).cumsum(-1).flip(-1) - m.long()).double()
    returns = batch.scores.double()[:, None] * torch.pow(torch.tensor(gamma, dtype=torch.float64), after)
    return _whiten(returns, m, eps, batch.shard)


@register_estimator(
    "reinforce++-baseline", sharded=True, paper="Hu et al. 2025, REINFORCE++ (arXiv 2501.03262)"
)
def reinforce_pp_baseline(batch: RolloutBatch, eps: float = 1e-8) -> Tensor:
    """A [N]: r_i - mean_g, then whitened over all valid tokens of the batch (row i weighted by L_i)."""
    _check_eps("reinforce++-baseline", eps)
    centred = on_whole_batch(batch, dr_grpo, batch.scores, batch.group_ids).double()
    return _whiten(centred, batch.lengths, eps, batch.shard)


@register_estimator(
    "remax", fields=("baseline_scores",), sharded=True, paper="Li et al. 2024, ReMax (arXiv 2310.10505)"
)
def remax(batch: RolloutBatch) -> Tensor:
    """A [N] = r_i - b_i, b_i the reward of one greedy rollout of i's prompt (`batch.baseline_scores`)."""
    assert batch.baseline_scores is not None  # estimate() checks the declared field
    return batch.scores.double() - batch.baseline_scores.double()


@register_estimator("opo", sharded=True, paper="Hao et al. 2025, OPO (arXiv 2505.23585)")
def opo(batch: RolloutBatch) -> Tensor:
    """A [N] = r_i - b_g with the length-weighted group baseline b_g = sum_g L r / sum_g L
    (the plain group mean when every response of g is empty)."""
    return on_whole_batch(batch, _opo, batch.scores, batch.group_ids, batch.lengths)


def _opo(scores: Tensor, group_ids: Tensor, lengths: Tensor) -> Tensor:
    inv, cnt, tot = _group_stats(scores, group_ids)
    _warn_singletons(cnt)
    s, length = scores.double(), lengths.double()
    num = torch.zeros_like(cnt).index_add_(0, inv, length * s)
    den = torch.zeros_like(cnt).index_add_(0, inv, length)
    base = torch.where(den > 0, num / den.clamp(min=1), tot / cnt)
    return torch.where(cnt[inv] > 1, s - base[inv], torch.zeros_like(s))


@register_estimator("gpg", sharded=True, paper="Chu et al. 2025, GPG (arXiv 2504.02546)")
def gpg(batch: RolloutBatch, f_norm: float = 1.0) -> Tensor:
    """A [N] = alpha (r_i - mean_g) / f_norm with alpha = N / M, M the rollouts of the batch whose reward is
    not 0 (at least 1), as verl implements GPG's batch rescaling."""
    if not f_norm > 0:
        raise ConfigError(f"advantage estimator 'gpg': f_norm must be > 0, got {f_norm}")

    def whole(scores: Tensor, group_ids: Tensor) -> Tensor:
        s = scores.double()
        alpha = s.numel() / max(int((s != 0).sum()), 1)
        return alpha * dr_grpo(scores, group_ids).double() / f_norm

    return on_whole_batch(batch, whole, batch.scores, batch.group_ids)


@register_estimator(
    "grpo-passk", sharded=True, paper="Pass@k training as in verl's grpo_passk (arXiv 2503.19595)"
)
def grpo_passk(batch: RolloutBatch, eps: float = 1e-6, norm_adv_by_std_in_grpo: bool = True) -> Tensor:
    """A [N]: only each group's best response gets r_max - r_second (divided by std_g + eps, std unbiased,
    when norm_adv_by_std_in_grpo); every other response gets 0. Groups need at least two responses."""
    _check_eps("grpo-passk", eps)
    return on_whole_batch(
        batch, lambda s, g: _grpo_passk(s, g, eps, norm_adv_by_std_in_grpo), batch.scores, batch.group_ids
    )


def _grpo_passk(scores: Tensor, group_ids: Tensor, eps: float, norm_adv_by_std_in_grpo: bool) -> Tensor:
    inv, cnt, tot = _group_stats(scores, group_ids)
    small = cnt[inv] < 2
    if bool(small.any()):
        i = int(small.nonzero()[0])
        raise BatchValidationError(
            f"grpo-passk needs at least 2 responses per group; rollout {i} is alone in its group"
        )
    s = scores.double()
    order = torch.argsort(s, descending=True, stable=True)
    order = order[torch.argsort(inv[order], stable=True)]  # grouped, best first within each group
    start = torch.cumsum(cnt, 0).long() - cnt.long()
    best, runner_up = order[start], s[order[start + 1]]
    gap = s[best] - runner_up
    if norm_adv_by_std_in_grpo:
        mean = tot / cnt
        var = torch.zeros_like(cnt).index_add_(0, inv, (s - mean[inv]) ** 2) / (cnt - 1)
        gap = gap / (var.sqrt() + eps)
    return torch.zeros_like(s).index_put((best,), gap)


@register_estimator(
    "otb",
    needs=("old_log_probs", "sum_sq_probs"),
    token_level=True,
    sharded=True,
    paper="Optimal token baseline, as in verl 0.9.1's optimal_token_baseline",
)
def optimal_token_baseline(batch: RolloutBatch, handle_zero_tail: bool = True, eps: float = 1e-8) -> Tensor:
    """A [N,T] = r_i - B_t with the per-step group baseline B_t = sum_g r W_t / (sum_g W_t + eps) over the rows
    valid at t, W_t = sum_{j<=t} ||s_j||^2 and ||s_j||^2 = 1 - 2 pi_old(y_j) + sum_v pi_old(v)^2 (the
    cumulative path-variance proxy). handle_zero_tail: where one response of a group is strictly the
    longest, its baseline is 0 past the second-longest length (B_t would equal its own return there)."""
    _check_eps("otb", eps)
    old_log_probs = batch.signal("old_log_probs", "advantage estimator 'otb'")
    sum_sq_probs = batch.signal("sum_sq_probs", "advantage estimator 'otb'")
    size = on_whole_batch(batch, _group_sizes, batch.scores, batch.group_ids)
    _warn_singletons(size)
    m = batch.mask.double()
    returns = batch.scores.double()[:, None] * m  # reward-to-go of an outcome reward at the last valid token
    per_step = (1.0 - 2.0 * old_log_probs.double().exp() + sum_sq_probs.double()) * m
    w = per_step.cumsum(-1) * m
    num, den = _group_position_sums(batch, torch.stack([returns * w, w], 1)).unbind(1)
    base = num / (den + eps)
    if handle_zero_tail:
        tail, second = on_whole_batch(batch, _zero_tail, batch.lengths, batch.group_ids).unbind(1)
        cols = torch.arange(m.shape[1], device=m.device)[None, :]
        base = torch.where((tail > 0)[:, None] & (cols >= second[:, None]), torch.zeros_like(base), base)
    adv = (returns - base) * m
    return torch.where((size > 1)[:, None], adv, torch.zeros_like(adv))


def _group_sizes(scores: Tensor, group_ids: Tensor) -> Tensor:
    inv, cnt, _ = _group_stats(scores, group_ids)
    return cnt[inv]


def _group_position_sums(batch: RolloutBatch, values: Tensor) -> Tensor:
    """[N, k, T]: for each rollout, the sum of `values` [N, k, T] over the rollouts of its group (all ranks)."""
    inv, cnt, _ = _group_stats(batch.scores, batch.group_ids)
    n, k, t = values.shape
    sums = torch.zeros(cnt.numel(), k, t, dtype=values.dtype, device=values.device).index_add_(0, inv, values)
    if batch.shard is not None:  # ranks pad to their own T: sum over the longest
        width = int(all_max(torch.tensor([t], device=values.device), batch.shard)[0])
        padded = torch.nn.functional.pad(sums, (0, width - t)).reshape(cnt.numel(), k * width)
        keys = torch.unique(batch.group_ids)[:, None]  # row r of `sums` is group keys[r] (as `inv`)
        sums = sum_by_key(keys, padded, batch.shard).reshape(-1, k, width)[..., :t]
    return sums[inv]


def _zero_tail(lengths: Tensor, group_ids: Tensor) -> Tensor:
    """[N, 2]: (1 if the rollout is its group's strictly longest and the group has a shorter one, else 0;
    the group's second-longest length)."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    length = lengths.long()
    longest = torch.zeros(n_groups, dtype=torch.long, device=length.device).scatter_reduce(
        0, inv, length, "amax"
    )
    at_max = length == longest[inv]
    n_at_max = torch.zeros(n_groups, dtype=torch.long, device=length.device).index_add_(0, inv, at_max.long())
    shorter = torch.where(at_max, torch.full_like(length, -1), length)
    second = torch.full((n_groups,), -1, dtype=torch.long, device=length.device).scatter_reduce(
        0, inv, shorter, "amax"
    )
    tail = at_max & (n_at_max[inv] == 1) & (second[inv] >= 0)
    return torch.stack([tail.long(), second[inv]], 1)

"""CW-GRPO: covariance-aware GRPO with Gaussian-kernel advantage reweighting (Wang, Liu, Zhou, Chen,
ACL 2026 short, arXiv 2605.11538).

The entropy change of a policy-gradient step is driven by the covariance between log pi(y_t) and A
(Cui et al. 2025, arXiv 2505.22617, whose Clip-Cov removes tokens of extreme covariance outright:
`tokencredit.objectives.losses_verl.clip_cov`). CW-GRPO down-weights them smoothly instead:

    c_{i,t} = (log pi(y_{i,t}) - mean log pi) (A_{i,t} - mean A)        (each token's covariance term)
    w_{i,t} = exp(-c_{i,t}^2 / (2 sigma^2)),   sigma = std of the c over the batch's tokens
    w~_{i,t} = w_{i,t} N / sum_{j,k} w_{j,k}                             (N: the batch's valid tokens)
    Â_{i,t} = w~_{i,t} A_{i,t}

so the weights sum to N, as GRPO's uniform ones do: the same update budget, moved away from the
extreme-covariance tokens. No hyperparameter (sigma is the batch's own).

The paper's text was read only through two detailed summaries (its code is not released), which state
the three equations above, sigma as the empirical std of the current batch's covariances and N as the
token count. Our reading where they leave a detail open (`register(..., reconstruction=...)`):
- log pi is the old policy's (detached) log-prob: the credit is fixed before the update; with one
  update per batch (the paper's TRL runs) it equals the current policy's value;
- the means are over the batch's valid tokens (token-weighted, as Clip-Cov's covariance), and sigma
  is their unbiased (Bessel) std about the mean of c; the kernel is centred at c = 0 as stated;
- N and sigma are the whole batch's (the paper's summaries say "the group"; its TRL micro-batch of 12
  completions with 12 samples per prompt is one group, so per-group statistics equal these when a
  batch holds one prompt's group);
- fewer than 2 valid tokens or sigma = 0 (every c equal, e.g. a batch whose advantages are all equal,
  for which c is exactly 0 because float32 inputs are summed exactly in float64) gives w~ = 1: GRPO.

Data-parallel shards (`batch.shard`): the means, sigma's sum of squares, the largest log-weight and
the weight sum are all-reduced (float64), so every rank gets its rows of the single-process Â.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tokencredit.batch import RolloutBatch
from tokencredit.credit.registry import register, token_view
from tokencredit.distributed import Shard, all_max, all_sum

__all__ = ["covariance_weights", "cw_grpo"]


def covariance_weights(
    log_probs: Tensor, advantages: Tensor, mask: Tensor, *, shard: Shard | None = None
) -> Tensor:
    """w~ [N,T] float64: Gaussian-kernel weights of the per-token covariance terms, summing to the batch's
    valid-token count (0 on padding).

    log_probs [N,T] (any float dtype; read as float64), advantages A [N] or [N,T], mask [N,T] bool/0-1.
    `shard`: these rows are one rank's part of a batch split across ranks; every statistic is then the
    whole batch's (collective: every rank calls it). Raises ValueError on a non-finite valid log-prob.
    """
    valid = mask.bool()
    if log_probs.shape != valid.shape:
        raise ValueError(
            f"log_probs {tuple(log_probs.shape)} and mask {tuple(valid.shape)} must be the same shape"
        )
    lp = log_probs.detach().double()
    bad = valid & ~torch.isfinite(lp)
    if bool(bad.any()):
        row, pos = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"old log-prob is {float(lp[row, pos])} at valid token (response {row}, position {pos})"
        )
    a = advantages.detach().double()
    a = a[:, None].expand_as(lp) if a.dim() == 1 else a
    zero = torch.zeros((), dtype=torch.float64, device=lp.device)
    lp, a = torch.where(valid, lp, zero), torch.where(valid, a, zero)

    n, sum_lp, sum_a = all_sum(torch.stack([valid.sum().double(), lp.sum(), a.sum()]), shard).unbind(0)
    count = int(n)
    if count == 0:
        return torch.zeros_like(lp)
    c = torch.where(valid, (lp - sum_lp / n) * (a - sum_a / n), zero)
    mean_c = all_sum(c.sum().reshape(1), shard)[0] / n
    # two passes (mean, then squares about it): a one-pass E[c^2] - E[c]^2 can cancel to a negative variance
    ss = all_sum(torch.where(valid, (c - mean_c) ** 2, zero).sum().reshape(1), shard)[0]
    var = ss / (n - 1) if count > 1 else zero
    if not bool(var > 0):
        return valid.double()
    log_w = torch.where(valid, -(c * c) / (2.0 * var), torch.full_like(c, float("-inf")))
    # w~ is invariant to a common factor of w: shifting by the largest log-weight keeps sum w >= 1,
    # where plain exp could underflow to 0 / 0 when every |c| is far out in the kernel's tail
    local_top = log_w.amax() if log_w.numel() else torch.tensor(float("-inf"), dtype=torch.float64)
    top = all_max(local_top.reshape(1).to(lp.device), shard)[0]
    w = torch.exp(log_w - top)
    total = all_sum(w.sum().reshape(1), shard)[0]
    return torch.where(valid, w * (n / total), zero)


@register(
    "cw-grpo",
    needs=("old_log_probs",),
    token_advantages=True,
    paper="Wang, Liu, Zhou, Chen 2026, Covariance-Aware GRPO, ACL (arXiv 2605.11538)",
    reconstruction="read from summaries of the paper: old-policy log-probs, token-weighted batch means, "
    "Bessel std, whole-batch N and sigma; sigma = 0 gives uniform weights",
)
def cw_grpo(batch: RolloutBatch, advantages: Tensor) -> Tensor:
    """Â = w~ A: Gaussian-kernel down-weighting of extreme log pi-A covariance tokens, total weight kept."""
    log_probs = batch.signal("old_log_probs", "credit method 'cw-grpo'")
    a = token_view(batch, advantages)
    w = covariance_weights(log_probs, advantages, batch.mask, shard=batch.shard)
    return (w * a.double()).float()

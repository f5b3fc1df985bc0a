"""Effective token credit: the per-token gradient weight of a recipe's objective at the on-policy point.

A ratio kernel that is not per-token (GSPO's sequence ratio, the P-trace / S-trace eligibility
traces) spreads the advantage of token t over every token whose log-ratio enters w_t, so the
advantage a token *carries* (Â) is not the weight with which its log-probability is pushed. What
moves log pi(y_t) at the start of an update (pi = pi_old, every ratio 1, no clip active) is

    Â_eff[i,t] = -n_loss * dL / d log pi(y_{i,t}),

L = `tokencredit.objectives.policy_loss` evaluated with log_prob = old_log_prob (a leaf tensor,
so every log-ratio is 0), n_loss = the number of tokens that carry a loss term. The gradient is
taken by autograd through the objective itself, so the result is exact for any registered
kernel. Under token-mean aggregation:

- per-token kernels ("token", "gspo-token") and REINFORCE give Â_eff = Â exactly;
- GSPO gives every token of response i its row mean of Â (strace.md: weight 1/|y| per token);
- P-trace gives token k the sum over later tokens t of e[t,k] Â_t (strace.md worked example:
  [0.385714, 0.271429, 0.209524, 0.133333] x T for Â = 1, lambda = 0.5);
- S-trace gives 0 outside the kept set and normalises by its size |M|.

The P-trace / S-trace kernels are our reconstruction of Mou et al. 2026 (arXiv 2605.05965) from
its abstract (see `tokencredit.objectives.traces`), so their effective credit is too.
Other aggregation modes rescale rows (e.g. seq-mean-token-mean by n_loss / (N_seq T_i)); the
KL term is left out (it is a regulariser, not credit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tokencredit.batch import RolloutBatch

__all__ = ["RecipeCredit", "effective_credit", "effective_needs", "recipe_credit"]


def effective_credit(
    token_advantages: Tensor,
    mask: Tensor,
    *,
    kernel: str = "token",
    kernel_args: Mapping[str, Any] | None = None,
    loss_agg_mode: str = "token-mean",
    norm_constant: float | None = None,
    old_log_probs: Tensor | None = None,
) -> Tensor:
    """Â_eff [N,T] float32 = -n_loss * dL/dlogp at ratio 1, detached, exactly 0 off the loss tokens.

    token_advantages: Â [N,T] (or A [N], broadcast) as the objective receives it; mask [N,T] the
    valid tokens. kernel / kernel_args: "reinforce" or a registered ratio kernel and its keyword
    arguments (as `tokencredit.recipes.kernel_arguments` builds them, e.g. lam, keep, decay).
    old_log_probs [N,T] (optional) only sets the point at which the gradient is taken; the log-ratio
    is 0 there whatever its value, so zeros are used when it is None. Computed in float64.
    """
    from tokencredit.objectives import loss_token_mask, policy_loss

    m = mask.bool()
    if token_advantages.dim() not in (1, 2) or tuple(token_advantages.shape[:1]) != tuple(m.shape[:1]):
        raise ValueError(
            f"effective_credit: token_advantages must be [N,T] or [N] for a mask of shape {tuple(m.shape)}, "
            f"got {tuple(token_advantages.shape)}"
        )
    if token_advantages.dim() == 2 and token_advantages.shape != m.shape:
        raise ValueError(
            f"effective_credit: token_advantages shape {tuple(token_advantages.shape)} differs from mask {tuple(m.shape)}"
        )
    kw = dict(kernel_args or {})
    adv = token_advantages.detach().double()
    if adv.dim() == 1:
        adv = adv[:, None].expand(m.shape)
    bad = m & ~torch.isfinite(adv)
    if bool(bad.any()):
        i, j = (int(x) for x in bad.nonzero()[0])
        raise ValueError(f"effective_credit: non-finite advantage at rollout {i}, token {j}")
    base = torch.zeros(m.shape, dtype=torch.float64, device=m.device)
    if old_log_probs is not None:
        base = torch.where(m, old_log_probs.detach().double(), base)
    log_prob = base.clone().requires_grad_(True)
    keep = kw.get("keep")
    lmask = loss_token_mask(m, kernel, keep if isinstance(keep, Tensor) else None)
    n_loss = int(lmask.sum())
    if n_loss == 0:
        return torch.zeros(m.shape, dtype=torch.float32, device=m.device)
    with torch.enable_grad():
        loss, _ = policy_loss(
            log_prob,
            None if kernel == "reinforce" else base,
            adv,
            m,
            kernel=kernel,
            loss_agg_mode=loss_agg_mode,
            norm_constant=norm_constant,
            **kw,
        )
        (grad,) = torch.autograd.grad(loss, log_prob, allow_unused=True)
    if grad is None:
        grad = torch.zeros_like(base)
    # "+ 0.0" turns -0.0 (a zero gradient times -n) into +0.0
    out = torch.where(lmask, -grad * n_loss, torch.zeros((), dtype=torch.float64, device=m.device)) + 0.0
    bad = ~torch.isfinite(out)
    if bool(bad.any()):
        i, j = (int(x) for x in bad.nonzero()[0])
        raise FloatingPointError(f"effective_credit: non-finite gradient weight at rollout {i}, token {j}")
    return out.float().detach()


def effective_needs(recipe: Any) -> frozenset[str]:
    """Signals needed to show a recipe's effective credit: its credit method's plus its kernel's.

    Unlike `tokencredit.recipes.recipe_needs` this leaves out old_log_probs for the ratio and
    ref_log_probs for the KL term: at ratio 1 neither changes the gradient weight.
    """
    from tokencredit import credit, objectives

    needs = set(credit.get(recipe.credit).needs)
    if recipe.kernel != "reinforce":
        needs |= objectives.get_kernel(recipe.kernel).needs
    return frozenset(needs)


@dataclass(frozen=True)
class RecipeCredit:
    """A recipe's credit on one batch: A [N], Â [N,T] of its credit method, Â_eff [N,T], loss tokens [N,T]."""

    seq_advantages: Tensor
    token_advantages: Tensor
    effective: Tensor
    loss_mask: Tensor


def recipe_credit(
    recipe: Any,
    batch: RolloutBatch,
    *,
    seq_advantages: Tensor | None = None,
    loss_agg_mode: str = "token-mean",
) -> RecipeCredit:
    """A, Â and Â_eff of `recipe` (a `tokencredit.recipes.Recipe`) on `batch`, as the trainer forms them.

    A comes from the recipe's estimator (unless `seq_advantages` is given), Â from its credit
    method with its credit_params, the kernel arguments from `recipes.kernel_arguments` (S-trace's
    kept set from the batch entropy), and rows of truncated completions leave the loss when the
    recipe masks them (DAPO option). `loss_agg_mode` defaults to token-mean, under which per-token
    kernels give Â_eff = Â; pass recipe.loss_agg_mode to include the recipe's row weighting.
    """
    from tokencredit import advantages, credit
    from tokencredit.recipes import kernel_arguments

    if seq_advantages is None:
        seq_advantages = advantages.compute(
            recipe.advantage, batch.scores, batch.group_ids, **recipe.advantage_params
        )
    a_hat = credit.compute(recipe.credit, batch, seq_advantages, **recipe.credit_params)
    mask = batch.mask
    if recipe.mask_truncated and batch.truncated is not None:
        mask = mask & ~batch.truncated[:, None]
    kargs = kernel_arguments(recipe, batch) if recipe.kernel != "reinforce" else {}
    eff = effective_credit(
        a_hat,
        mask,
        kernel=recipe.kernel,
        kernel_args=kargs,
        loss_agg_mode=loss_agg_mode,
        norm_constant=recipe.norm_constant,
        old_log_probs=batch.old_log_probs,
    )
    from tokencredit.objectives import loss_token_mask

    keep = kargs.get("keep")
    lmask = loss_token_mask(mask, recipe.kernel, keep if isinstance(keep, Tensor) else None)
    return RecipeCredit(seq_advantages.detach().float(), a_hat, eff, lmask)

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
- GSPO gives every token of response i its row mean of Â (docs/spec/strace.md#worked-example: weight 1/|y| per token);
- P-trace gives token k the sum over later tokens t of e[t,k] Â_t (docs/spec/strace.md#worked-example:
  [0.385714, 0.271429, 0.209524, 0.133333] x T for Â = 1, lambda = 0.5);
- S-trace gives 0 outside the kept set and normalises by its size |M|.

The P-trace / S-trace kernels are our reconstruction of Mou et al. 2026 (arXiv 2605.05965) from
its abstract (see `tokencredit.objectives.traces`), so their effective credit is too.
Other aggregation modes rescale rows (e.g. seq-mean-token-mean by n_loss / (N_seq T_i)); the
KL term is left out (it is a regulariser, not credit).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from tokencredit.objectives.args import ObjectiveArgs
from tokencredit.objectives.policy import loss_token_mask, policy_loss

__all__ = ["effective_credit"]


def effective_credit(
    token_advantages: Tensor,
    mask: Tensor,
    args: ObjectiveArgs | None = None,
    *,
    old_log_probs: Tensor | None = None,
) -> Tensor:
    """Â_eff [N,T] float32 = -n_loss * dL/dlogp at ratio 1, detached, exactly 0 off the loss tokens.

    token_advantages: Â [N,T] (or A [N], broadcast) as the objective receives it; mask [N,T] the
    valid tokens. args: the objective (loss, ratio kernel with its prepared arguments from
    `tokencredit.objectives.prepare_kernel`, aggregation; its KL term is left out); None is
    PPO-clip with the per-token ratio under token-mean. old_log_probs [N,T] (optional) only sets the
    point at which the gradient is taken; the log-ratio is 0 there whatever its value, so zeros are
    used when it is None. Computed in float64.
    """
    args = replace(ObjectiveArgs() if args is None else args, kl_coef=0.0)
    m = mask.bool()
    adv = _checked_advantages(token_advantages, m)
    base = torch.zeros(m.shape, dtype=torch.float64, device=m.device)
    if old_log_probs is not None:
        base = torch.where(m, old_log_probs.detach().double(), base)
    log_prob = base.clone().requires_grad_(True)
    lmask = loss_token_mask(m, args.keep)
    n_loss = int(lmask.sum())
    if n_loss == 0:
        return torch.zeros(m.shape, dtype=torch.float32, device=m.device)
    with torch.enable_grad():
        value, _ = policy_loss(log_prob, base if args.uses_ratio else None, adv, m, args)
        (grad,) = torch.autograd.grad(value, log_prob, allow_unused=True)
    if grad is None:
        grad = torch.zeros_like(base)
    # "+ 0.0" turns -0.0 (a zero gradient times -n) into +0.0
    out = torch.where(lmask, -grad * n_loss, torch.zeros((), dtype=torch.float64, device=m.device)) + 0.0
    bad = ~torch.isfinite(out)
    if bool(bad.any()):
        i, j = (int(x) for x in bad.nonzero()[0])
        raise FloatingPointError(f"effective_credit: non-finite gradient weight at rollout {i}, token {j}")
    return out.float().detach()


def _checked_advantages(token_advantages: Tensor, m: Tensor) -> Tensor:
    """Â (or A, broadcast) as float64 [N,T], with a ValueError for a shape mismatch or a non-finite value."""
    if token_advantages.dim() not in (1, 2) or tuple(token_advantages.shape[:1]) != tuple(m.shape[:1]):
        raise ValueError(
            f"effective_credit: token_advantages must be [N,T] or [N] for a mask of shape {tuple(m.shape)}, "
            f"got {tuple(token_advantages.shape)}"
        )
    if token_advantages.dim() == 2 and token_advantages.shape != m.shape:
        raise ValueError(
            f"effective_credit: token_advantages shape {tuple(token_advantages.shape)} differs from mask {tuple(m.shape)}"
        )
    adv = token_advantages.detach().double()
    if adv.dim() == 1:
        adv = adv[:, None].expand(m.shape)
    bad = m & ~torch.isfinite(adv)
    if bool(bad.any()):
        i, j = (int(x) for x in bad.nonzero()[0])
        raise ValueError(f"effective_credit: non-finite advantage at rollout {i}, token {j}")
    return adv

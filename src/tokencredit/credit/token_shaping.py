"""Per-token advantage shapings: Â_t is a function of the token's own advantage and one old-policy signal.

entropy-advantage (Cheng et al. 2025, "Reasoning with Exploration: An Entropy Perspective",
arXiv 2506.14758, Eq. psi):

    Â_t = A_t + min(alpha * H_t, |A_t| / kappa),   H_t the old policy's entropy at t (detached),

alpha > 0, kappa > 1: the entropy term is non-negative and at most |A_t| / kappa, so it never flips
the sign of A_t (for A_t < 0, Â_t <= A_t (1 - 1/kappa) < 0) and it is 0 where A_t = 0. The paper's
alpha and kappa could not be read (only its abstract and secondary descriptions, which state the
constraints alpha > 0, kappa > 1, were reachable): the defaults alpha = 0.4, kappa = 2 are our
choice and should be tuned. The paper trains with clip-higher (eps_high 0.28), as the recipe does.

advantage-reweighting (Yang et al., NeurIPS 2025, "Do Not Let Low-Probability Tokens Over-Dominate
in RL for LLMs", arXiv 2505.12929):

    Â_t = (alpha * pi_old(y_t) + 1 - alpha) * A_t,   alpha = 0.3,

which damps the advantage of low-probability tokens (their gradients are the largest). The paper's
alpha = 0.3 is the default; the authors' released K&K logic-puzzle script
(github.com/zhyang2226/AR-Lopti, scripts/train_kklogic_AR_4x80GB.sh: REWEIGHT_K=0.2, REWEIGHT_TAU=0.8)
runs alpha = 0.2 with the same linear form (reweight_method "both_linear_normal").

Both take a sequence A [N] or a token-level A [N,T] (REINFORCE++, OTB).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tokencredit.batch import RolloutBatch
from tokencredit.credit.registry import register, token_view
from tokencredit.errors import ConfigError


@register(
    "entropy-advantage",
    needs=("entropy",),
    token_advantages=True,
    paper="Cheng et al. 2025, Reasoning with Exploration: An Entropy Perspective (arXiv 2506.14758)",
    reconstruction="the paper's text beyond its abstract was not reachable: the formula as a follow-up (CEEH) "
    "restates it; alpha = 0.4 and kappa = 2 are our choice",
)
def entropy_advantage(
    batch: RolloutBatch, advantages: Tensor, alpha: float = 0.4, kappa: float = 2.0
) -> Tensor:
    """Â_t = A_t + min(alpha H_t, |A_t| / kappa) with the old policy's entropy H_t (detached)."""
    if not alpha > 0:
        raise ConfigError(f"entropy-advantage: alpha must be > 0, got {alpha}")
    if not kappa > 1:
        raise ConfigError(f"entropy-advantage: kappa must be > 1 (the bonus must not reach |A|), got {kappa}")
    a = token_view(batch, advantages)
    entropy = batch.signal("entropy", "credit method 'entropy-advantage'")
    bonus = torch.minimum(alpha * entropy.detach().float().clamp(min=0), a.abs() / kappa)
    return a + bonus


@register(
    "advantage-reweighting",
    needs=("old_log_probs",),
    token_advantages=True,
    paper="Yang et al. 2025, Advantage Reweighting, NeurIPS (arXiv 2505.12929)",
)
def advantage_reweighting(batch: RolloutBatch, advantages: Tensor, alpha: float = 0.3) -> Tensor:
    """Â_t = (alpha pi_old(y_t) + 1 - alpha) A_t: low-probability tokens carry less of the advantage."""
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"advantage-reweighting: alpha must be in [0, 1], got {alpha}")
    a = token_view(batch, advantages)
    prob = batch.signal("old_log_probs", "credit method 'advantage-reweighting'").detach().float().exp()
    return (alpha * prob + (1.0 - alpha)) * a

"""GRPO's credit: every valid token gets its rollout's advantage (the baseline every other method reshapes).

Shao et al. 2024, DeepSeekMath (arXiv 2402.03300): the GRPO objective weights each token's ratio
term with the sequence's group advantage, Â[i,t] = A_i. A token-level A [N,T] (REINFORCE++, OTB)
passes unchanged, so `uniform` is also how a token-level estimator reaches the objective.
"""

from __future__ import annotations

from torch import Tensor

from tokencredit.batch import RolloutBatch
from tokencredit.credit.registry import register, token_view

__all__ = ["uniform"]


@register("uniform", paper="GRPO, Shao et al. 2024 (arXiv 2402.03300)", token_advantages=True)
def uniform(batch: RolloutBatch, advantages: Tensor) -> Tensor:
    """Every valid token gets its rollout's sequence advantage: Â[i,t] = A_i (a token-level A passes unchanged).

    advantages: A [N] or A [N,T]; returns Â [N,T] (a copy: callers may write into it).
    """
    return token_view(batch, advantages).clone()

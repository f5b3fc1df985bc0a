"""Credit from Monte-Carlo values of the policy's own prefixes (expensive: the engine samples continuations).

- `oracle`: the token-level ground-truth advantage A*_t = V(s_{t+1}) - V(s_t) as Â (issue 17's
  oracle recipe: what every token-credit method tries to estimate, measured).
- `vineppo`: VinePPO's step-level advantages (Kazemnejad et al., "VinePPO: Refining Credit Assignment
  in RL Training of LLMs", ICML 2025, arXiv 2410.01679): V at reasoning-step boundaries (line breaks
  by default) from K continuations each; each step's V(end) - V(start) on all its tokens.

Both read a signal the engine computes by sampling (`tokencredit.oracle.mc_signals`, which documents
the estimator, its standard errors and the delta skip) and replace the group advantage A entirely:
the Monte-Carlo value of the prompt is the baseline. A is still computed (it is logged).
"""

from __future__ import annotations

from torch import Tensor

from tokencredit.batch import RolloutBatch
from tokencredit.credit.registry import register

__all__ = ["oracle", "vineppo"]


@register("oracle", needs=("mc_advantages",), paper="Monte-Carlo token advantages A* (tokencredit's own)")
def oracle(batch: RolloutBatch, advantages: Tensor) -> Tensor:
    """Â[i,t] = A*_{i,t} = V(s_{t+1}) - V(s_t), Monte-Carlo values of the policy (0 where the delta rule skipped)."""
    return batch.signal("mc_advantages", "credit method 'oracle'").float()


@register(
    "vineppo",
    needs=("mc_step_advantages",),
    paper="Kazemnejad et al. 2025, VinePPO, ICML (arXiv 2410.01679)",
    reconstruction="the released code's step splitting where it does not carry over: a step ends at each "
    "oracle.delimiter (line break), the final answer line is a step of its own, the first 20 boundaries "
    "are valued (docs/methods.md)",
)
def vineppo(batch: RolloutBatch, advantages: Tensor) -> Tensor:
    """Â[i,t] = V(end of t's step) - V(start of t's step), Monte-Carlo values at line breaks."""
    return batch.signal("mc_step_advantages", "credit method 'vineppo'").float()

"""Group advantages A [N] (or token-level A [N,T]) from rewards: the estimator registry and every estimator.

`core`: the registry (`ESTIMATORS`, `estimate`), GRPO / RLOO / Dr.GRPO and the group statistics they
share; `estimators`: the estimators that read more of the batch (REINFORCE++, ReMax, OPO, GPG,
GRPO pass@k, the optimal token baseline), registered when this package is imported.
"""

from tokencredit.advantages import estimators
from tokencredit.advantages.core import (
    ESTIMATORS,
    Estimator,
    compute,
    consecutive_group_ids,
    dr_grpo,
    estimate,
    get_estimator,
    grpo,
    grpo_batch,
    register_estimator,
    rloo,
)

__all__ = [
    "ESTIMATORS",
    "Estimator",
    "compute",
    "consecutive_group_ids",
    "dr_grpo",
    "estimate",
    "estimators",
    "get_estimator",
    "grpo",
    "grpo_batch",
    "register_estimator",
    "rloo",
]

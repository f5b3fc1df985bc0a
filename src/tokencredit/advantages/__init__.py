"""Group advantages A [N] (or token-level A [N,T]) from rewards: the estimator registry and every estimator.

`core`: the registry (`ESTIMATORS`, `estimate`), GRPO / RLOO / Dr.GRPO and the group statistics they
share; `estimators`: the estimators that read more of the batch (REINFORCE++, ReMax, OPO, GPG,
GRPO pass@k, the optimal token baseline). Every public module of this package is imported below,
sorted by name, and registers its estimators on import, so a new module needs no import list.
"""

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
from tokencredit.registry import import_submodules as _import_submodules

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
    "register_estimator",
    "rloo",
]

_import_submodules(__name__, __path__)  # `estimators` (and any new module) registers here, sorted by name

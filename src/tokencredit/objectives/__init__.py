"""Policy objectives: ratio kernels, losses, KL, aggregation, and the effective credit they give.

`kernels` (per-token, GSPO) and `traces` (P-trace, S-trace, a reconstruction; GRPO(lambda)) map
log-ratios to log importance weights; `losses` holds the loss registry with PPO-clip and
REINFORCE, `losses_verl` verl's other losses (CISPO, SAPO, Clip-Cov, KL-Cov, GMPO, DPPO) and
`losses_trl` TRL's VESPO; `args` holds `ObjectiveArgs`, the typed settings of one objective;
`policy` composes the pieces into `policy_loss`; `effective` measures the per-token gradient
weight an objective gives each token at the on-policy point.

Every public module of this package is imported below, sorted by name, and registers its kernels and
losses on import (`tokencredit.registry.import_submodules`), so a new ``losses_*.py`` needs no list.
"""

from tokencredit.objectives.args import AGG_MODES, KL_TYPES, ObjectiveArgs
from tokencredit.objectives.effective import effective_credit
from tokencredit.objectives.kernels import (
    KERNELS,
    Kernel,
    Preparation,
    get_kernel,
    kernel_parameters,
    prepare_kernel,
    register_kernel,
    sequence_log_ratio,
)
from tokencredit.objectives.losses import (
    LOSSES,
    Loss,
    LossInputs,
    clipped_token_loss,
    get_loss,
    register_loss,
)
from tokencredit.objectives.losses_trl import vespo
from tokencredit.objectives.losses_verl import cispo, clip_cov, dppo_kl, dppo_tv, gmpo, kl_cov, sapo
from tokencredit.objectives.policy import aggregate, is_per_token, kl_penalty, loss_token_mask, policy_loss
from tokencredit.objectives.traces import (
    DECAYS,
    GRPO_LAMBDA_TRACES,
    KEPT_SET,
    causal_decay_filter,
    grpo_lambda_log_weights,
    kept_set,
    trace_log_weights,
)
from tokencredit.registry import import_submodules as _import_submodules

__all__ = [
    "AGG_MODES",
    "DECAYS",
    "GRPO_LAMBDA_TRACES",
    "KEPT_SET",
    "KERNELS",
    "KL_TYPES",
    "Kernel",
    "LOSSES",
    "Loss",
    "LossInputs",
    "ObjectiveArgs",
    "Preparation",
    "aggregate",
    "causal_decay_filter",
    "cispo",
    "clip_cov",
    "clipped_token_loss",
    "dppo_kl",
    "dppo_tv",
    "effective_credit",
    "get_kernel",
    "get_loss",
    "gmpo",
    "grpo_lambda_log_weights",
    "is_per_token",
    "kept_set",
    "kernel_parameters",
    "kl_cov",
    "kl_penalty",
    "loss_token_mask",
    "policy_loss",
    "prepare_kernel",
    "register_kernel",
    "register_loss",
    "sapo",
    "sequence_log_ratio",
    "trace_log_weights",
    "vespo",
]

_import_submodules(__name__, __path__)

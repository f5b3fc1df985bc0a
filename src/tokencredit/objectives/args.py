"""`ObjectiveArgs`: every setting of `policy_loss` besides the batch, typed, validated and read-only.

One value carries the policy loss and its hyperparameters, the ratio kernel and its prepared
arguments (S-trace's per-row kept set included), the aggregation and the KL term, so a recipe
builds it once (`Recipe.objective_args`) and every engine passes it on whole: the trainer cuts it
to a micro-batch with `rows`, `TokenCredit.effective` replaces fields, the verl plugin builds it
from verl's actor config. Nothing is split by name downstream.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from torch import Tensor

from tokencredit.errors import ConfigError, closest
from tokencredit.objectives.kernels import check_arguments, get_kernel
from tokencredit.objectives.losses import LOSSES, get_loss

__all__ = ["AGG_MODES", "KL_TYPES", "ObjectiveArgs"]

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_TYPES = ("k1", "k2", "k3")


@dataclass(frozen=True)
class ObjectiveArgs:
    """The settings of one policy objective (`tokencredit.objectives.policy_loss`); checked on construction.

    Fields:

    - loss: a registered policy loss (`tokencredit.objectives.LOSSES`), e.g. "ppo-clip", "reinforce", "cispo".
    - loss_params: the loss's hyperparameters by name (e.g. ppo-clip's eps_low, eps_high, dual_clip);
      every key must be one of the loss's keyword defaults, an absent one takes its default.
    - kernel: a registered ratio kernel (`tokencredit.objectives.KERNELS`), read only by a loss that
      uses an importance ratio; a loss without one requires "token" and no kernel_args.
    - kernel_args: the kernel function's keyword arguments as `prepare_kernel` returns them (lam,
      decay, ...), possibly per-row tensors [N,T] computed from the batch (S-trace's kept set `keep`).
    - loss_agg_mode: one of `AGG_MODES` (verl's names), how per-token losses become one scalar.
    - norm_constant: the divisor of seq-mean-token-sum-norm (None: the response length T of the batch).
    - kl_coef: the weight of the per-token KL to the reference policy (0: no KL term, no reference needed).
    - kl_type: the KL estimator, one of `KL_TYPES` (k1, k2, k3 = verl's low_var_kl).

    The two mappings are stored read-only. `rows` cuts the per-row tensors to a micro-batch.
    """

    loss: str = "ppo-clip"
    loss_params: Mapping[str, Any] = field(default_factory=dict)
    kernel: str = "token"
    kernel_args: Mapping[str, Any] = field(default_factory=dict)
    loss_agg_mode: str = "token-mean"
    norm_constant: float | None = None
    kl_coef: float = 0.0
    kl_type: str = "k3"

    def __post_init__(self) -> None:
        spec = get_loss(self.loss)
        LOSSES.check_params(self.loss, self.loss_params)
        get_kernel(self.kernel)
        if spec.uses_ratio:
            check_arguments(self.kernel, self.kernel_args)
        elif self.kernel != "token" or self.kernel_args:
            extra = f"and its arguments {', '.join(sorted(self.kernel_args))} " if self.kernel_args else ""
            raise ConfigError(
                f"policy loss {self.loss!r} uses no importance ratio: ratio kernel {self.kernel!r} {extra}would be ignored"
            )
        if self.loss_agg_mode not in AGG_MODES:
            mode = self.loss_agg_mode
            raise ConfigError(
                f"unknown loss_agg_mode {mode!r}{closest(mode, AGG_MODES)}; one of {', '.join(AGG_MODES)}"
            )
        if self.kl_type not in KL_TYPES:
            raise ConfigError(f"kl_type must be 'k1', 'k2' or 'k3', got {self.kl_type!r}")
        object.__setattr__(self, "loss_params", MappingProxyType(dict(self.loss_params)))
        object.__setattr__(self, "kernel_args", MappingProxyType(dict(self.kernel_args)))

    @property
    def uses_ratio(self) -> bool:
        """True when the loss reads importance weights (it needs old log-probs and uses the kernel)."""
        return get_loss(self.loss).uses_ratio

    @property
    def keep(self) -> Tensor | None:
        """bool [N,T]: the kept token set of a kept-set kernel (S-trace), or None when only valid tokens matter."""
        if not (self.uses_ratio and get_kernel(self.kernel).uses_keep):
            return None
        keep = self.kernel_args.get("keep")
        return keep if isinstance(keep, Tensor) else None

    def rows(self, rows: Tensor | slice | None) -> ObjectiveArgs:
        """These arguments with every per-row tensor of kernel_args cut to `rows` (a micro-batch); None: all rows."""
        if rows is None or not any(isinstance(v, Tensor) for v in self.kernel_args.values()):
            return self
        return replace(
            self,
            kernel_args={k: v[rows] if isinstance(v, Tensor) else v for k, v in self.kernel_args.items()},
        )

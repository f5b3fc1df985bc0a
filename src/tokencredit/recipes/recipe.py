"""`Recipe`: one choice of group baseline, credit method, loss and ratio kernel, with their hyperparameters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tokencredit import objectives
from tokencredit.errors import ConfigError, closest

__all__ = ["CLIP_FIELDS", "Recipe"]

CLIP_FIELDS = ("eps_low", "eps_high", "dual_clip")


@dataclass(frozen=True)
class Recipe:
    name: str
    paper: str
    advantage: str = "grpo"  # tokencredit.advantages.ESTIMATORS
    advantage_params: dict[str, Any] = field(default_factory=dict)
    credit: str = "uniform"  # tokencredit.credit.CREDIT_METHODS
    credit_params: dict[str, Any] = field(default_factory=dict)
    loss: str = "ppo-clip"  # tokencredit.objectives.LOSSES
    loss_params: dict[str, Any] = field(default_factory=dict)  # the loss's own, besides the clip range
    kernel: str = "token"  # tokencredit.objectives.KERNELS (read only by losses that use a ratio)
    kernel_params: dict[str, Any] = field(default_factory=dict)
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None
    loss_agg_mode: str = "token-mean"
    norm_constant: float | None = None  # seq-mean-token-sum-norm; None = max_new_tokens
    kl_coef: float = 0.0
    kl_type: str = "k3"
    dynamic_sampling: bool = False  # DAPO: drop groups whose rewards are all equal, resample
    overlong_buffer: int = 0  # DAPO overlong shaping buffer L_cache in tokens (0 = off)
    mask_truncated: bool = False  # DAPO: truncated completions get no loss
    placebo: str = "none"  # tokencredit.credit.placebo.PLACEBOS: R's update size with random placement
    zero_tail: bool = False  # Â = 0 on the task's reward-irrelevant tail (tokencredit.credit.tail)
    notes: str = ""
    kind: str = "recipe"  # "recipe": a row of the table; "method": a credit method on its own

    def with_overrides(self, **changes: Any) -> Recipe:
        """A copy with fields replaced; dict fields are merged key by key (e.g. kernel_params={"lam": 0.9})."""
        unknown = [k for k in changes if k not in self.__dataclass_fields__]
        if unknown:
            raise ConfigError(
                f"recipe has no field {unknown[0]!r}{closest(unknown[0], self.__dataclass_fields__)}"
            )
        # values from a config file: their types are checked by `validate`, after the replace
        merged: dict[str, Any] = {
            k: {**getattr(self, k), **v}
            if isinstance(v, Mapping) and isinstance(getattr(self, k), dict)
            else v
            for k, v in changes.items()
        }
        return replace(self, **merged)

    def with_method_baseline(
        self, advantage: str, advantage_params: Mapping[str, Any] | None = None
    ) -> Recipe:
        """For a credit method on its own, the engine's group baseline; a table recipe keeps its own."""
        if self.kind != "method":
            return self
        return replace(self, advantage=advantage, advantage_params=dict(advantage_params or {}))

    def loss_arguments(self) -> dict[str, Any]:
        """The loss's hyperparameters: the clip range fields it takes, then loss_params."""
        takes = objectives.get_loss(self.loss).defaults
        return {**{k: getattr(self, k) for k in CLIP_FIELDS if k in takes}, **self.loss_params}

    def objective_args(
        self, kernel_args: Mapping[str, Any] | None = None, *, max_response_length: int | None = None
    ) -> objectives.ObjectiveArgs:
        """The objective's settings (`objectives.policy_loss`): the one place a recipe becomes them.

        kernel_args: the ratio kernel's prepared arguments (`objectives.prepare_kernel` on the batch;
        None: the kernel function's own defaults), dropped for a loss without a ratio.
        max_response_length: the normaliser of seq-mean-token-sum-norm when norm_constant is unset.
        """
        return objectives.ObjectiveArgs(
            loss=self.loss,
            loss_params=self.loss_arguments(),
            kernel=self.kernel,
            kernel_args=dict(kernel_args or {}) if self.uses_ratio else {},
            loss_agg_mode=self.loss_agg_mode,
            norm_constant=self.norm_constant or max_response_length,
            kl_coef=self.kl_coef,
            kl_type=self.kl_type,
        )

    @property
    def uses_ratio(self) -> bool:
        return objectives.get_loss(self.loss).uses_ratio

    @property
    def per_token(self) -> bool:
        """True when the objective's on-policy gradient weight of each token is its Â (see objectives.effective)."""
        return objectives.is_per_token(self.loss, self.kernel)

    def objective_label(self) -> str:
        """One line for tables: the loss, the kernel and clip when it uses a ratio, the aggregation, KL."""
        takes_clip = "eps_low" in objectives.get_loss(self.loss).defaults
        clip = f"clip {self.eps_low:g}/{self.eps_high:g}"
        if self.loss == "ppo-clip":
            text = f"{self.kernel}, {clip}, {self.loss_agg_mode}"
        elif self.loss == "reinforce":
            text = f"REINFORCE, {self.loss_agg_mode}"
        elif self.uses_ratio:
            text = (
                f"{self.loss} ({self.kernel} ratio{', ' + clip if takes_clip else ''}), {self.loss_agg_mode}"
            )
        else:
            text = f"{self.loss}, {self.loss_agg_mode}"
        return text + (f", KL {self.kl_coef:g}" if self.kl_coef else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

"""Ratio kernels: per-token log-ratios l = log pi - log pi_old [N,T] -> log importance weights log w [N,T].

"token" (PPO/GRPO/DAPO, log w_t = l_t), "gspo" (log w_t = mean_k l_k, GSPO's sequence ratio) and
"gspo-token" (sg(mean l) + l_t - sg(l_t)) live here; the eligibility-trace kernels (P-trace,
S-trace, accumulating) in `traces.py`.

A kernel's hyperparameters are its function's keyword defaults (e.g. lam, decay). A kernel that
needs a per-batch input computed from the rollouts (S-trace's kept token set) declares a
`Preparation`: a function of the batch with its own parameters (keep_ratio, scope) that returns
the kernel's extra arguments (keep). `prepare_kernel` is the one place that runs it, so the
trainer, the reports and the plugins all prepare a kernel the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from torch import Tensor

from tokencredit.batch import RolloutBatch
from tokencredit.errors import ConfigError
from tokencredit.registry import Registry, keyword_defaults

__all__ = [
    "KERNELS",
    "Kernel",
    "Preparation",
    "get_kernel",
    "kernel_parameters",
    "prepare_kernel",
    "register_kernel",
    "sequence_log_ratio",
]

KernelFn = Callable[..., Tensor]
# `register_kernel` hands back the function it was given, with its own signature (not widened to KernelFn).
F = TypeVar("F", bound=KernelFn)


@dataclass(frozen=True)
class Preparation:
    """Kernel arguments computed once per batch from the old policy's signals (detached)."""

    fn: Callable[..., dict[str, Tensor]]  # fn(batch, **params) -> {argument name: tensor}
    needs: frozenset[str]  # signals it reads (names from tokencredit.batch.SIGNALS)
    provides: frozenset[str]  # the kernel arguments it fills in (e.g. {"keep"})

    @property
    def defaults(self) -> dict[str, Any]:
        return keyword_defaults(self.fn, skip=1)


@dataclass(frozen=True)
class Kernel:
    name: str
    fn: KernelFn  # fn(log_ratio [N,T], mask [N,T] bool, **arguments) -> log_w [N,T]
    per_token: bool  # log w_t depends on l_t alone: the on-policy gradient weight of token t is Â_t
    prepare: Preparation | None = None
    arguments: Mapping[str, Any] = field(default_factory=dict)  # every keyword argument of fn
    reconstruction: str = ""  # what is our reading rather than the source's ("": follows the source)

    @property
    def defaults(self) -> dict[str, Any]:
        """The user-facing hyperparameters: fn's own (minus what the preparation fills in) and the preparation's."""
        provided = self.prepare.provides if self.prepare else frozenset()
        own = {k: v for k, v in self.arguments.items() if k not in provided}
        return {**own, **(self.prepare.defaults if self.prepare else {})}

    @property
    def needs(self) -> frozenset[str]:
        return self.prepare.needs if self.prepare else frozenset()

    @property
    def uses_keep(self) -> bool:
        """True when only the tokens of a kept set carry a loss term (S-trace)."""
        return self.prepare is not None and "keep" in self.prepare.provides


KERNELS: Registry[Kernel] = Registry("ratio kernel")


def register_kernel(
    name: str, *, per_token: bool = False, prepare: Preparation | None = None, reconstruction: str = ""
) -> Callable[[F], F]:
    """Register `fn(log_ratio, mask, **arguments) -> log_w`; its keyword defaults are its hyperparameters.

    reconstruction: what in the kernel is our reading rather than the source's ("" when it follows it)."""

    def deco(fn: F) -> F:
        KERNELS.add(Kernel(name, fn, per_token, prepare, keyword_defaults(fn, skip=2), reconstruction))
        return fn

    return deco


def get_kernel(name: str) -> Kernel:
    return KERNELS.get(name)


def kernel_parameters(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The kernel's hyperparameters: its defaults updated by `params` (unknown keys: ConfigError, closest name)."""
    kernel = get_kernel(name)
    KERNELS.check_params(name, params, allowed=kernel.defaults)
    return {**kernel.defaults, **params}


def prepare_kernel(name: str, batch: RolloutBatch, params: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments for the kernel function from its hyperparameters and, through its
    preparation hook, the batch (e.g. S-trace: keep_ratio, scope -> the kept-token mask `keep`)."""
    kernel = get_kernel(name)
    full = kernel_parameters(name, params)
    if kernel.prepare is None:
        return full
    prep_keys = kernel.prepare.defaults
    batch.require(kernel.prepare.needs, f"ratio kernel {name!r}")
    out = {k: v for k, v in full.items() if k not in prep_keys}
    out.update(kernel.prepare.fn(batch, **{k: full[k] for k in prep_keys}))
    return out


def check_arguments(name: str, arguments: Mapping[str, Any]) -> None:
    """Raise ConfigError for an argument the kernel function does not take (a prepared one included)."""
    KERNELS.check_params(name, arguments, allowed=get_kernel(name).arguments)


def sequence_log_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """[N] GSPO's log s_i = mean over valid tokens of l (0 for an empty response)."""
    m = mask.to(log_ratio.dtype)
    return (log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1)


@register_kernel("token", per_token=True)
def _token_kernel(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """Per-token ratio (PPO/GRPO/DAPO): log w_t = l_t."""
    return log_ratio


@register_kernel("gspo")
def _gspo_kernel(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """GSPO sequence ratio: log w_t = log s_i = mean_k l_k for every token of response i."""
    return sequence_log_ratio(log_ratio, mask)[:, None].expand_as(log_ratio)


@register_kernel("gspo-token", per_token=True)
def _gspo_token_kernel(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """GSPO-token: log w_t = sg(log s_i) + l_t - sg(l_t); GSPO's value, per-token gradient path."""
    seq = sequence_log_ratio(log_ratio, mask).detach()
    return seq[:, None] + log_ratio - log_ratio.detach()


def needs_keep(kernel: str, keep: Tensor | None) -> Tensor:
    """`keep`, or a ConfigError saying how a kept-set kernel gets it."""
    if keep is None:
        raise ConfigError(
            f"ratio kernel {kernel!r} needs the kept-token mask `keep` (objectives.prepare_kernel builds it "
            "from the batch entropy; or tokencredit.credit.entropy.top_entropy_mask(entropy, mask, keep_ratio))"
        )
    return keep

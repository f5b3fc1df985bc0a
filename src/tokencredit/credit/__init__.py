"""Registry of token credit methods.

A credit method maps a `RolloutBatch` and the sequence-level group advantages A[N] to a
per-token advantage Â[N,T]. Each method declares the per-token signals it needs (names from
`tokencredit.batch.SIGNALS`) so that the trainer and the plugins compute exactly those in the
old-policy pass, and nothing else.

    @register("uniform", paper="GRPO (Shao et al. 2024)")
    def uniform(batch, advantages):
        return advantages[:, None].expand_as(batch.mask)

`compute(name, batch, advantages, **params)` is the one entry point callers use: it checks
the signals, merges the method's defaults with `params` (unknown keys are an error), zeroes
masked positions, detaches, and refuses non-finite output.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from tokencredit.batch import SIGNALS, RolloutBatch
from tokencredit.errors import ConfigError
from tokencredit.registry import Registry, keyword_defaults

__all__ = ["CREDIT_METHODS", "ConfigError", "CreditMethod", "compute", "get", "register", "uniform"]

CreditFn = Callable[..., Tensor]


@dataclass(frozen=True)
class CreditMethod:
    name: str
    fn: CreditFn
    needs: frozenset[str]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    paper: str = ""
    description: str = ""
    requires_lora: bool = False


CREDIT_METHODS: Registry[CreditMethod] = Registry("credit method")


def register(
    name: str,
    *,
    needs: tuple[str, ...] = (),
    paper: str = "",
    description: str = "",
    requires_lora: bool = False,
) -> Callable[[CreditFn], CreditFn]:
    """Register `fn(batch, advantages, **params) -> Â[N,T]`; its keyword defaults are its hyperparameters."""
    unknown = [n for n in needs if n not in SIGNALS]
    if unknown:
        raise ValueError(f"credit method {name!r}: unknown signal(s) {unknown}; known: {sorted(SIGNALS)}")

    def deco(fn: CreditFn) -> CreditFn:
        doc = description or (fn.__doc__ or "").strip().split("\n")[0]
        defaults = keyword_defaults(fn, skip=2)
        CREDIT_METHODS.add(CreditMethod(name, fn, frozenset(needs), defaults, paper, doc, requires_lora))
        return fn

    return deco


def get(name: str) -> CreditMethod:
    return CREDIT_METHODS.get(name)


def compute(name: str, batch: RolloutBatch, advantages: Tensor, **params: Any) -> Tensor:
    """Â[N,T] for method `name`: float32, detached, exactly 0 where `batch.mask` is False."""
    method = get(name)
    CREDIT_METHODS.check_params(name, params)
    if tuple(advantages.shape) != (batch.num_rollouts,):
        raise ValueError(
            f"credit method {name!r}: advantages must have shape ({batch.num_rollouts},), got {tuple(advantages.shape)}"
        )
    batch.require(method.needs, f"credit method {name!r}")
    with torch.no_grad():
        out = method.fn(batch, advantages.detach().float(), **params)
        out = torch.where(batch.mask, out.float(), torch.zeros((), dtype=torch.float32, device=out.device))
    bad = ~torch.isfinite(out)
    if bool(bad.any()):
        i, j = (int(x) for x in bad.nonzero()[0])
        raise FloatingPointError(f"credit method {name!r} produced a non-finite advantage at rollout {i}, token {j}")
    return out.detach()


@register("uniform", paper="GRPO, Shao et al. 2024 (arXiv 2402.03300)")
def uniform(batch: RolloutBatch, advantages: Tensor) -> Tensor:
    """Every valid token gets its rollout's sequence advantage: Â[i,t] = A_i."""
    return advantages[:, None].expand(batch.mask.shape).clone()


# Built-in methods register themselves on import.
for _mod in ("entropy", "ktae", "delta", "arca", "gcpo"):
    importlib.import_module(f"tokencredit.credit.{_mod}")

"""The registry of token credit methods: `CreditMethod`, `register`, `get`, `compute`.

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

Token-level advantages. A token-level estimator (REINFORCE++, OTB; `tokencredit.advantages`)
gives A [N,T] instead of A [N]. Only the methods registered with ``token_advantages=True`` take
it: `uniform` (Â = A) and the per-token shapings that are functions of each token's own A
(entropy-advantage, advantage-reweighting). The others are defined on a sequence advantage
(KTAE adds a per-id value to A_i, DelTA and ARCA redistribute A_i over the response, ...), so
`compute` refuses A [N,T] for them with a ConfigError, and `tokencredit.recipes.validate`
refuses such a recipe before any model loads.

Data-parallel ranks. A batch whose `shard` is set holds one rank's rows of a batch split across
ranks; the methods with whole-batch statistics (delta, entropy-80-20, ktae, cw-grpo) reduce them over the
ranks with `tokencredit.distributed`, the others are functions of each response alone, so every
rank gets its rows of the single-process Â (tests/test_distributed.py, 2 gloo processes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch import Tensor

from tokencredit.batch import REDUCED_SIGNALS, SIGNALS, RolloutBatch
from tokencredit.errors import ConfigError
from tokencredit.registry import Registry, keyword_defaults

__all__ = ["CREDIT_METHODS", "CreditFn", "CreditMethod", "compute", "get", "register", "token_view"]

# fn(batch, advantages, **hyperparameters) -> Â [N,T]; the hyperparameters differ per method, hence `...`.
CreditFn = Callable[..., Tensor]
# `register` hands back the function it was given, with its own signature (not widened to CreditFn).
F = TypeVar("F", bound=CreditFn)


@dataclass(frozen=True)
class CreditMethod:
    """One registered method: `fn(batch, advantages, **defaults) -> Â [N,T]` and what it reads.

    needs: the per-token signals fn reads (names from `tokencredit.batch.SIGNALS`); defaults: fn's
    keyword defaults, its hyperparameters; paper: what it implements; description: one line for listings
    (fn's first docstring line unless given); requires_lora: it reads a LoRA adapter's base pass;
    reconstruction: what in it is our reading rather than the source's algorithm ("": it follows the
    paper or its released code), shown by the documentation's catalog.
    """

    name: str
    fn: CreditFn
    needs: frozenset[str]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    paper: str = ""
    description: str = ""
    requires_lora: bool = False
    token_advantages: bool = False  # also accepts a token-level A [N,T] (see the module docstring)
    reduced: str | None = None  # a REDUCED_SIGNALS name that stands in for `needs` when the batch carries it
    reconstruction: str = ""


CREDIT_METHODS: Registry[CreditMethod] = Registry("credit method")


def register(
    name: str,
    *,
    needs: tuple[str, ...] = (),
    paper: str = "",
    description: str = "",
    requires_lora: bool = False,
    token_advantages: bool = False,
    reduced: str | None = None,
    reconstruction: str = "",
) -> Callable[[F], F]:
    """Register `fn(batch, advantages, **params) -> Â[N,T]`; its keyword defaults are its hyperparameters.

    `advantages` is A [N] float32, or A [N,T] when `token_advantages` (the method takes a token-level A).
    `reduced`: the signal of `tokencredit.batch.REDUCED_SIGNALS` an engine may hand over instead of the
    hidden states in `needs` (computed where they live); fn must then read it. `reconstruction`: what in
    the method is our reading rather than the source's ("" when it follows the paper or released code)."""
    unknown = [n for n in needs if n not in SIGNALS]
    if unknown:
        raise ValueError(f"credit method {name!r}: unknown signal(s) {unknown}; known: {sorted(SIGNALS)}")
    if reduced is not None and reduced not in REDUCED_SIGNALS:
        raise ValueError(f"credit method {name!r}: reduced={reduced!r} is not one of {REDUCED_SIGNALS}")

    def deco(fn: F) -> F:
        doc = description or (fn.__doc__ or "").strip().split("\n")[0]
        defaults = keyword_defaults(fn, skip=2)
        CREDIT_METHODS.add(
            CreditMethod(
                name,
                fn,
                frozenset(needs),
                defaults,
                paper,
                doc,
                requires_lora,
                token_advantages,
                reduced,
                reconstruction,
            )
        )
        return fn

    return deco


def get(name: str) -> CreditMethod:
    """The registered method `name` (ConfigError naming the closest names for an unknown one)."""
    return CREDIT_METHODS.get(name)


def compute(name: str, batch: RolloutBatch, advantages: Tensor, **params: Any) -> Tensor:
    """Â[N,T] for method `name`: float32, detached, exactly 0 where `batch.mask` is False.

    advantages: A [N], or a token-level A [N,T] for a method registered with token_advantages=True."""
    method = get(name)
    CREDIT_METHODS.check_params(name, params)
    shape = tuple(advantages.shape)
    if shape == tuple(batch.mask.shape) and advantages.dim() == 2:
        if not method.token_advantages:
            raise ConfigError(
                f"credit method {name!r} assigns a sequence advantage A [N] to tokens; it cannot take a token-level "
                f"A [N,T] (from REINFORCE++ or OTB). Use credit 'uniform' or a per-token shaping "
                f"({', '.join(m for m, c in CREDIT_METHODS.items() if c.token_advantages)})"
            )
    elif shape != (batch.num_rollouts,):
        raise ValueError(
            f"credit method {name!r}: advantages must have shape ({batch.num_rollouts},)"
            f"{' or ' + str(tuple(batch.mask.shape)) if method.token_advantages else ''}, got {shape}"
        )
    # a batch that carries the method's reduced signal needs none of the hidden states it stands in for
    reduced = (
        method.reduced if method.reduced is not None and getattr(batch, method.reduced) is not None else None
    )
    batch.require((reduced,) if reduced is not None else method.needs, f"credit method {name!r}")
    with torch.no_grad():
        out = method.fn(batch, advantages.detach().float(), **params)
        out = torch.where(batch.mask, out.float(), torch.zeros((), dtype=torch.float32, device=out.device))
    bad = ~torch.isfinite(out)
    if bool(bad.any()):
        i, j = (int(x) for x in bad.nonzero()[0])
        raise FloatingPointError(
            f"credit method {name!r} produced a non-finite advantage at rollout {i}, token {j}"
        )
    return out.detach()


def token_view(batch: RolloutBatch, advantages: Tensor) -> Tensor:
    """A as [N,T]: a token-level A unchanged, a sequence A [N] broadcast over the response."""
    return advantages if advantages.dim() == 2 else advantages[:, None].expand(batch.mask.shape)

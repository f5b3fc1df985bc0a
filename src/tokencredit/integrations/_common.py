"""What the verl and TRL plugins share: resolving a credit name and computing token advantages.

A plugin is configured with one name: a registered credit method (`tokencredit.credit`) or a
recipe (`tokencredit.recipes`). `resolve` turns it into a `CreditSpec` (group baseline, credit
method, ratio kernel, each with its hyperparameters); `token_advantages` computes Â[N,T] from a
`RolloutBatch` exactly as the core does (advantages.compute, then credit.compute).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from tokencredit import advantages as adv_mod
from tokencredit import credit as credit_mod
from tokencredit import objectives
from tokencredit.batch import RolloutBatch
from tokencredit.credit.entropy import top_entropy_mask
from tokencredit.errors import ConfigError, closest
from tokencredit.recipes import RECIPES

# Kernels whose objective the engines' own losses already implement (verl: vanilla / gspo; TRL:
# importance_sampling_level="token" / "sequence"), so the plugins only add the trace kernels.
ENGINE_KERNELS = ("token", "gspo", "gspo-token", "reinforce")


@dataclass(frozen=True)
class CreditSpec:
    """One resolved plugin configuration (a credit method or a recipe, plus overrides)."""

    name: str  # the name the user gave (method or recipe)
    from_recipe: bool
    advantage: str = "grpo"
    advantage_params: Mapping[str, Any] = field(default_factory=dict)
    credit: str = "uniform"
    credit_params: Mapping[str, Any] = field(default_factory=dict)
    kernel: str = "token"
    kernel_params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def keep_params(self) -> dict[str, Any] | None:
        """(keep_ratio, scope) of a kernel that trains only a kept token set (S-trace), else None."""
        if self.kernel in ENGINE_KERNELS or not objectives.get_kernel(self.kernel).uses_keep:
            return None
        return {
            "keep_ratio": self.kernel_params.get("keep_ratio", 0.2),
            "scope": self.kernel_params.get("scope", "batch"),
        }

    def needs(self) -> frozenset[str]:
        """Per-token signals needed to compute the token advantages (credit method + kept set)."""
        out = set(credit_mod.get(self.credit).needs)
        if self.keep_params is not None:
            out.add("entropy")
        return frozenset(out)


def slug(name: str) -> str:
    """An identifier-style name: 'dapo+ktae' -> 'dapo_ktae', 'entropy-80-20' -> 'entropy_80_20'."""
    return re.sub(r"[^0-9A-Za-z]+", "_", name).strip("_").lower()


def known_names() -> list[str]:
    """Every name `resolve` accepts: recipes first, then credit methods that are not also recipes."""
    return list(RECIPES) + [m for m in credit_mod.CREDIT_METHODS if m not in RECIPES]


def resolve(name: str, credit_params: Mapping[str, Any] | None = None) -> CreditSpec:
    """The CreditSpec for a recipe name or a registered credit method name.

    A recipe gives its baseline, credit method and kernel with their hyperparameters; a bare
    credit method gets the GRPO baseline (the engine's group-normalisation settings apply, see
    the plugins) and the per-token kernel. `credit_params` override the credit method's
    hyperparameters (unknown keys are an error naming the method's parameters).
    """
    if name in RECIPES:
        r = RECIPES[name]
        spec = CreditSpec(
            name, True, r.advantage, dict(r.advantage_params), r.credit, dict(r.credit_params), r.kernel,
            dict(r.kernel_params),
        )  # fmt: skip
    elif name in credit_mod.CREDIT_METHODS:
        spec = CreditSpec(name, False, credit=name)
    else:
        choices = known_names()
        raise ConfigError(
            f"unknown credit method or recipe {name!r}{closest(name, choices)}; known: {', '.join(choices)}"
        )
    method = credit_mod.get(spec.credit)  # raises a clear error if a recipe's method is not registered
    params = dict(spec.credit_params)
    for key, value in (credit_params or {}).items():
        if key not in method.defaults:
            raise ConfigError(
                f"credit method {spec.credit!r} has no parameter {key!r}{closest(key, method.defaults)}; "
                f"its parameters: {', '.join(sorted(method.defaults)) or '(none)'}"
            )
        params[key] = value
    return CreditSpec(
        spec.name, spec.from_recipe, spec.advantage, spec.advantage_params, spec.credit, params, spec.kernel,
        spec.kernel_params,
    )  # fmt: skip


def with_special_ids(spec: CreditSpec, special_ids: Iterable[int] | None) -> dict[str, Any]:
    """The credit parameters, with the tokenizer's special ids as `ignore_token_ids` when the method
    takes that parameter and the user did not set it (KTAE: EOS / pad get no key value)."""
    params = dict(spec.credit_params)
    method = credit_mod.get(spec.credit)
    if special_ids is not None and "ignore_token_ids" in method.defaults and "ignore_token_ids" not in params:
        params["ignore_token_ids"] = tuple(sorted({int(i) for i in special_ids}))
    return params


def token_advantages(
    spec: CreditSpec,
    batch: RolloutBatch,
    *,
    advantage: str | None = None,
    advantage_params: Mapping[str, Any] | None = None,
    special_ids: Iterable[int] | None = None,
    apply_keep: bool = False,
) -> tuple[Tensor, Tensor]:
    """(A[N], Â[N,T]) for `spec` on `batch`: the core's group baseline, then its credit method.

    `advantage` / `advantage_params` replace the spec's baseline (the plugins pass the engine's
    own normalisation settings for a bare credit method). With `apply_keep` and a kept-set kernel
    (S-trace), Â is zeroed outside the kept set, top_entropy_mask(old-policy entropy): the verl
    plugin carries the kept set to its policy loss this way.
    """
    name = advantage or spec.advantage
    params = dict(spec.advantage_params if advantage_params is None else advantage_params)
    seq_adv = adv_mod.compute(name, batch.scores, batch.group_ids, **params)
    tok_adv = credit_mod.compute(spec.credit, batch, seq_adv, **with_special_ids(spec, special_ids))
    keep = spec.keep_params
    if apply_keep and keep is not None:
        batch.require(("entropy",), f"the kept token set of ratio kernel {spec.kernel!r}")
        kept = top_entropy_mask(batch.entropy, batch.mask, keep["keep_ratio"], keep["scope"])
        tok_adv = torch.where(kept, tok_adv, torch.zeros((), dtype=tok_adv.dtype, device=tok_adv.device))
    return seq_adv, tok_adv


def group_ids_from_labels(labels: Any) -> Tensor:
    """int64 [N] group ids from a sequence of labels (verl's uid strings): equal labels, equal ids."""
    _, inverse = np.unique(np.asarray(labels).astype(str), return_inverse=True)
    return torch.from_numpy(inverse.reshape(-1).astype(np.int64))

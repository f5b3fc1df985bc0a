"""The columns of `explain` and `probe`: names -> recipes (the one name rule) -> each one's credit on a batch.

Both reports read `--methods` the same way (`tokencredit.recipes.resolve`: recipes first,
``credit:`` / ``recipe:`` prefixes choose) and compute each column with the one pipeline,
`tokencredit.recipes.token_credit`, so a report shows exactly the Â the trainer trains on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokencredit import credit
from tokencredit.batch import BatchValidationError, RolloutBatch
from tokencredit.builder import needs_of
from tokencredit.errors import ConfigError
from tokencredit.recipes import Recipe, TokenCredit, resolve, token_credit

__all__ = ["NA_LORA", "MethodCredit", "MethodSpec", "method_credit", "resolve_methods"]

NA_LORA = "n/a (needs a LoRA-trained model)"


@dataclass(frozen=True)
class MethodSpec:
    """One column: the name as the user wrote it and the recipe it resolves to."""

    name: str
    recipe: Recipe

    @property
    def kind(self) -> str:
        """"credit" for a credit method on its own, "recipe" for a row of the recipe table."""
        return "credit" if self.recipe.kind == "method" else "recipe"

    @property
    def label(self) -> str:
        r = self.recipe
        if self.kind == "credit":
            return f"credit method, A: {r.advantage}"
        if r.per_token:
            return f"recipe: {r.credit} Â, A: {r.advantage}"
        return f"recipe: {r.kernel} kernel on {r.credit} Â, on-policy"

    @property
    def description(self) -> str:
        r = self.recipe
        if self.kind == "credit":
            m = credit.get(r.credit)
            text = f"{m.description} [{m.paper}]" if m.paper else m.description
        else:
            text = f"{r.paper}. {r.notes}. {r.objective_label()} {r.kernel_params or ''}".strip()
        return f"{text}. Sequence advantage A: {r.advantage}"


def resolve_methods(
    names: Sequence[str],
    *,
    advantage: str = "grpo",
    advantage_params: Mapping[str, Any] | None = None,
    run_recipe: Recipe | None = None,
) -> list[MethodSpec]:
    """MethodSpecs for `names` (duplicates dropped), each read by `recipes.resolve`.

    A credit method on its own gets the estimator `advantage` (the run's, by default) and its
    default hyperparameters, or the run recipe's credit_params when the run trained with that
    method. A recipe named like the run's recipe is the run's resolved recipe (with its overrides).
    """
    specs: list[MethodSpec] = []
    seen: set[str] = set()
    for raw in names:
        name = raw.strip()
        if not name or name in seen:
            continue
        try:
            recipe = resolve(name)
        except ConfigError as e:
            raise ConfigError(f"--methods: {e}") from None
        if recipe.kind == "method":
            recipe = recipe.with_method_baseline(advantage, advantage_params)
            if run_recipe is not None and run_recipe.credit == recipe.credit:
                recipe = recipe.with_overrides(credit_params=dict(run_recipe.credit_params))
        elif run_recipe is not None and run_recipe.name == recipe.name:
            recipe = run_recipe
        seen.add(name)
        specs.append(MethodSpec(name, recipe))
    if not specs:
        raise ConfigError("--methods: no method named")
    return specs


@dataclass(frozen=True)
class MethodCredit:
    """A column's credit on a batch, or why there is none (`credit` None, `reason` says why)."""

    spec: MethodSpec
    credit: TokenCredit | None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.credit is not None


def method_credit(
    spec: MethodSpec,
    batch: RolloutBatch,
    *,
    special_ids: Sequence[int] | None,
    lora: bool = True,
    unavailable: Mapping[str, str] | None = None,
) -> MethodCredit:
    """One column's `TokenCredit` on `batch` from the pipeline, or the reason it cannot be had: a
    LoRA-only method on a model without an adapter (`lora` False), a missing signal (`unavailable`
    says why it is missing), or the configuration / data error the method raised on this batch."""
    if credit.get(spec.recipe.credit).requires_lora and not lora:
        return MethodCredit(spec, None, NA_LORA)
    missing = sorted(needs_of(spec.recipe).signals - batch.available_signals())
    if missing:
        why = dict(unavailable or {})
        return MethodCredit(
            spec, None, "; ".join(f"signal {s} unavailable: {why.get(s, 'not in the input')}" for s in missing)
        )
    try:
        return MethodCredit(spec, token_credit(spec.recipe, batch, special_ids=special_ids))
    except (ConfigError, BatchValidationError, ValueError, FloatingPointError) as e:
        return MethodCredit(spec, None, f"{type(e).__name__}: {e}")

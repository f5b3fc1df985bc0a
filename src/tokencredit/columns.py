"""The columns of `explain` and `probe`: names -> recipes (the one name rule) -> each one's credit on a batch.

Both reports read `--methods` the same way (`tokencredit.recipes.resolve`: recipes first,
``credit:`` / ``recipe:`` prefixes choose) and compute each column with the one pipeline,
`tokencredit.recipes.token_credit`, so a report shows exactly the Â the trainer trains on.
explain also takes the pseudo-method `SAVED` ("saved", `resolve_columns`): the Â saved with its input
rollouts, as they were trained with, read and not recomputed; probe samples its own rollouts and rejects it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from tokencredit import advantages, credit
from tokencredit.advantages.core import FIELDS
from tokencredit.batch import BatchValidationError, RolloutBatch
from tokencredit.builder import needs_of
from tokencredit.critic import no_critic_reason
from tokencredit.errors import ConfigError, closest
from tokencredit.recipes import Recipe, TokenCredit, known_names, resolve, token_credit

__all__ = [
    "NA_LORA",
    "SAVED",
    "TAIL_MASK",
    "MethodCredit",
    "MethodSpec",
    "SavedSpec",
    "method_credit",
    "resolve_columns",
    "resolve_methods",
    "with_critic_recipe",
]

NA_LORA = "n/a (needs a LoRA-trained model)"
# explain's column of the input's own Â (`SavedSpec`); no recipe or credit method has this name
SAVED = "saved"
# GRPO with exact credit on a toy-tail task's tail (Â = 0 there, `tokencredit.credit.tail`): the recipe grpo
# with zero_tail, as `compare --arm tail-mask=grpo:algo.zero_tail=true` trains it; no recipe has this name
TAIL_MASK = "tail-mask"


@dataclass(frozen=True)
class MethodSpec:
    """One column: the name as the user wrote it and the recipe it resolves to."""

    name: str
    recipe: Recipe

    @property
    def kind(self) -> str:
        """ "credit" for a credit method on its own, "recipe" for a row of the recipe table."""
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


@dataclass(frozen=True)
class SavedSpec:
    """explain's `SAVED` column: the token advantages Â saved with the rollouts (`token_advantages`), as the
    engine that sampled them trained with them; `trained_with` names its recipe when known (a run's)."""

    name: str = SAVED
    trained_with: str | None = None

    kind = "saved"
    label = "as trained"

    @property
    def description(self) -> str:
        by = f" (recipe {self.trained_with})" if self.trained_with else ""
        return (
            f"Â as trained{by}: the input's token_advantages, read, not recomputed; before the ratio kernel and "
            "loss mask. Sequence advantage A: the input's advantage"
        )


def _method_spec(
    name: str, advantage: str, advantage_params: Mapping[str, Any] | None, run_recipe: Recipe | None
) -> MethodSpec:
    if name == TAIL_MASK:  # the run's own grpo (its overrides) when it trained grpo
        base = run_recipe if run_recipe is not None and run_recipe.name == "grpo" else "grpo"
        return MethodSpec(name, resolve(base, {"zero_tail": True}))
    try:
        recipe = resolve(name)
    except ConfigError as e:
        hint = (
            f"; {TAIL_MASK!r} is GRPO with zero credit on a toy-tail task's tail"
            if closest(name, [TAIL_MASK])
            else ""
        )
        raise ConfigError(f"--methods: {e}{hint}") from None
    if recipe.kind == "method":
        if advantages.get_estimator(advantage).token_level and not credit.get(recipe.credit).token_advantages:
            # a run trained on token-level A (PPO's GAE): a method defined on a sequence advantage A [N]
            # gets GRPO's group baseline, not an error
            advantage, advantage_params = "grpo", None
        recipe = recipe.with_method_baseline(advantage, advantage_params)
        if run_recipe is not None and run_recipe.credit == recipe.credit:
            recipe = recipe.with_overrides(credit_params=dict(run_recipe.credit_params))
    elif run_recipe is not None and run_recipe.name == recipe.name:
        recipe = run_recipe
    return MethodSpec(name, recipe)


def _names(names: Sequence[str]) -> list[str]:
    """The names stripped, empty ones and repeats dropped; ConfigError when none is left."""
    out = list(dict.fromkeys(n.strip() for n in names if n.strip()))
    if not out:
        raise ConfigError("--methods: no method named")
    return out


def resolve_methods(
    names: Sequence[str],
    *,
    advantage: str = "grpo",
    advantage_params: Mapping[str, Any] | None = None,
    run_recipe: Recipe | None = None,
) -> list[MethodSpec]:
    """MethodSpecs for `names` (duplicates dropped), each read by `recipes.resolve`.

    A credit method on its own gets the estimator `advantage` (the run's, by default; GRPO's when that one
    gives a token-level A [N,T], e.g. PPO's GAE, and the method takes a sequence advantage) and its
    default hyperparameters, or the run recipe's credit_params when the run trained with that
    method. A recipe named like the run's recipe is the run's resolved recipe (with its overrides).
    `SAVED` is a ConfigError: these columns are computed on rollouts that carry no saved Â (probe's).
    """
    if SAVED in (n.strip() for n in names):
        raise ConfigError(
            f"--methods: {SAVED!r} is explain's column of the Â saved with a rollouts file; probe samples its own "
            "rollouts, which have none: name credit methods or recipes"
        )
    return [_method_spec(n, advantage, advantage_params, run_recipe) for n in _names(names)]


def resolve_columns(
    names: Sequence[str],
    *,
    advantage: str = "grpo",
    advantage_params: Mapping[str, Any] | None = None,
    run_recipe: Recipe | None = None,
) -> list[MethodSpec | SavedSpec]:
    """explain's columns, in the order named: `SAVED` as a `SavedSpec` (naming `run_recipe`), every other name
    as in `resolve_methods`; an unknown name close to `SAVED` is said to be."""
    specs: list[MethodSpec | SavedSpec] = []
    for name in _names(names):
        if name == SAVED:
            specs.append(SavedSpec(trained_with=run_recipe.name if run_recipe is not None else None))
            continue
        try:
            specs.append(_method_spec(name, advantage, advantage_params, run_recipe))
        except ConfigError:
            if not closest(name, [SAVED]):
                raise
            # resolve's message names the closest recipes only; this name is nearer the pseudo-method
            raise ConfigError(
                f"--methods: unknown method {name!r}{closest(name, [SAVED, *known_names()])}; {SAVED!r} shows "
                "the Â saved with the rollouts, as trained"
            ) from None
    return specs


_Spec = TypeVar("_Spec", MethodSpec, MethodSpec | SavedSpec)


@dataclass(frozen=True)
class MethodCredit:
    """A column's credit on a batch, or why there is none (`credit` None, `reason` says why)."""

    spec: MethodSpec
    credit: TokenCredit | None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.credit is not None


def _missing_field(name: str) -> str:
    """Why a column that reads the batch field `name` has no credit, when the engine gave no reason."""
    if name == "values":
        return no_critic_reason()
    return f"RolloutBatch.{name} unavailable ({FIELDS[name]}): not supplied by this report"


def with_critic_recipe(specs: Sequence[_Spec], recipe: Recipe) -> list[_Spec]:
    """`specs` with the column named like a loaded critic's run recipe (e.g. "ppo") taking that recipe, so its
    Â uses the gamma, lam and value bounds the critic was trained with."""
    return [
        cast(_Spec, MethodSpec(s.name, recipe))
        if isinstance(s, MethodSpec) and s.recipe.name == recipe.name
        else s
        for s in specs
    ]


def method_credit(
    spec: MethodSpec,
    batch: RolloutBatch,
    *,
    special_ids: Sequence[int] | None,
    lora: bool = True,
    unavailable: Mapping[str, str] | None = None,
) -> MethodCredit:
    """One column's `TokenCredit` on `batch` from the pipeline, or the reason it cannot be had: a
    LoRA-only method on a model without an adapter (`lora` False), a missing signal or batch field
    (`unavailable` says why it is missing, keyed by its name; a missing `values` defaults to "needs a trained
    critic"), or the configuration / data error the method raised on this batch."""
    if credit.get(spec.recipe.credit).requires_lora and not lora:
        return MethodCredit(spec, None, NA_LORA)
    missing = sorted(needs_of(spec.recipe).signals - batch.available_signals())
    if missing:
        why = dict(unavailable or {})
        return MethodCredit(
            spec,
            None,
            "; ".join(f"signal {s} unavailable: {why.get(s, 'not in the input')}" for s in missing),
        )
    fields = sorted(f for f in needs_of(spec.recipe).fields if getattr(batch, f, None) is None)
    if (
        fields
    ):  # a batch field the engine fills (a critic's values, ReMax's greedy baseline), said with its reason
        why = dict(unavailable or {})
        return MethodCredit(spec, None, "; ".join(why.get(f, _missing_field(f)) for f in fields))
    try:
        return MethodCredit(spec, token_credit(spec.recipe, batch, special_ids=special_ids))
    except (ConfigError, BatchValidationError, ValueError, FloatingPointError) as e:
        return MethodCredit(spec, None, f"{type(e).__name__}: {e}")

"""The one name rule (`resolve`) and recipe validation: every name and parameter checked before a model loads."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tokencredit import advantages, credit, objectives
from tokencredit.credit.placebo import PLACEBOS
from tokencredit.errors import ConfigError, closest
from tokencredit.recipes.recipe import CLIP_FIELDS, Recipe
from tokencredit.recipes.table import RECIPES, get_recipe, known_names, method_recipe

__all__ = ["from_dict", "resolve", "validate"]


def _lookup(name: str) -> Recipe:
    kind, sep, bare = name.partition(":")
    if sep:
        if kind == "recipe":
            return get_recipe(bare)
        if kind == "credit":
            return method_recipe(bare)
        raise ConfigError(f"unknown prefix {kind!r} in {name!r}; use recipe:NAME or credit:NAME")
    if name in RECIPES:
        return RECIPES[name]
    if name in credit.CREDIT_METHODS:
        return method_recipe(name)
    methods = [m for m in credit.CREDIT_METHODS if m not in RECIPES]
    raise ConfigError(
        f"unknown recipe or credit method {name!r}{closest(name, known_names())}; recipes: {', '.join(RECIPES)}; "
        f"credit methods on their own: {', '.join(methods)}"
    )


def resolve(name: str | Recipe, overrides: Mapping[str, Any] | None = None) -> Recipe:
    """The validated recipe for a name (the rule in the module docstring) or a Recipe, with `overrides`.

    Overrides replace fields; dict fields (credit_params, kernel_params, ...) are merged key by
    key. Every name and parameter is checked here, before any model is loaded: an unknown field,
    estimator, credit method, loss, kernel or parameter is a ConfigError naming the closest valid one.
    """
    recipe = name if isinstance(name, Recipe) else _lookup(name)
    changes = dict(overrides or {})
    if changes:
        recipe = recipe.with_overrides(**changes)
    validate(recipe, overridden=changes)
    return recipe


def validate(recipe: Recipe, overridden: Iterable[str] = ()) -> None:
    """ConfigError for anything in `recipe` that no registered piece would read, or reads wrongly."""
    where = f"recipe {recipe.name!r}"
    if recipe.kind not in ("recipe", "method"):
        raise ConfigError(f"{where}: kind must be 'recipe' or 'method', got {recipe.kind!r}")
    advantages.ESTIMATORS.check_params(recipe.advantage, recipe.advantage_params)
    credit.CREDIT_METHODS.check_params(recipe.credit, recipe.credit_params)
    if (
        advantages.get_estimator(recipe.advantage).token_level
        and not credit.get(recipe.credit).token_advantages
    ):
        takes = [m for m, c in credit.CREDIT_METHODS.items() if c.token_advantages]
        raise ConfigError(
            f"{where}: advantage estimator {recipe.advantage!r} gives a token-level A [N,T], which credit method "
            f"{recipe.credit!r} (defined on a sequence advantage A [N]) does not take; use one of: {', '.join(takes)}"
        )
    loss = objectives.get_loss(recipe.loss)
    objectives.LOSSES.check_params(recipe.loss, recipe.loss_params)
    clip_in_params = sorted(set(recipe.loss_params) & set(CLIP_FIELDS))
    if clip_in_params:
        raise ConfigError(
            f"{where}: set {clip_in_params[0]} as a recipe field (algo.{clip_in_params[0]}), not in loss_params"
        )
    unread = [k for k in CLIP_FIELDS if k in overridden and k not in loss.defaults]
    if unread:
        raise ConfigError(
            f"{where}: policy loss {recipe.loss!r} has no clip range; {unread[0]} would never be read"
        )
    if loss.uses_ratio:
        objectives.kernel_parameters(recipe.kernel, recipe.kernel_params)
    elif recipe.kernel != "token" or recipe.kernel_params:
        raise ConfigError(
            f"{where}: policy loss {recipe.loss!r} uses no importance ratio, so ratio kernel {recipe.kernel!r} "
            f"{dict(recipe.kernel_params) or ''} would never be read; use a loss with a ratio (e.g. ppo-clip)"
        )
    if recipe.loss_agg_mode not in objectives.AGG_MODES:
        raise ConfigError(
            f"{where}: unknown loss_agg_mode {recipe.loss_agg_mode!r}{closest(recipe.loss_agg_mode, objectives.AGG_MODES)}"
        )
    if recipe.placebo not in PLACEBOS:
        raise ConfigError(
            f"{where}: unknown placebo {recipe.placebo!r}{closest(str(recipe.placebo), PLACEBOS)}; "
            f"choose one of: {', '.join(PLACEBOS)}"
        )
    if not isinstance(recipe.zero_tail, bool):
        raise ConfigError(f"{where}: zero_tail must be true or false, got {recipe.zero_tail!r}")
    if recipe.zero_tail and not recipe.per_token:
        raise ConfigError(
            f"{where}: zero_tail zeroes the tail's gradient only under a per-token objective; ratio kernel "
            f"{recipe.kernel!r} moves the tail's tokens through the others' weights (use kernel 'token')"
        )
    if recipe.kl_type not in ("k1", "k2", "k3"):
        raise ConfigError(f"{where}: kl_type must be 'k1', 'k2' or 'k3', got {recipe.kl_type!r}")
    checks = [
        (recipe.eps_low >= 0 and recipe.eps_high >= 0, "eps_low and eps_high must be >= 0"),
        (recipe.dual_clip is None or recipe.dual_clip > 1, "dual_clip must be > 1 or none"),
        (recipe.kl_coef >= 0, "kl_coef must be >= 0"),
        (recipe.overlong_buffer >= 0, "overlong_buffer must be >= 0"),
        (recipe.norm_constant is None or recipe.norm_constant > 0, "norm_constant must be > 0 or none"),
    ]
    for ok, rule in checks:
        if not ok:
            raise ConfigError(f"{where}: {rule}")


def from_dict(data: Mapping[str, Any], where: str = "recipe", unknown: list[str] | None = None) -> Recipe:
    """A Recipe from its `to_dict()` form (a run's recipe.json), validated.

    Files written before policy losses were registered name REINFORCE as kernel "reinforce";
    that reads as loss "reinforce" with the per-token kernel. An unknown key is a ConfigError
    naming it and `where`; with `unknown` a list it is dropped instead and its name appended there
    (a report reading a run written by a newer version: `RunDir.read_recipe(skipped=...)`).
    """
    d = dict(data)
    if d.get("kernel") == "reinforce":
        d.update(kernel="token", loss="reinforce")
    names = [k for k in d if k not in Recipe.__dataclass_fields__]
    if names and unknown is not None:
        unknown += names
        d = {k: v for k, v in d.items() if k not in names}
    elif names:
        raise ConfigError(
            f"{where}: unknown recipe field {names[0]!r}{closest(names[0], Recipe.__dataclass_fields__)} "
            "(written by a newer tokencredit?)"
        )
    try:
        recipe = Recipe(**d)
    except TypeError as e:
        raise ConfigError(f"{where}: not a recipe ({e})") from None
    validate(recipe)
    return recipe

"""Recipes, and the one credit pipeline every engine uses.

A recipe names one choice of group baseline, credit method, loss and ratio kernel, with their
hyperparameters. Recipes are data (the `RECIPES` table), not code paths.

`token_credit(recipe, batch, special_ids=...)` is the one path from a recipe and a `RolloutBatch`
(with its per-token signals) to everything the objective needs: A [N], Â [N,T], the tokens that
carry a loss term (S-trace's kept set, DAPO's truncated rows) and the objective's settings
(`tokencredit.objectives.ObjectiveArgs`, built by `Recipe.objective_args`). The trainer, `explain`, `probe`, `compare` (through the
trainer), the TRL plugin and the verl plugin all call it, so a recipe gives the same Â everywhere
(tests/test_engines_agree.py).

Names: `resolve(name)` is the one rule for reading a user's name, used by every engine:
``recipe:NAME`` is the recipe NAME and ``credit:NAME`` the credit method NAME on its own; a plain
NAME is the recipe when the table has one of that name (recipes win: ``surprisal`` is the
recipe, REINFORCE included), otherwise the credit method. A credit method on its own
(``kind="method"``) is the default objective (PPO-clip 0.2, per-token ratio, token-mean) over the
GRPO baseline, which an engine replaces with its own group normalisation
(`Recipe.with_method_baseline`).
"""

from tokencredit.recipes.pipeline import (
    TokenCredit,
    batch_fields,
    credit_arguments,
    credit_needs,
    recipe_needs,
    requires_lora,
    token_credit,
    zero_outside,
)
from tokencredit.recipes.recipe import CLIP_FIELDS, Recipe
from tokencredit.recipes.resolve import from_dict, resolve, validate
from tokencredit.recipes.table import RECIPES, get_recipe, known_names, method_recipe

__all__ = [
    "CLIP_FIELDS",
    "RECIPES",
    "Recipe",
    "TokenCredit",
    "batch_fields",
    "credit_arguments",
    "credit_needs",
    "from_dict",
    "get_recipe",
    "known_names",
    "method_recipe",
    "recipe_needs",
    "requires_lora",
    "resolve",
    "token_credit",
    "validate",
    "zero_outside",
]

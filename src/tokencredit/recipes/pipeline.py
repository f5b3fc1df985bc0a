"""The one credit pipeline: recipe + batch (+ the tokenizer's special ids) -> `TokenCredit`, and the
signals and batch fields a recipe needs. Every engine (trainer, explain, probe, compare, TRL, verl) calls it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from tokencredit import advantages, credit, objectives
from tokencredit.batch import RolloutBatch
from tokencredit.credit.placebo import apply_placebo
from tokencredit.credit.tail import zero_tail
from tokencredit.errors import ConfigError
from tokencredit.recipes.recipe import Recipe
from tokencredit.recipes.resolve import resolve

__all__ = [
    "TokenCredit",
    "batch_fields",
    "credit_arguments",
    "credit_needs",
    "placebo_credit",
    "recipe_needs",
    "requires_lora",
    "token_credit",
    "zero_outside",
]


def credit_needs(recipe: Recipe) -> frozenset[str]:
    """Signals needed for A, Â and the kept set (all before the update): the estimator's (OTB), the credit
    method's and the ratio kernel's preparation's."""
    needs = set(credit.get(recipe.credit).needs) | advantages.get_estimator(recipe.advantage).needs
    if recipe.uses_ratio:
        needs |= objectives.get_kernel(recipe.kernel).needs
    return frozenset(needs)


def recipe_needs(recipe: Recipe) -> frozenset[str]:
    """Signals the whole objective needs: `credit_needs`, old log-probs for a ratio, reference log-probs for KL."""
    needs = set(credit_needs(recipe))
    if recipe.uses_ratio:
        needs.add("old_log_probs")
    if recipe.kl_coef:
        needs.add("ref_log_probs")
    return frozenset(needs)


def requires_lora(recipe: Recipe) -> bool:
    return credit.get(recipe.credit).requires_lora


def batch_fields(recipe: Recipe) -> frozenset[str]:
    """RolloutBatch fields besides the signals that the engine must fill for this recipe (ReMax:
    {"baseline_scores"}, the reward of one greedy rollout per prompt; see tokencredit.advantages.FIELDS)."""
    return advantages.get_estimator(recipe.advantage).fields


@dataclass(frozen=True)
class TokenCredit:
    """What the objective needs for one batch under one recipe (all tensors detached).

    seq_advantages A [N] float32 (for a token-level estimator, each row's mean of A over its valid tokens);
    token_advantages Â [N,T] float32, 0 off `batch.mask`;
    mask bool [N,T]: valid tokens of the rows that train (DAPO's mask_truncated drops whole rows);
    loss_mask bool [N,T]: the tokens that carry a loss term (within S-trace's kept set);
    objective: the settings of `objectives.policy_loss` (loss, kernel with its prepared arguments,
    aggregation, KL), built by `Recipe.objective_args`.
    """

    recipe: Recipe
    seq_advantages: Tensor
    token_advantages: Tensor
    mask: Tensor
    loss_mask: Tensor
    objective: objectives.ObjectiveArgs

    @property
    def keep(self) -> Tensor | None:
        """bool [N,T]: the kept set of a kept-set kernel (S-trace), else None."""
        return self.objective.keep

    def effective(self, loss_agg_mode: str = "token-mean") -> Tensor:
        """Â_eff [N,T]: the objective's on-policy gradient weight per token (`objectives.effective_credit`);
        equal to Â for per-token objectives under token-mean. `loss_agg_mode` defaults to token-mean
        (pass recipe.loss_agg_mode to include the recipe's row weighting)."""
        if self.recipe.per_token and loss_agg_mode == "token-mean":
            # what effective_credit's autograd gives for these objectives, without the backward pass
            return zero_outside(self.token_advantages, self.loss_mask)
        objective = replace(self.objective, loss_agg_mode=loss_agg_mode)
        return objectives.effective_credit(self.token_advantages, self.mask, objective)


def credit_arguments(recipe: Recipe, special_ids: Iterable[int] | None) -> dict[str, Any]:
    """The credit method's parameters, with the tokenizer's special ids as `ignore_token_ids` when the
    method takes that parameter and the recipe does not set it (KTAE: EOS / pad get no key value)."""
    params = dict(recipe.credit_params)
    takes = credit.get(recipe.credit).defaults
    if special_ids is not None and "ignore_token_ids" in takes and "ignore_token_ids" not in params:
        params["ignore_token_ids"] = tuple(sorted({int(i) for i in special_ids}))
    return params


def token_credit(
    recipe: Recipe | str,
    batch: RolloutBatch,
    *,
    overrides: Mapping[str, Any] | None = None,
    special_ids: Iterable[int] | None = None,
    max_response_length: int | None = None,
) -> TokenCredit:
    """The one credit pipeline: recipe + batch (+ the tokenizer's special ids) -> `TokenCredit`.

    1. A = the recipe's estimator on the batch: A [N], or A [N,T] for a token-level one
       (REINFORCE++, OTB; only credit methods that take token advantages accept it) (advantages.estimate)
    2. Â = its credit method on the batch and A                               (credit.compute)
    3. the ratio kernel's arguments, prepared from the batch (S-trace: the kept set from the
       old policy's entropy)                                                   (objectives.prepare_kernel)
    4. the loss tokens: valid tokens, minus truncated rows when the recipe masks them, within the kept set.
    5. the tail mask, when the recipe sets `zero_tail`: Â = 0 on `batch.tail_mask` (the task's
       reward-irrelevant tail, where A* = 0 exactly), the loss tokens unchanged     (credit.tail)
    6. a placebo control, when the recipe names one (`placebo_credit`): the effective credit's values
       moved at random within each response, or made uniform at its RMS or mean, trained per token

    `recipe` is a Recipe or a name (`resolve` applies, with `overrides`). `special_ids`: the
    tokenizer's special token ids (KTAE gives them no key value). `max_response_length`: the
    normaliser of seq-mean-token-sum-norm when the recipe leaves norm_constant unset.
    """
    if isinstance(recipe, str) or overrides:
        recipe = resolve(recipe, overrides)
    adv = advantages.estimate(recipe.advantage, batch, **recipe.advantage_params)
    tok_adv = credit.compute(recipe.credit, batch, adv, **credit_arguments(recipe, special_ids))
    if recipe.zero_tail:
        if batch.tail_mask is None:
            raise ConfigError(
                f"recipe {recipe.name!r} sets zero_tail, but the batch has no tail mask: only a task with a "
                "reward-irrelevant tail has one (data toy-tail-32 or toy-tail-128)"
            )
        tok_adv = zero_tail(tok_adv, batch.tail_mask)
    if adv.dim() == 2:
        m = batch.mask.to(adv.dtype)
        seq_adv = (adv * m).sum(-1) / m.sum(-1).clamp(min=1)
    else:
        seq_adv = adv
    mask = batch.mask
    if recipe.mask_truncated and batch.truncated is not None:
        mask = mask & ~batch.truncated[:, None]
    kernel_args = (
        objectives.prepare_kernel(recipe.kernel, batch, recipe.kernel_params) if recipe.uses_ratio else None
    )
    objective = recipe.objective_args(kernel_args, max_response_length=max_response_length)
    loss_mask = objectives.loss_token_mask(mask, objective.keep)
    tc = TokenCredit(recipe, seq_adv.detach().float(), tok_adv, mask, loss_mask, objective)
    return tc if recipe.placebo == "none" else placebo_credit(tc, batch.token_ids)


def placebo_credit(tc: TokenCredit, token_ids: Tensor) -> TokenCredit:
    """The placebo arm of `tc.recipe` (its `placebo` field, `credit.placebo`): R's update size, random placement.

    The placebo acts on R's effective credit Â_eff (each token's on-policy gradient weight, `TokenCredit.
    effective`: Â for a per-token objective; a ratio kernel's trace weights and kept set included, so
    S-trace's kept set is placement too and moves with its values), over each response's training tokens
    `tc.mask`, and the arm trains it with the per-token ratio (no kept set), R's loss, clip range and
    aggregation otherwise. token_ids [N,T] seed the permutation (a function of each row alone).
    """
    recipe = tc.recipe
    placebo = apply_placebo(recipe.placebo, tc.effective(), tc.mask, tc.seq_advantages, token_ids)
    objective = tc.objective
    if recipe.uses_ratio and recipe.kernel != "token":
        recipe = replace(recipe, kernel="token", kernel_params={})
        objective = replace(objective, kernel="token", kernel_args={})
    return TokenCredit(recipe, tc.seq_advantages, placebo.float(), tc.mask, tc.mask, objective)


def zero_outside(values: Tensor, keep: Tensor | None) -> Tensor:
    """`values` with 0 outside the kept set (or unchanged without one)."""
    if keep is None:
        return values
    return torch.where(keep, values, torch.zeros((), dtype=values.dtype, device=values.device))

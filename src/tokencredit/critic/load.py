"""A trained critic outside the trainer: the value model rebuilt from saved weights, and its values on any batch.

`value_model_from_state` puts a critic's saved weights (the trainer's `Critic.state_dict()["model"]`, or a
run's final critic file) back on a fresh `ValueModel` of the run's model; `TrainedCritic` carries it with
its tokenizer and the run's recipe (whose `gae` parameters bound V), and `TrainedCritic.values` fills
`RolloutBatch.values` for rollouts tokenised with that tokenizer (`explain`, `probe`). Which file of a run
holds the critic is the run directory's business (`tokencredit.train.checkpoint.load_run_critic`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from tokencredit import advantages
from tokencredit.critic.model import ValueModel
from tokencredit.errors import ConfigError
from tokencredit.recipes import RECIPES, Recipe, batch_fields

__all__ = [
    "TrainedCritic",
    "critic_recipes",
    "needs_values",
    "no_critic_reason",
    "same_vocabulary",
    "value_bounds",
    "value_model_from_state",
]


def needs_values(recipe: Recipe) -> bool:
    """True when the recipe's advantage estimator reads a learned critic's `values` (declared data)."""
    return "values" in batch_fields(recipe)


def critic_recipes() -> list[str]:
    """The table's recipes that train a critic (their estimator reads `values`): ppo, bpco."""
    return [name for name, r in RECIPES.items() if needs_values(r)]


def no_critic_reason(option: str = "--critic RUN") -> str:
    """Why a column that needs `values` has no credit when no critic was loaded (explain, probe)."""
    return f"needs a trained critic (RolloutBatch.values): a run trained with {' / '.join(critic_recipes())}, or {option}"


def value_bounds(recipe: Recipe) -> tuple[float, float]:
    """(value_min, value_max) of the recipe's estimator parameters (the trainer bounds its critic so)."""
    est = advantages.get_estimator(recipe.advantage)
    params = {**est.defaults, **recipe.advantage_params}
    return float(params.get("value_min", -math.inf)), float(params.get("value_max", math.inf))


def value_model_from_state(
    causal_lm: nn.Module, state: Mapping[str, Tensor], recipe: Recipe, where: str
) -> ValueModel:
    """The trained value model: `causal_lm` (the run's warm start; its LM head is dropped) with `state`, the
    critic's saved weights, in eval mode without gradients. ConfigError naming `where` when they do not fit."""
    lo, hi = value_bounds(recipe)
    model = ValueModel(causal_lm, lo, hi)
    try:
        model.load_state_dict(dict(state))
    except RuntimeError as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise ConfigError(
            f"{where}: the saved critic's weights do not fit a value model of the run's model ({first})"
        ) from None
    return model.eval().requires_grad_(False)


def same_vocabulary(a: Any, b: Any) -> bool:
    """True when two tokenizers map the same strings to the same ids (the critic reads ids, not text)."""
    return a is b or (len(a) == len(b) and a.get_vocab() == b.get_vocab())


@dataclass(frozen=True)
class TrainedCritic:
    """A run's trained critic: the value model, the tokenizer its ids are read with, the run's recipe (its
    `gae` parameters), the step it was saved at and a description ("run R, critic after step N (...)")."""

    model: ValueModel
    tokenizer: Any
    recipe: Recipe
    step: int
    source: str

    def check_tokenizer(self, tokenizer: Any, what: str, option: str = "--critic") -> None:
        """ConfigError unless `tokenizer` (that of `what`, e.g. "the probed model") has the critic's vocabulary."""
        if tokenizer is not None and not same_vocabulary(self.tokenizer, tokenizer):
            raise ConfigError(
                f"{option}: {self.source} reads token ids of another tokenizer than {what} "
                f"({len(self.tokenizer)} vs {len(tokenizer)} tokens): give a critic trained on the same model family"
            )

    @torch.no_grad()
    def values(
        self,
        sequences: Tensor,
        attention_mask: Tensor,
        prompt_len: int,
        mask: Tensor,
        batch_size: int | None = None,
    ) -> Tensor:
        """V [N,T] float32 on the CPU, 0 off `mask`: sequences / attention_mask [N, P+T] (prompts left-padded
        to `prompt_len` columns), mask [N,T] bool; `batch_size` rows per forward (None: all)."""
        dev = next(self.model.parameters()).device
        n = sequences.shape[0]
        rows = batch_size or max(1, n)
        out = [
            self.model(
                sequences[i : i + rows].to(dev),
                attention_mask[i : i + rows].to(dev),
                prompt_len,
                mask[i : i + rows].to(dev).bool(),
            ).cpu()
            for i in range(0, n, rows)
        ]
        return torch.cat(out) if out else torch.zeros(mask.shape, dtype=torch.float32)

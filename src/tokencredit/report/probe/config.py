"""The probe's settings: how rollouts are sampled (task, template, temperature) and scored (k values,
random draws), with the defaults a probed training run supplies."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tokencredit import advantages
from tokencredit.data.templates import check_template
from tokencredit.errors import ConfigError, closest
from tokencredit.recipes import Recipe
from tokencredit.train.config import TrainConfig

__all__ = ["DEFAULT_KS", "DEFAULT_METHODS", "ProbeConfig", "parse_ks", "probe_config"]

DEFAULT_METHODS = (
    "grpo,ktae,delta,gspo,ptrace,strace,entropy-80-20,surprisal,entropy-reduction,gcpo,arca,policy-divergence"
)
DEFAULT_KS: tuple[int, ...] = (1, 3, 10)


@dataclass
class ProbeConfig:
    """How rollouts are sampled and scored (the task's difficulty / digits pick the held-out problems)."""

    groups: int = 64
    group_size: int = 8
    seed: int = 0
    difficulty: int = 3
    digits: int = 2
    operand_digits: int | None = None  # None: the task's default
    template: str = "qwen-math"
    temperature: float = 1.0
    max_new_tokens: int = 96
    advantage: str = "grpo"
    advantage_params: dict[str, Any] = field(default_factory=dict)
    ks: tuple[int, ...] = DEFAULT_KS
    random_draws: int = 20
    batch_size: int = 64  # rows per forward for signals and per generate call


def parse_ks(text: str) -> tuple[int, ...]:
    """The sorted, distinct k values of blame@k from "1,3,10"."""
    try:
        ks = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise ConfigError(f"--ks: expected comma-separated integers, got {text!r}") from None
    if not ks or ks[0] < 1:
        raise ConfigError(f"--ks: expected integers >= 1, got {text!r}")
    return ks


def _estimator(advantage: str | None, recipe: Recipe | None) -> str:
    """The group estimator: `advantage`, else the run recipe's, else grpo (checked against the registry)."""
    estimator = advantage or (recipe.advantage if recipe is not None else "grpo")
    if estimator not in advantages.ESTIMATORS:
        raise ConfigError(
            f"--advantage: unknown estimator {estimator!r}{closest(estimator, advantages.ESTIMATORS)}; "
            f"one of {', '.join(advantages.ESTIMATORS)}"
        )
    return estimator


def probe_config(
    run_cfg: TrainConfig | None,
    recipe: Recipe | None,
    *,
    groups: int,
    group_size: int,
    seed: int,
    max_new_tokens: int,
    random_draws: int,
    batch_size: int,
    ks: str | Sequence[int],
    difficulty: int | None = None,
    digits: int | None = None,
    operand_digits: int | None = None,
    template: str | None = None,
    temperature: float | None = None,
    advantage: str | None = None,
) -> ProbeConfig:
    """A checked ProbeConfig; options left None take the run's settings (its toy task, template,
    temperature, estimator) when a run is probed, else the defaults. `ks` may be "1,3,10"."""
    counts = (groups, group_size, max_new_tokens, batch_size, random_draws)
    for name, value in zip(("groups", "group_size", "max_new_tokens", "batch_size", "random_draws"), counts):
        if value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if group_size < 2:
        raise ConfigError(f"--group-size must be >= 2 for a group baseline, got {group_size}")
    estimator = _estimator(advantage, recipe)
    toy_data = run_cfg is not None and run_cfg.data.train == "toy"
    cfg = ProbeConfig(
        groups=groups,
        group_size=group_size,
        seed=seed,
        difficulty=difficulty or (run_cfg.data.difficulty if toy_data else 3),
        digits=digits or (run_cfg.data.digits if toy_data else 2),
        operand_digits=operand_digits
        or (getattr(run_cfg.data, "operand_digits", None) if toy_data else None),
        template=template or (run_cfg.data.template if run_cfg is not None else "qwen-math"),
        temperature=(
            temperature
            if temperature is not None
            else (run_cfg.rollout.temperature if run_cfg is not None else 1.0)
        ),
        max_new_tokens=max_new_tokens,
        advantage=estimator,
        advantage_params=dict(recipe.advantage_params) if recipe is not None and advantage is None else {},
        ks=parse_ks(ks) if isinstance(ks, str) else tuple(ks),
        random_draws=random_draws,
        batch_size=batch_size,
    )
    check_template(cfg.template)
    if cfg.temperature <= 0:
        raise ConfigError(f"--temperature must be > 0 (the probe samples groups), got {cfg.temperature}")
    return cfg

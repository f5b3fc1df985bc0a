"""The problems a data spec names (``data.train`` / ``data.eval``, ``tokencredit eval --bench``): the
embedded toy tasks, shipped benchmarks, reasoning-gym data and the user's files, one resolver for the
trainer, evaluation and the commands."""

from __future__ import annotations

from typing import Any

from tokencredit.data import load_problems, math_benchmarks, reasoning_gym
from tokencredit.data.synthetic import ArithmeticTask
from tokencredit.errors import ConfigError
from tokencredit.models import TOY_VARIANTS, toy_task

__all__ = ["load_problems_for"]


def load_problems_for(spec: str, data: Any, split: str) -> list[Any]:
    """Problems for `data.train` / `data.eval` (`data`: the run's DataConfig): "toy" (the synthetic
    task's train or held-out split, `data.difficulty` steps), "toy-hard" (the task of the hard toy
    model's warm start), or comma-separated parts: shipped benchmark names, reasoning-gym data
    (``reasoning-gym:NAME[?params]``, `data.train_size` / `data.eval_size` problems, disjoint seeds
    per split) or files / `datasets` directories."""
    limit = data.eval_size if split == "heldout" and data.eval_size > 0 else None
    size = data.eval_size if split == "heldout" else data.train_size
    if spec == "toy":
        return ArithmeticTask(difficulty=data.difficulty, digits=data.digits).sample(size, split)
    if spec in TOY_VARIANTS:
        return toy_task(name=spec).sample(size, split)
    out: list[Any] = []
    for part in (x.strip() for x in spec.split(",") if x.strip()):
        if reasoning_gym.is_spec(part):
            out += reasoning_gym.load(part, split=split, size=size or None)
        elif part in math_benchmarks.NAMES:
            out += math_benchmarks.load(part, limit=limit)
        else:
            out += load_problems(
                part, problem_field=data.problem_field or None, answer_field=data.answer_field or None, limit=limit
            )
    if not out:
        raise ConfigError(f"data.{'eval' if split == 'heldout' else 'train'} = {spec!r} gave no problems")
    return out

"""The problems a data spec names (``data.train`` / ``data.eval``, ``tokencredit eval --bench``): the
embedded toy tasks, shipped benchmarks, reasoning-gym data and the user's files, one resolver for the
trainer, evaluation and the commands."""

from __future__ import annotations

from typing import Any

from tokencredit.data import load_problems, math_benchmarks, reasoning_gym
from tokencredit.data.synthetic import ArithmeticTask
from tokencredit.errors import ConfigError, closest
from tokencredit.models import TOY_VARIANTS, toy_task

__all__ = ["SPLITS", "load_problems_for"]

SPLITS = ("train", "heldout", "validation")


def _toy(spec: str, data: Any, split: str) -> list[Any]:
    """A toy task's problems. "validation": the training split's problems after the run's first
    `data.train_size` (sampling is prefix-stable, so they are disjoint from the ones it trains on and,
    as training problems, from the held-out split)."""
    task = (
        ArithmeticTask(difficulty=data.difficulty, digits=data.digits)
        if spec == "toy"
        else toy_task(name=spec)
    )
    if split == "validation":
        try:
            return task.sample(data.train_size + data.eval_size, "train")[data.train_size :]
        except ValueError as e:
            raise ConfigError(
                f'data.eval_split = "validation" takes data.eval_size problems after the first data.train_size of '
                f"the training split of {spec!r}: {e}; lower data.train_size or data.eval_size"
            ) from None
    return task.sample(data.eval_size if split == "heldout" else data.train_size, split)


def load_problems_for(spec: str, data: Any, split: str) -> list[Any]:
    """Problems for `data.train` / `data.eval` (`data`: the run's DataConfig): "toy" (the synthetic
    task's train or held-out split, `data.difficulty` steps), "toy-hard" (the task of the hard toy
    model's warm start), or comma-separated parts: shipped benchmark names, reasoning-gym data
    (``reasoning-gym:NAME[?params]``, `data.train_size` / `data.eval_size` problems, disjoint seeds
    per split) or files / `datasets` directories. `split` "validation" (``data.eval_split``) needs a
    toy task or reasoning-gym data: problems disjoint from both the training and the held-out ones."""
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; use {', '.join(SPLITS)}{closest(split, SPLITS)}")
    if spec in TOY_VARIANTS or spec == "toy":
        return _toy(spec, data, split)
    limit = data.eval_size if split == "heldout" and data.eval_size > 0 else None
    size = data.train_size if split == "train" else data.eval_size
    out: list[Any] = []
    for part in (x.strip() for x in spec.split(",") if x.strip()):
        if reasoning_gym.is_spec(part):
            out += reasoning_gym.load(part, split=split, size=size or None)
        elif split == "validation":
            raise ConfigError(
                f'data.eval_split = "validation" needs a toy task or reasoning-gym data, not {part!r} in '
                f"data.eval = {spec!r}; to tune on a validation file, pass it as data.eval (with data.eval_split = "
                '"heldout") and keep the test set for the final runs'
            )
        elif part in math_benchmarks.NAMES:
            out += math_benchmarks.load(part, limit=limit)
        else:
            out += load_problems(
                part,
                problem_field=data.problem_field or None,
                answer_field=data.answer_field or None,
                limit=limit,
            )
    if not out:
        raise ConfigError(f"data.{'train' if split == 'train' else 'eval'} = {spec!r} gave no problems")
    return out

"""The problems a data spec names (``data.train`` / ``data.eval``, ``tokencredit eval --bench``): the
embedded toy tasks, shipped benchmarks, reasoning-gym data and the user's files, one resolver for the
trainer, evaluation and the commands."""

from __future__ import annotations

from typing import Any

from tokencredit.data import load_problems, math_benchmarks, reasoning_gym
from tokencredit.data.synthetic import (
    EXACT_COUNT_LIMIT,
    MAX_DIFFICULTY,
    MAX_DIGITS,
    MAX_SAMPLE,
    ArithmeticTask,
)
from tokencredit.errors import ConfigError, closest
from tokencredit.models import TOY_VARIANTS, toy_task

__all__ = ["SPLITS", "load_problems_for", "tail_task"]

SPLITS = ("train", "heldout", "validation")


def _toy_task(spec: str, data: Any) -> ArithmeticTask:
    """The task of a toy data spec: "toy" from `data.difficulty` / `data.digits` (a bad value is a
    ConfigError naming the key and its range), a toy variant from its warm start's settings."""
    if spec != "toy":
        return toy_task(name=spec)
    for key, value, high, what in (
        ("difficulty", data.difficulty, MAX_DIFFICULTY, "arithmetic steps of the toy task"),
        ("digits", data.digits, MAX_DIGITS, "digits of the toy task's running totals"),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
            raise ConfigError(f"data.{key} must be in 1..{high} ({what}), got {value!r}")
    return ArithmeticTask(difficulty=data.difficulty, digits=data.digits)


def _check_toy_size(task: ArithmeticTask, spec: str, n: int, split: str, key: str, lower: str = "") -> None:
    """ConfigError naming `key` when `n` problems of the task's `split` are more than `MAX_SAMPLE` or more
    than the split holds (`ArithmeticTask.max_sample`); checked before anything is drawn. `lower`: the
    key(s) the message says to lower (default `key`)."""
    what = "training" if split == "train" else "held-out"
    lower = lower or key
    if n > MAX_SAMPLE:
        why = (
            " (a run draws from them with replacement, epoch after epoch)" if key == "data.train_size" else ""
        )
        raise ConfigError(
            f"{key} = {n} is above {MAX_SAMPLE}, the most problems of the {spec!r} task built up front{why}; "
            f"lower {lower}"
        )
    bound = task.max_sample(split, n)
    if n > bound:
        exact = task.count_problems(limit=EXACT_COUNT_LIMIT + 1) <= EXACT_COUNT_LIMIT
        has = (
            f"has only {bound} distinct {what} problems"
            if exact
            else f"gives at most {bound} distinct {what} problems"
        )
        more = (
            "raise data.difficulty or data.digits for more"
            if spec == "toy"
            else "use the 'toy' task for more"
        )
        raise ConfigError(
            f"{key} = {n}: the {spec!r} task ({task.describe()}) {has}; lower {lower}, or {more}"
        )


def _toy(spec: str, data: Any, split: str) -> list[Any]:
    """A toy task's problems. "validation": the training split's problems after the run's first
    `data.train_size` (sampling is prefix-stable, so they are disjoint from the ones it trains on and,
    as training problems, from the held-out split). Sizes are checked before anything is drawn."""
    task = _toy_task(spec, data)
    if split != "train" and data.eval_size < 1:
        which = "held-out" if split == "heldout" else split
        raise ConfigError(
            f"data.eval_size = {data.eval_size} gives no {which} problems of the {spec!r} task (0 means all "
            "problems only for benchmarks and files); set data.eval_size >= 1"
        )
    if split == "validation":
        n = data.train_size + data.eval_size
        _check_toy_size(
            task, spec, n, "train", "data.train_size + data.eval_size", "data.train_size or data.eval_size"
        )
        try:
            return task.sample(n, "train")[data.train_size :]
        except ValueError as e:
            raise ConfigError(
                f'data.eval_split = "validation" takes data.eval_size problems after the first data.train_size of '
                f"the training split of {spec!r}: {e}; lower data.train_size or data.eval_size"
            ) from None
    key, n = (
        ("data.eval_size", data.eval_size) if split == "heldout" else ("data.train_size", data.train_size)
    )
    _check_toy_size(task, spec, n, split, key)
    try:
        return task.sample(n, split)
    except ValueError as e:  # rejection sampling that ran out of attempts near the split's size
        raise ConfigError(f"{key} = {n}: {e}; lower {key}") from None


def tail_task(spec: str, data: Any) -> ArithmeticTask | None:
    """The task of data spec `spec` when its solutions end in a reward-irrelevant tail (toy-tail-32,
    toy-tail-128: `ArithmeticTask(tail=m)`, whose `label_chars` labels the tail), else None: what the trainer
    builds each batch's tail mask with (`tokencredit.credit.tail`)."""
    if spec not in TOY_VARIANTS:
        return None
    task = _toy_task(spec, data)
    return task if task.tail else None


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
    size_key = "data.train_size" if split == "train" else "data.eval_size"
    out: list[Any] = []
    for part in (x.strip() for x in spec.split(",") if x.strip()):
        if reasoning_gym.is_spec(part):
            out += reasoning_gym.load(part, split=split, size=size or None, size_key=size_key)
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

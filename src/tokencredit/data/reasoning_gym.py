"""reasoning-gym's procedural datasets as training and evaluation problems (optional extra:
``pip install 'tokencredit[reasoning-gym]'``; reasoning-gym is imported only when such data is chosen).

A data source is named ``reasoning-gym:NAME`` with the dataset's parameters as a query::

    reasoning-gym:chain_sum                                         the dataset's own defaults
    reasoning-gym:chain_sum?min_terms=2&max_terms=3&max_digits=1    parameters of its config
    reasoning-gym:chain_sum?max_terms=3&size=1000&seed=7            how many problems, which seed

NAME is any dataset registered in reasoning-gym (``reasoning_gym.factory.DATASETS``) or one of
`PRESETS` (a dataset with parameters chosen here; parameters given in the query override them).
A parameter is converted to the type of the config field's default (true/false, integers,
numbers, strings; a list or tuple as items separated by ``|``: ``operators=+|-``). Commas cannot
appear in a spec: ``data.train`` / ``data.eval`` separate sources with them. On a command line,
quote the spec (``?`` and ``&`` are special to the shell).

Size and seed. The problems are entries 0..size-1 of ``reasoning_gym.create_dataset(NAME, **params,
seed=seed, size=size)``. ``size`` defaults to the caller's (the trainer's ``data.train_size`` for
training, ``data.eval_size`` for evaluation) and ``seed`` to 0. The held-out split is generated
with ``seed + EVAL_SEED_OFFSET``: reasoning-gym seeds entry i with ``seed + i``, so seeds closer
than the size share entries, and the offset keeps the two splits' generators disjoint for any
training size below it. The validation split (``data.eval_split = "validation"``, for tuning) is
generated with ``seed + VALIDATION_SEED_OFFSET``, disjoint from both in the same way. The same spec
in ``data.train`` and ``data.eval`` therefore gives disjoint draws. (A small problem space, such as
sums of two one-digit numbers, repeats questions across any two draws: disjoint seeds, not disjoint
questions.)

Each problem's gold answer is a `tokencredit.rewards.reasoning_gym.GymAnswer`: the entry's
reference answer that also names the entry, so that reasoning-gym's own checker
(``score_answer``) can judge a completion in the reward's worker process.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from typing import Any

from tokencredit.data.loaders import DataError, Problem
from tokencredit.errors import ConfigError, closest
from tokencredit.rewards.custom import parse_bool, parse_query
from tokencredit.rewards.reasoning_gym import EXTRA, GymAnswer, question_sha256

__all__ = ["EVAL_SEED_OFFSET", "PREFIX", "PRESETS", "VALIDATION_SEED_OFFSET", "is_spec", "load", "parse_spec"]

PREFIX = "reasoning-gym:"
EVAL_SEED_OFFSET = 1_000_000_000
VALIDATION_SEED_OFFSET = 2 * EVAL_SEED_OFFSET  # a third seed range, disjoint from train and held-out
HELDOUT_SPLITS = ("heldout", "eval", "test")
# Named settings: name -> (dataset, parameters), chosen so that a small instruct model starts well
# inside (0, 1). SmolLM2-135M-Instruct, greedy, "chat" template, 128 held-out problems (2026-11-25):
#   chain_sum_small (2-3 one-digit terms)                      0.305 +- 0.041
#   chain_sum?min_terms=2&max_terms=2&max_digits=1              0.469 +- 0.044
#   chain_sum (the dataset's defaults: 2-6 terms of 1-4 digits) 0.047 +- 0.026 (64 problems)
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "chain_sum_small": ("chain_sum", {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1}),
}


def is_spec(spec: str) -> bool:
    """Whether a data source names reasoning-gym data (``reasoning-gym:NAME[?params]``)."""
    return isinstance(spec, str) and spec.strip().startswith(PREFIX)


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``"reasoning-gym:chain_sum?max_terms=3"`` -> ``("chain_sum", {"max_terms": "3"})`` (no import
    of reasoning-gym; the values are still strings)."""
    if not is_spec(spec):
        raise ConfigError(f"{spec!r} is not a reasoning-gym data source ({PREFIX}NAME[?key=value&...])")
    body = spec.strip()[len(PREFIX) :]
    name, _, query = body.partition("?")
    name = name.strip()
    if not name:
        raise ConfigError(f"{spec!r}: no dataset name after {PREFIX!r} (e.g. {PREFIX}chain_sum)")
    if "," in body:
        raise ConfigError(f"{spec!r}: a reasoning-gym spec cannot contain a comma (lists are written a|b)")
    return name, parse_query(query, spec)


def _import_gym() -> Any:
    try:
        return importlib.import_module("reasoning_gym")
    except ImportError as e:
        raise ConfigError(f"reasoning-gym data needs the reasoning-gym package: pip install 'tokencredit[{EXTRA}]' ({e})") from e


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _convert(text: str, default: Any, where: str) -> Any:
    """A query value as the type of the field's `default` (bool / int / float / str / list / tuple);
    with no typed default, an integer, a number, true/false or else the string."""
    if isinstance(default, bool):
        return parse_bool(text, where)
    try:
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
        if isinstance(default, str):
            return text
        if isinstance(default, list | tuple):
            first = default[0] if default else None
            return [_convert(x.strip(), first, where) for x in text.split("|") if x.strip()]
    except ValueError:
        raise ConfigError(f"{where}: expected a value like {default!r}, got {text!r}") from None
    if default is not None:
        raise ConfigError(f"{where}: fields of type {type(default).__name__} cannot be set from a spec")
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    low = text.lower()
    return {"true": True, "false": False, "none": None}.get(low, text)


def _resolve(spec: str) -> tuple[str, dict[str, str]]:
    """Dataset name and raw parameters, a preset expanded (the query overrides the preset)."""
    name, raw = parse_spec(spec)
    if name in PRESETS:
        base, params = PRESETS[name]
        return base, {**{k: "|".join(map(str, v)) if isinstance(v, list | tuple) else str(v) for k, v in params.items()}, **raw}
    return name, raw


def _config(gym: Any, spec: str, name: str, raw: dict[str, str]) -> dict[str, Any]:
    datasets = gym.factory.DATASETS
    if name not in datasets:
        names = sorted([*datasets, *PRESETS])
        raise ConfigError(f"{spec!r}: reasoning-gym has no dataset {name!r}" + closest(name, names))
    _, config_cls = datasets[name]
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    out: dict[str, Any] = {}
    for key, text in raw.items():
        if key not in fields:
            raise ConfigError(
                f"{spec!r}: {name} has no parameter {key!r}{closest(key, fields)}; valid: {', '.join(sorted(fields))}"
            )
        out[key] = _convert(text, _default(fields[key]), f"{spec!r}: {key}")
    return out


def load(spec: str, *, split: str = "train", size: int | None = None) -> list[Problem]:
    """The problems of a reasoning-gym data source (module docstring): `split` "train", a held-out
    split ("heldout" / "eval" / "test": the seed plus `EVAL_SEED_OFFSET`) or "validation" (the seed
    plus `VALIDATION_SEED_OFFSET`); `size` problems unless the spec sets ``size`` (else the dataset's
    default)."""
    name, raw = _resolve(spec)
    if split not in ("train", "validation", *HELDOUT_SPLITS):
        raise ConfigError(f"{spec!r}: unknown split {split!r}; use train, heldout or validation")
    gym = _import_gym()
    params = _config(gym, spec, name, raw)
    if "size" not in params and size is not None:
        params["size"] = size
    params.setdefault("seed", 0)
    if not isinstance(params["seed"], int) or (params.get("size") is not None and not isinstance(params["size"], int)):
        raise ConfigError(f"{spec!r}: seed and size must be integers")
    if split in HELDOUT_SPLITS:
        params["seed"] += EVAL_SEED_OFFSET
    elif split == "validation":
        params["seed"] += VALIDATION_SEED_OFFSET
    try:
        json.dumps(params)
    except TypeError as e:
        raise ConfigError(f"{spec!r}: parameters must be plain values ({e})") from None
    try:
        ds = gym.create_dataset(name, **params)
    except (AssertionError, ValueError, TypeError) as e:
        raise ConfigError(f"{spec!r}: reasoning-gym rejects the configuration ({type(e).__name__}: {e})") from None
    params["size"] = len(ds)
    tag = question_sha256(json.dumps([name, params], sort_keys=True))[:8]
    out: list[Problem] = []
    for i in range(len(ds)):
        entry = ds[i]
        question, answer = entry.get("question"), entry.get("answer")
        if not isinstance(question, str) or not question.strip():
            raise DataError(f"{spec!r}: entry {i} has no question")
        gold = GymAnswer(
            "" if answer is None else str(answer),
            dataset=name, config=params, index=i, question_sha256=question_sha256(question),
        )  # fmt: skip
        out.append(Problem(id=f"{name}-{tag}-{i}", problem=question, answer=gold))
    return out

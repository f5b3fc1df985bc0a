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
import re
from typing import Any

from tokencredit.data.loaders import DataError, Problem
from tokencredit.errors import ConfigError, closest
from tokencredit.rewards.custom import parse_bool, parse_query
from tokencredit.rewards.reasoning_gym import EXTRA, GymAnswer, question_sha256

__all__ = [
    "EVAL_SEED_OFFSET",
    "MAX_SIZE",
    "PREFIX",
    "PRESETS",
    "VALIDATION_SEED_OFFSET",
    "check_spec",
    "is_spec",
    "load",
    "parse_spec",
]

PREFIX = "reasoning-gym:"
EVAL_SEED_OFFSET = 1_000_000_000
VALIDATION_SEED_OFFSET = 2 * EVAL_SEED_OFFSET  # a third seed range, disjoint from train and held-out
HELDOUT_SPLITS = ("heldout", "eval", "test")
MAX_SIZE = 100_000
"""Most problems of one reasoning-gym source: every one is generated before training starts (chain_sum:
about 7,000 a second, some datasets far fewer), and a run draws from them with replacement, epoch after
epoch. A larger ``size`` (in the spec, or ``data.train_size`` / ``data.eval_size``) is a ConfigError."""
MAX_SEED = 2**62  # seed + VALIDATION_SEED_OFFSET + size stays a 64-bit integer
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
        raise ConfigError(
            f"reasoning-gym data needs the reasoning-gym package: pip install 'tokencredit[{EXTRA}]' ({e})"
        ) from e


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


def _integer(spec: str, key: str, text: str) -> int:
    """The spec's ``size`` (1..`MAX_SIZE`) or ``seed`` (0..`MAX_SEED`) as an integer; a ConfigError naming
    the option and its range otherwise (``size=10**12``, ``size=-3``, ``size=2.5``)."""
    low, high = (1, MAX_SIZE) if key == "size" else (0, MAX_SEED)
    what = "the number of problems" if key == "size" else "the generator's seed"
    digits = text.strip()
    if not re.fullmatch(r"[+-]?\d+(?:_\d+)*", digits):
        raise ConfigError(f"{spec!r}: {key}={text!r} is not an integer ({what}: {low}..{high})")
    # a number of over 40 digits is out of range either way (and int() refuses more than 4300 digits)
    value = int(digits) if len(digits) <= 40 else (high + 1 if digits[0] != "-" else low - 1)
    if not low <= value <= high:
        more = (
            f"; every problem is generated up front, so tokencredit builds at most {MAX_SIZE} per source"
            if key == "size" and value > high
            else ""
        )
        shown = digits if len(digits) <= 40 else f"{digits[:12]}...({len(digits)} digits)"
        raise ConfigError(f"{spec!r}: {key}={shown} is out of range ({what}: {low}..{high}){more}")
    return value


def _resolve(spec: str) -> tuple[str, dict[str, str]]:
    """Dataset name and raw parameters, a preset expanded (the query overrides the preset)."""
    name, raw = parse_spec(spec)
    if name in PRESETS:
        base, params = PRESETS[name]
        return base, {
            **{
                k: "|".join(map(str, v)) if isinstance(v, list | tuple) else str(v) for k, v in params.items()
            },
            **raw,
        }
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
        if key in ("size", "seed"):
            out[key] = _integer(spec, key, text)
            continue
        if key not in fields:
            raise ConfigError(
                f"{spec!r}: {name} has no parameter {key!r}{closest(key, fields)}; valid: {', '.join(sorted(fields))}"
            )
        out[key] = _convert(text, _default(fields[key]), f"{spec!r}: {key}")
    return out


def _check_size(spec: str, size: int | None, size_key: str) -> None:
    """The caller's `size` (`size_key`: the config key it came from), within 1..`MAX_SIZE`."""
    if size is None:
        return
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ConfigError(f"{size_key} = {size!r} for {spec!r}: expected an integer >= 1")
    if size > MAX_SIZE:
        raise ConfigError(
            f"{size_key} = {size} for {spec!r} is above {MAX_SIZE}, the most reasoning-gym problems tokencredit "
            f"builds per source (every one is generated up front); lower {size_key}, or set size= in the spec"
        )


def _prepared(spec: str, split: str, size: int | None, size_key: str) -> tuple[Any, str, dict[str, Any]]:
    """(the reasoning_gym module, the dataset's name, its checked parameters with size and seed) of a spec."""
    name, raw = _resolve(spec)
    if split not in ("train", "validation", *HELDOUT_SPLITS):
        raise ConfigError(f"{spec!r}: unknown split {split!r}; use train, heldout or validation")
    gym = _import_gym()
    params = _config(gym, spec, name, raw)
    if "size" not in params:
        _check_size(spec, size, size_key)
        if size is not None:
            params["size"] = size
    params.setdefault("seed", 0)
    if split in HELDOUT_SPLITS:
        params["seed"] += EVAL_SEED_OFFSET
    elif split == "validation":
        params["seed"] += VALIDATION_SEED_OFFSET
    try:
        json.dumps(params)
    except TypeError as e:
        raise ConfigError(f"{spec!r}: parameters must be plain values ({e})") from None
    return gym, name, params


def _create(gym: Any, spec: str, name: str, params: dict[str, Any]) -> Any:
    try:
        return gym.create_dataset(name, **params)
    except (AssertionError, ValueError, TypeError) as e:
        raise ConfigError(
            f"{spec!r}: reasoning-gym rejects the configuration ({type(e).__name__}: {e})"
        ) from None


def check_spec(spec: str, *, size: int | None = None, size_key: str = "size") -> None:
    """What `load` would refuse (the name, the parameters and their types, the size and seed, the
    configuration reasoning-gym checks), found without generating the problems: a ConfigError."""
    gym, name, params = _prepared(spec, "train", size, size_key)
    _create(gym, spec, name, {**params, "size": 1})


def load(
    spec: str, *, split: str = "train", size: int | None = None, size_key: str = "size"
) -> list[Problem]:
    """The problems of a reasoning-gym data source (module docstring): `split` "train", a held-out
    split ("heldout" / "eval" / "test": the seed plus `EVAL_SEED_OFFSET`) or "validation" (the seed
    plus `VALIDATION_SEED_OFFSET`); `size` problems unless the spec sets ``size`` (else the dataset's
    default). At most `MAX_SIZE` problems: a larger ``size`` in the spec, or a larger `size` (an error
    naming `size_key`, the config key it came from), is a ConfigError before anything is generated."""
    gym, name, params = _prepared(spec, split, size, size_key)
    ds = _create(gym, spec, name, params)
    params["size"] = len(ds)
    if params["size"] > MAX_SIZE:  # the dataset's own default size
        raise ConfigError(
            f"{spec!r}: the dataset's default size {params['size']} is above {MAX_SIZE}, the most problems "
            "tokencredit builds per source; set size= in the spec"
        )
    tag = question_sha256(json.dumps([name, params], sort_keys=True))[:8]
    out: list[Problem] = []
    for i in range(len(ds)):
        entry = ds[i]
        question, answer = entry.get("question"), entry.get("answer")
        if not isinstance(question, str) or not question.strip():
            raise DataError(f"{spec!r}: entry {i} has no question")
        gold = GymAnswer(
            "" if answer is None else str(answer),
            dataset=name,
            config=params,
            index=i,
            question_sha256=question_sha256(question),
        )
        out.append(Problem(id=f"{name}-{tag}-{i}", problem=question, answer=gold))
    return out

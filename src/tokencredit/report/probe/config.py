"""The probe's settings: how rollouts are sampled (data, template, temperature) and scored (k values,
random draws, the Monte-Carlo oracle), with the defaults a probed training run or toy model supplies.

Data: "toy" (the synthetic task of `difficulty` / `digits` / `operand_digits`), "toy-hard" (the task
of the hard toy warm start, `tokencredit.models.toy_task`), or a shipped benchmark name / data file
as `tokencredit.evaluation.load_benchmark` reads it. Only the synthetic tasks have checker truth
(the first wrong token); on other data only the oracle's metrics can be scored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tokencredit import advantages
from tokencredit.data import math_benchmarks, reasoning_gym
from tokencredit.data.templates import check_template
from tokencredit.errors import ConfigError, closest
from tokencredit.models import TOY_VARIANTS, toy_task
from tokencredit.oracle import DEFAULT_DELTA
from tokencredit.recipes import Recipe
from tokencredit.rollout import SamplingSettings
from tokencredit.train.config import TrainConfig

__all__ = [
    "DEFAULT_GRAD_BATCHES",
    "DEFAULT_KS",
    "DEFAULT_MAX_NEW_TOKENS",
    "DEFAULT_METHODS",
    "ProbeConfig",
    "default_data",
    "default_max_new_tokens",
    "parse_ks",
    "probe_config",
]

DEFAULT_METHODS = (
    "grpo,ktae,delta,gspo,ptrace,strace,entropy-80-20,surprisal,entropy-reduction,gcpo,arca,policy-divergence"
)
DEFAULT_KS: tuple[int, ...] = (1, 3, 10)
DEFAULT_GRAD_BATCHES = 4
"""Batches of whole problems the oracle's rollouts are split into for the gradient cosines (`gradients`)."""
DEFAULT_MAX_NEW_TOKENS = 96
DEFAULT_SAMPLING = SamplingSettings(temperature=1.0, top_p=1.0, max_new_tokens=DEFAULT_MAX_NEW_TOKENS, batch_size=64)
"""The probe's sampling when neither the options nor a probed run say otherwise."""


@dataclass
class ProbeConfig:
    """How the probe's rollouts are sampled and scored; `probe_config` builds a checked one from the options.

    The problems:
      data              "toy" (the synthetic task below), "toy-hard", a shipped benchmark name or a data file.
      groups            problems (groups) probed; on a data set at most all of its problems.
      difficulty        arithmetic steps of the synthetic task (--data toy).
      digits            digits of its running totals.
      operand_digits    digits of its added operands (None: the task's default).
      seed              picks the problems, seeds the sampling, the oracle and the random baselines.
    The rollouts:
      group_size        rollouts per problem (G >= 2, for a group baseline).
      template          the prompt template (a name, or a string containing {problem}).
      sampling          how they are sampled (`SamplingSettings`: temperature, top_p 1, max_new_tokens);
                        its batch_size is the probe's rows per generate call and also per forward pass
                        of the signals and per generate call of the Monte-Carlo estimates.
    The scores:
      advantage         the group estimator of plain credit methods (a name of `tokencredit.advantages`).
      advantage_params  its parameters (a probed run's recipe's, else none).
      ks                the k values of blame@k, sorted and distinct.
      random_draws      draws averaged for the random (chance) baseline.
      oracle_k          Monte-Carlo continuations per state for the ground-truth A* (0: no oracle table).
      oracle_delta      the oracle's skip: tokens of probability >= 1 - delta get A* = 0.
      bootstrap         resamples of whole groups for the fidelity statistics' standard errors
                        (`tokencredit.oracle.fidelity_stderr`; 0: none).
      grad_batches      batches of whole problems for the gradient cosines with the oracle's and GRPO's
                        gradient, their spread the standard error (`report.probe.gradients`; 0: none);
                        with oracle_k even also their split-half noise ceiling.

    The settings are grouped in the docstring, not in nested objects (but for the sampling), because
    they are the flat options of ``tokencredit probe`` and the flat "config" of its JSON (`record`).
    """

    groups: int = 64
    group_size: int = 8
    seed: int = 0
    difficulty: int = 3
    digits: int = 2
    operand_digits: int | None = None
    template: str = "qwen-math"
    sampling: SamplingSettings = DEFAULT_SAMPLING
    advantage: str = "grpo"
    advantage_params: dict[str, Any] = field(default_factory=dict)
    ks: tuple[int, ...] = DEFAULT_KS
    random_draws: int = 20
    data: str = "toy"
    oracle_k: int = 0
    oracle_delta: float = DEFAULT_DELTA
    bootstrap: int = 200
    grad_batches: int = DEFAULT_GRAD_BATCHES

    @property
    def synthetic(self) -> bool:
        """The data is a synthetic task, with checker truth (the first wrong token)."""
        return self.data in TOY_VARIANTS

    def record(self) -> dict[str, Any]:
        """The settings as the probe's JSON "config" holds them: flat, the sampling's temperature,
        max_new_tokens and batch_size among the others."""
        d = asdict(self)
        s = d.pop("sampling")
        keys = ("groups", "group_size", "seed", "difficulty", "digits", "operand_digits", "template")
        head = {k: d.pop(k) for k in keys}
        tail = {k: d.pop(k) for k in ("advantage", "advantage_params", "ks", "random_draws")}
        return {**head, "temperature": s["temperature"], "max_new_tokens": s["max_new_tokens"], **tail,
                "batch_size": s["batch_size"], **d}  # fmt: skip


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


def default_data(run_cfg: TrainConfig | None, model: str | None = None) -> str:
    """The synthetic task a probed run or model implies: a run's `data.train` when it names a toy
    task ("toy", "toy-hard"), else the toy model's own task ("toy-hard" for --model toy-hard), else "toy"."""
    if run_cfg is not None:
        return run_cfg.data.train if run_cfg.data.train in TOY_VARIANTS else "toy"
    return model if model in TOY_VARIANTS else "toy"


def default_max_new_tokens(data: str) -> int:
    """The probe's generation limit on `data`: 96, or the toy task's own budget when that is longer
    (toy-hard's six-step solutions need `TOY_VARIANTS["toy-hard"].max_new_tokens` = 128)."""
    variant = TOY_VARIANTS.get(data)
    return (
        max(DEFAULT_MAX_NEW_TOKENS, variant.max_new_tokens) if variant is not None else DEFAULT_MAX_NEW_TOKENS
    )


def _check_data(data: str) -> None:
    """A toy task, a shipped benchmark, reasoning-gym data or an existing data file / directory (ConfigError
    otherwise)."""
    if data in TOY_VARIANTS or data in math_benchmarks.COUNTS or reasoning_gym.is_spec(data) or Path(data).exists():
        return
    names = [*TOY_VARIANTS, *math_benchmarks.NAMES]
    raise ConfigError(
        f"--data: {data!r} is neither a toy task, a shipped benchmark nor an existing file{closest(data, names)}; "
        f"one of {', '.join(names)}, or a .jsonl / .json / .parquet file or a datasets directory"
    )


def _task_settings(
    data: str, run_cfg: TrainConfig | None, given: dict[str, int | None]
) -> tuple[int, int, int | None]:
    """(difficulty, digits, operand_digits) of the synthetic task: for "toy" the options in `given`,
    else the run's toy settings, else the defaults; for "toy-hard" its warm start's (the options are
    refused: they would make another task). Other data keep the defaults (unused)."""
    if data != "toy":
        named = [k for k, v in given.items() if v is not None]
        if named:
            raise ConfigError(
                f"--{named[0].replace('_', '-')} sets the task of --data toy, not of --data {data}"
            )
        if data in TOY_VARIANTS:
            task = toy_task(name=data)
            return task.difficulty, task.digits, task.operand_digits
        return 3, 2, None
    run_task = run_cfg.data if run_cfg is not None and run_cfg.data.train == "toy" else None
    return (
        given["difficulty"] or (run_task.difficulty if run_task is not None else 3),
        given["digits"] or (run_task.digits if run_task is not None else 2),
        given["operand_digits"] or getattr(run_task, "operand_digits", None),
    )


def _check_counts(**counts: int) -> None:
    for name, value in counts.items():
        if value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if counts["group_size"] < 2:
        raise ConfigError(f"--group-size must be >= 2 for a group baseline, got {counts['group_size']}")


def _sampling(
    run_cfg: TrainConfig | None, template: str | None, temperature: float | None
) -> tuple[str, float]:
    """(template, temperature): the options, else the run's, else qwen-math and 1.0 (checked)."""
    tpl = template or (run_cfg.data.template if run_cfg is not None else "qwen-math")
    temp = (
        temperature
        if temperature is not None
        else (run_cfg.rollout.temperature if run_cfg is not None else 1.0)
    )
    check_template(tpl)
    if temp <= 0:
        raise ConfigError(f"--temperature must be > 0 (the probe samples groups), got {temp}")
    return tpl, float(temp)


def _check_oracle(data: str, k: int, delta: float, bootstrap: int, grad_batches: int) -> None:
    """The oracle table's options: K, delta, the bootstrap resamples and the gradient batches."""
    if bootstrap != 0 and bootstrap < 2:
        raise ConfigError(f"--bootstrap must be 0 (no standard errors) or >= 2 resamples, got {bootstrap}")
    if grad_batches != 0 and grad_batches < 2:
        raise ConfigError(
            f"--grad-batches must be 0 (no gradient cosines) or >= 2 batches (a standard error), got {grad_batches}"
        )
    if k != 0 and k < 2:
        raise ConfigError(
            f"--oracle must be 0 (off) or >= 2 continuations per state (a standard error), got {k}"
        )
    if not 0.0 <= delta < 1.0:
        raise ConfigError(f"--oracle-delta must be in [0, 1), got {delta}")
    if k == 0 and data not in TOY_VARIANTS:
        raise ConfigError(
            f"--data {data} has no checker truth (the first wrong token): only the Monte-Carlo oracle's "
            "metrics can be scored there; pass --oracle K (e.g. 8)"
        )


def probe_config(
    run_cfg: TrainConfig | None,
    recipe: Recipe | None,
    *,
    groups: int,
    group_size: int,
    seed: int,
    max_new_tokens: int | None,
    random_draws: int,
    batch_size: int,
    ks: str | Sequence[int],
    difficulty: int | None = None,
    digits: int | None = None,
    operand_digits: int | None = None,
    template: str | None = None,
    temperature: float | None = None,
    advantage: str | None = None,
    model: str | None = None,
    data: str | None = None,
    oracle: int = 0,
    oracle_delta: float = DEFAULT_DELTA,
    bootstrap: int = 200,
    grad_batches: int = DEFAULT_GRAD_BATCHES,
) -> ProbeConfig:
    """A checked ProbeConfig; options left None take a probed run's settings (toy task, template, temperature,
    estimator), else the defaults (`default_data`, `default_max_new_tokens` of the data). `ks` may be "1,3,10"."""
    data = data or default_data(run_cfg, model)
    _check_data(data)
    max_new_tokens = max_new_tokens if max_new_tokens is not None else default_max_new_tokens(data)
    _check_counts(
        groups=groups, group_size=group_size, max_new_tokens=max_new_tokens, batch_size=batch_size,
        random_draws=random_draws,
    )  # fmt: skip
    _check_oracle(data, oracle, oracle_delta, bootstrap, grad_batches)
    task = _task_settings(
        data, run_cfg, {"difficulty": difficulty, "digits": digits, "operand_digits": operand_digits}
    )
    template, temperature = _sampling(run_cfg, template, temperature)
    sampling = SamplingSettings(
        temperature=temperature, top_p=1.0, max_new_tokens=max_new_tokens, batch_size=batch_size
    )
    return ProbeConfig(
        groups=groups,
        group_size=group_size,
        seed=seed,
        difficulty=task[0],
        digits=task[1],
        operand_digits=task[2],
        template=template,
        sampling=sampling,
        advantage=_estimator(advantage, recipe),
        advantage_params=dict(recipe.advantage_params) if recipe is not None and advantage is None else {},
        ks=parse_ks(ks) if isinstance(ks, str) else tuple(ks),
        random_draws=random_draws,
        data=data,
        oracle_k=oracle,
        oracle_delta=float(oracle_delta),
        bootstrap=bootstrap,
        grad_batches=grad_batches,
    )

"""The probe's settings: how rollouts are sampled (data, template, temperature) and scored (k values,
random draws, the Monte-Carlo oracle), with the defaults a probed training run or toy model supplies.

Data: "toy" (the synthetic task of `difficulty` / `digits` / `operand_digits`), "toy-hard" (the task
of the hard toy warm start, `tokencredit.models.toy_task`), or a shipped benchmark name / data file
as `tokencredit.evaluation.load_benchmark` reads it. Only the synthetic tasks have checker truth
(the first wrong token); on other data only the oracle's metrics can be scored.

Every size is checked before a model loads: the products that set memory and time against
`MAX_ROLLOUT_TOKENS`, `MAX_ORACLE_CONTINUATIONS` and `MAX_BATCH_TOKENS`, --groups against the synthetic
task's held-out problems, --bootstrap / --random-draws / --ks against their bounds; a reasoning-gym spec
or a data file is read (checked) here too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tokencredit import advantages
from tokencredit.data import load_problems, math_benchmarks, reasoning_gym
from tokencredit.data.synthetic import MAX_DIFFICULTY, MAX_DIGITS, ArithmeticTask
from tokencredit.data.templates import check_template
from tokencredit.errors import ConfigError, closest
from tokencredit.models import TOY_VARIANTS, toy_task
from tokencredit.oracle import DEFAULT_DELTA
from tokencredit.recipes import Recipe
from tokencredit.rollout import SamplingSettings
from tokencredit.rollout.prime_rl import export_record
from tokencredit.train.config import RolloutConfig, TrainConfig

__all__ = [
    "DEFAULT_GRAD_BATCHES",
    "DEFAULT_KS",
    "DEFAULT_MAX_NEW_TOKENS",
    "DEFAULT_METHODS",
    "MAX_BATCH_TOKENS",
    "MAX_BOOTSTRAP",
    "MAX_K",
    "MAX_ORACLE_CONTINUATIONS",
    "MAX_RANDOM_DRAWS",
    "MAX_ROLLOUT_TOKENS",
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
DEFAULT_SAMPLING = SamplingSettings(
    temperature=1.0, top_p=1.0, max_new_tokens=DEFAULT_MAX_NEW_TOKENS, batch_size=64
)
"""The probe's sampling when neither the options nor a probed run say otherwise."""

# Bounds of the probe's sizes, checked before any model loads (`probe_config`). Each is far above what
# the documented experiments use (at most 128 groups x 8 x 128 tokens, K = 32, 256 rows per call).
MAX_ROLLOUT_TOKENS = 2**25
"""groups x group size x max_new_tokens: every response token's signals and credits (some 200 bytes
over a dozen methods) stay in memory until the end, so 2**25 tokens are about 7 GB."""
MAX_ORACLE_CONTINUATIONS = 2**28
"""groups x group size x max_new_tokens x K: the continuations the Monte-Carlo oracle may sample (one per
state and draw, each up to max_new_tokens long): 2**28 is hours of generation on a GPU."""
MAX_BATCH_TOKENS = 2**22
"""batch_size x max_new_tokens: the tokens of one generate / forward call (its memory)."""
MAX_BOOTSTRAP = 10_000
"""Bootstrap resamples (a standard error is settled by a few hundred; each resample re-scores every credit)."""
MAX_RANDOM_DRAWS = 10_000
"""Draws of the random baseline (its mean's error shrinks as 1 / sqrt(draws); each draw is scored in full)."""
MAX_K = 1_000_000
"""The largest k of blame@k (any k beyond a response's length already scores 100%)."""
MAX_SEED = 2**63 - 1  # torch generators take a 64-bit seed


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
                        gradient, their spread the standard error (`probe.gradients`; 0: none);
                        with oracle_k even also their split-half noise ceiling.
      prompts_per_step  problems (groups) per training batch: every credit is computed on batches of
                        this many groups, as the trainer computes it per step (a batch statistic, e.g.
                        DelTA's or the 80/20 mask's, is the training batch's); 0: the whole probe set.
      prompts_per_step_source  where that number came from (the run, the trainer's default, the option).
      two_groups        sample two independent groups of group_size per problem (twice the rollouts and
                        the oracle's cost) for the noise decomposition of the gradients (`probe.noise`).

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
    prompts_per_step: int = RolloutConfig.prompts_per_step
    prompts_per_step_source: str = "the trainer's default rollout.prompts_per_step"
    two_groups: bool = False

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
        return {
            **head,
            "temperature": s["temperature"],
            "max_new_tokens": s["max_new_tokens"],
            **tail,
            "batch_size": s["batch_size"],
            **d,
        }


def parse_ks(text: str) -> tuple[int, ...]:
    """The sorted, distinct k values of blame@k from "1,3,10"."""
    try:
        ks = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise ConfigError(f"--ks: expected comma-separated integers, got {text!r}") from None
    if not ks or ks[0] < 1 or ks[-1] > MAX_K:
        raise ConfigError(f"--ks: expected integers in 1..{MAX_K}, got {text!r}")
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
    otherwise); reasoning-gym data and files are read now (a spec's parameters checked, a file parsed), so
    that a bad one is named before any model loads."""
    if data in TOY_VARIANTS or data in math_benchmarks.COUNTS:
        return
    if reasoning_gym.is_spec(data):
        reasoning_gym.check_spec(data)
        return
    if Path(data).exists():
        where = export_record(Path(data))
        if where is not None:
            raise ConfigError(
                f"--data {where}: a prime-rl token export (token ids, loss mask and advantages per sequence) has no "
                "'problem' text and no gold 'answer', which probe needs to pose each problem again and score its own "
                f"rollouts; give a problem file (docs/inputs.md), or read the export with tokencredit explain --jsonl "
                f"{data} --model M"
            )
        if not load_problems(data):
            raise ConfigError(f"--data {data}: no problems (the file is empty?)")
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

    def pick(key: str, default: int | None) -> int | None:
        if given[key] is not None:
            return given[key]
        return getattr(run_task, key, default) if run_task is not None else default

    return pick("difficulty", 3), pick("digits", 2), pick("operand_digits", None)


def _toy_task(
    settings: tuple[int, int, int | None], given: dict[str, int | None], seed: int
) -> ArithmeticTask:
    """The synthetic task of --data toy's settings; a bad one is a ConfigError naming its option and range."""
    difficulty, digits, operand_digits = settings
    for key, value, high in (("difficulty", difficulty, MAX_DIFFICULTY), ("digits", digits, MAX_DIGITS)):
        if not 1 <= value <= high:
            source = f"--{key}" if given[key] is not None else f"the probed run's data.{key}"
            raise ConfigError(f"{source} must be in 1..{high}, got {value}")
    if operand_digits is not None and not 1 <= operand_digits <= digits:
        raise ConfigError(f"--operand-digits must be in 1..{digits} (--digits), got {operand_digits}")
    kw = {} if operand_digits is None else {"operand_digits": operand_digits}
    return ArithmeticTask(difficulty=difficulty, digits=digits, seed=seed, **kw)


def _check_groups_fit(task: ArithmeticTask, data: str, groups: int) -> None:
    """--groups within the held-out problems of the synthetic task (`ArithmeticTask.max_sample`)."""
    bound = task.max_sample("heldout", groups)
    if groups > bound:
        raise ConfigError(
            f"--groups {groups}: the {data!r} task ({task.describe()}) gives at most {bound} distinct held-out "
            f"problems; lower --groups" + (", or raise --difficulty or --digits" if data == "toy" else "")
        )


def _check_sizes(
    groups: int, group_size: int, max_new_tokens: int, batch_size: int, oracle: int, seed: int
) -> None:
    """The products that decide the probe's memory and time, within `MAX_ROLLOUT_TOKENS`,
    `MAX_ORACLE_CONTINUATIONS` and `MAX_BATCH_TOKENS`; a ConfigError naming the option and its bound."""
    if not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"--seed must be in 0..{MAX_SEED} (2**63 - 1), got {seed}")
    tokens = groups * group_size * max_new_tokens
    if tokens > MAX_ROLLOUT_TOKENS:
        most = max(1, MAX_ROLLOUT_TOKENS // (group_size * max_new_tokens))
        raise ConfigError(
            f"--groups {groups} x --group-size {group_size} x --max-new-tokens {max_new_tokens} = {tokens:,} response "
            f"tokens, above the probe's bound of {MAX_ROLLOUT_TOKENS:,} (2**25: each token's signals and credits, "
            f"some 200 bytes, stay in memory); at most --groups {most} at this --group-size and --max-new-tokens"
        )
    if oracle and tokens * oracle > MAX_ORACLE_CONTINUATIONS:
        most = max(2, MAX_ORACLE_CONTINUATIONS // tokens)
        raise ConfigError(
            f"--oracle {oracle}: up to {tokens:,} states (--groups x --group-size x --max-new-tokens) x K = "
            f"{tokens * oracle:,} continuations, above the probe's bound of {MAX_ORACLE_CONTINUATIONS:,} (2**28); "
            f"at most --oracle {most} at these sizes"
        )
    if batch_size * max_new_tokens > MAX_BATCH_TOKENS:
        most = max(1, MAX_BATCH_TOKENS // max_new_tokens)
        raise ConfigError(
            f"--batch-size {batch_size} x --max-new-tokens {max_new_tokens} = {batch_size * max_new_tokens:,} tokens "
            f"per call, above the probe's bound of {MAX_BATCH_TOKENS:,} (2**22); at most --batch-size {most}"
        )


def _check_counts(**counts: int) -> None:
    for name, value in counts.items():
        if value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if counts["group_size"] < 2:
        raise ConfigError(f"--group-size must be >= 2 for a group baseline, got {counts['group_size']}")
    if counts["random_draws"] > MAX_RANDOM_DRAWS:
        raise ConfigError(f"--random-draws must be in 1..{MAX_RANDOM_DRAWS}, got {counts['random_draws']}")


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
    if not math.isfinite(temp) or temp <= 0:
        raise ConfigError(f"--temperature must be a finite number > 0 (the probe samples groups), got {temp}")
    return tpl, float(temp)


def _check_oracle(data: str, k: int, delta: float, bootstrap: int, grad_batches: int) -> None:
    """The oracle table's options: K, delta, the bootstrap resamples and the gradient batches."""
    if bootstrap != 0 and not 2 <= bootstrap <= MAX_BOOTSTRAP:
        raise ConfigError(
            f"--bootstrap must be 0 (no standard errors) or 2..{MAX_BOOTSTRAP} resamples, got {bootstrap}"
        )
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


def _prompts_per_step(run_cfg: TrainConfig | None, given: int | None) -> tuple[int, str]:
    """(problems per credit batch, where it came from): the option, else the probed run's
    rollout.prompts_per_step, else the trainer's default."""
    if given is not None:
        if given < 0:
            raise ConfigError(
                f"--prompts-per-step must be >= 0 (0: the whole probe set in one batch), got {given}"
            )
        return given, "--prompts-per-step"
    if run_cfg is not None:
        return run_cfg.rollout.prompts_per_step, "the probed run's rollout.prompts_per_step"
    return RolloutConfig.prompts_per_step, "the trainer's default rollout.prompts_per_step"


def _check_two_groups(two_groups: bool, oracle: int, grad_batches: int) -> None:
    if two_groups and (not oracle or not grad_batches):
        raise ConfigError(
            "--two-groups feeds the noise decomposition of the gradient cosines: it needs --oracle K and "
            "--grad-batches B > 0"
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
    prompts_per_step: int | None = None,
    two_groups: bool = False,
) -> ProbeConfig:
    """A checked ProbeConfig; options left None take a probed run's settings (toy task, template, temperature,
    estimator, rollout.prompts_per_step), else the defaults (`default_data`, `default_max_new_tokens` of the
    data, the trainer's). `ks` may be "1,3,10"."""
    data = data or default_data(run_cfg, model)
    _check_data(data)
    max_new_tokens = max_new_tokens if max_new_tokens is not None else default_max_new_tokens(data)
    _check_counts(
        groups=groups,
        group_size=group_size,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        random_draws=random_draws,
    )
    _check_oracle(data, oracle, oracle_delta, bootstrap, grad_batches)
    _check_two_groups(two_groups, oracle, grad_batches)
    per_step, per_step_source = _prompts_per_step(run_cfg, prompts_per_step)
    _check_sizes(groups, group_size * (2 if two_groups else 1), max_new_tokens, batch_size, oracle, seed)
    given = {"difficulty": difficulty, "digits": digits, "operand_digits": operand_digits}
    task = _task_settings(data, run_cfg, given)
    if data in TOY_VARIANTS:
        _check_groups_fit(_toy_task(task, given, seed), data, groups)
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
        prompts_per_step=per_step,
        prompts_per_step_source=per_step_source,
        two_groups=two_groups,
    )

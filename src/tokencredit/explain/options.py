"""What an explain report is asked for (`ExplainOptions`, one field per command-line flag) and what it
resolves to (`Source`: the groups, and the template, temperature, estimator and model that go with
them: the run's own settings for a run directory, the defaults for a JSONL file)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokencredit import advantages
from tokencredit.critic import critic_recipes, needs_values
from tokencredit.data.templates import check_template
from tokencredit.errors import ConfigError, closest
from tokencredit.explain.inputs import GroupInput, load_run_rollouts
from tokencredit.explain.jsonl import load_jsonl
from tokencredit.explain.selection import check_kind, parse_indices
from tokencredit.recipes import Recipe
from tokencredit.rollout.prime_rl import export_root
from tokencredit.train.config import TrainConfig
from tokencredit.train.rundir import RunDir

__all__ = ["DEFAULT_MAX_TOKENS", "DEFAULT_METHODS", "ExplainOptions", "Source", "read_source"]

DEFAULT_METHODS = "ktae,delta,strace,arca,uniform"
# tokens of a completion scored and shown (`--max-tokens`): bounds the forward's memory and the page's size
DEFAULT_MAX_TOKENS = 8192


@dataclass
class ExplainOptions:
    """An explain report's settings; None means "the run's, else the default" (see `read_source`)."""

    run_dir: str | Path | None = None
    jsonl: str | Path | None = None
    model: str | Path | None = None  # required with jsonl; default RUN_DIR/final
    step: int | None = None
    # comma-separated credit methods and/or recipes, and "saved" (the input's Â)
    methods: str = DEFAULT_METHODS
    groups: int | None = None  # how many groups to show (default `selection.DEFAULT_COUNT`)
    # which kind of group (`selection.GROUP_KINDS`); None: groups with non-zero credit, rewards that differ first
    select: str | None = None
    group_index: str | Sequence[int] | None = None  # the groups to show by 0-based index ("3,7,12")
    out: str | Path | None = None
    advantage: str | None = None
    template: str | None = None
    temperature: float | None = None
    device: str = "auto"
    batch_size: int = 16  # rows per forward when recomputing signals
    png: str | Path | None = None  # also a static picture of the first group (`picture.draw_png`)
    max_tokens: int = DEFAULT_MAX_TOKENS  # a longer completion is cut to its first max_tokens tokens (noted)
    # a run whose trained critic gives `values` (ppo / bpco columns); default: the explained run's own, if any
    critic: str | Path | None = None

    def check(self) -> None:
        """Raise ConfigError (naming the flag) for settings that contradict each other or are out of range."""
        if (self.run_dir is None) == (self.jsonl is None):
            raise ConfigError("give either a RUN_DIR or --jsonl FILE (with --model PATH)")
        if self.jsonl is not None and self.step is not None and not Path(str(self.jsonl)).is_dir():
            raise ConfigError(
                "--step selects a saved step of a run directory or of a prime-rl export directory; it has no "
                "meaning with a --jsonl file"
            )
        if self.jsonl is not None and not self.model:
            raise ConfigError(
                "--jsonl needs --model PATH (its tokenizer and signals explain the completions)"
            )
        if self.groups is not None and self.groups < 1:
            raise ConfigError(f"--groups must be >= 1, got {self.groups}")
        if self.select is not None:
            check_kind(self.select)
        if self.group_index is not None:
            parse_indices(self.group_index)
            if self.groups is not None or self.select is not None:
                raise ConfigError("--group-index names the groups to show; drop --groups / --select")
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.max_tokens < 1:
            raise ConfigError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        t = self.temperature
        if t is not None and (isinstance(t, bool) or not math.isfinite(t) or t <= 0):
            raise ConfigError(
                f"--temperature must be a finite number > 0 (the signals divide logits by it), got {t}"
            )


@dataclass
class Source:
    """The groups to explain and the settings that go with them."""

    groups: list[GroupInput]
    template: str
    temperature: float
    advantage: str
    advantage_params: dict[str, Any]
    model_path: str
    model_given: bool  # the user named the model (else RUN_DIR/final)
    out: Path
    description: str  # the page's subtitle
    run_dir: Path | None = None
    cfg: TrainConfig | None = None  # the run's
    recipe: Recipe | None = None  # the run's resolved recipe
    notes: list[str] = field(default_factory=list)
    # parts of the run directory skipped as damaged, one line each naming file:line (also in `notes`)
    damaged: list[str] = field(default_factory=list)
    # the run whose critic fills `values` (--critic, else the explained run when it trained one) and its recipe
    critic: Path | None = None
    critic_recipe: Recipe | None = None
    critic_given: bool = False  # named with --critic (a failure to load it is an error, not a note)


def _jsonl_source(opts: ExplainOptions) -> Source:
    notes: list[str] = []
    groups = load_jsonl(str(opts.jsonl), step=opts.step, notes=notes)
    path = Path(str(opts.jsonl))
    if path.is_dir():  # a prime-rl export directory: the page beside its step directories
        step = groups[0].extra.get("step")
        out = export_root(path) / (f"explain_step_{step}.html" if step is not None else "explain.html")
    else:
        out = path.with_suffix(".explain.html")
    return Source(
        groups=groups,
        template=opts.template or "qwen-math",
        temperature=opts.temperature if opts.temperature is not None else 1.0,
        advantage=opts.advantage or "grpo",
        advantage_params={},
        model_path=str(opts.model),
        model_given=True,
        out=Path(opts.out) if opts.out else out,
        description=f"{opts.jsonl} · model {opts.model}",
        notes=notes,
    )


def _run_source(opts: ExplainOptions) -> Source:
    """The run's saved rollouts with its settings, read leniently: a damaged rollouts line or group, an
    unknown config key or recipe field is skipped and said in `Source.damaged` (and on the page)."""
    run = RunDir(str(opts.run_dir))
    damaged: list[str] = []
    step, groups = load_run_rollouts(run.path, opts.step, damaged)
    notes = []
    if run.config_path.is_file():
        cfg = run.read_config(damaged)
    else:
        cfg = TrainConfig()
        notes.append(f"{run.config_path} not found: trainer defaults assumed (template, temperature, LoRA)")
    recipe = run.read_recipe(cfg, damaged)
    return Source(
        groups=groups,
        template=opts.template or cfg.data.template,
        temperature=opts.temperature if opts.temperature is not None else cfg.rollout.temperature,
        advantage=opts.advantage or recipe.advantage,
        advantage_params=dict(recipe.advantage_params) if opts.advantage is None else {},
        model_path=str(opts.model) if opts.model else str(run.final_dir),
        model_given=opts.model is not None,
        out=Path(opts.out) if opts.out else run.explain_path(step),
        description=f"run {run.path} · step {step} · trained with recipe {recipe.name!r} on model {cfg.model.name!r}",
        run_dir=run.path,
        cfg=cfg,
        recipe=recipe,
        notes=damaged + notes,
        damaged=damaged,
    )


def _critic_source(opts: ExplainOptions, src: Source) -> None:
    """`src.critic` and its recipe: the run --critic names (ConfigError unless it trained a critic), else the
    explained run when its recipe trains one. Only reads config and recipe (the weights load with the model)."""
    if opts.critic is not None:
        run, _ = RunDir.containing(opts.critic, "--critic")
        recipe = run.read_recipe(None, [])
        if not needs_values(recipe):
            raise ConfigError(
                f"--critic {opts.critic}: the run trained with recipe {recipe.name!r}, which has no critic (a run "
                f"trained with {' / '.join(critic_recipes())} has one)"
            )
        src.critic, src.critic_recipe, src.critic_given = Path(str(opts.critic)), recipe, True
    elif src.run_dir is not None and src.recipe is not None and needs_values(src.recipe):
        src.critic, src.critic_recipe = src.run_dir, src.recipe


def read_source(opts: ExplainOptions) -> Source:
    """The groups of the JSONL file or the run directory `opts` names, with their settings resolved."""
    src = _jsonl_source(opts) if opts.jsonl is not None else _run_source(opts)
    _critic_source(opts, src)
    try:
        check_template(src.template)
    except ConfigError as e:
        raise ConfigError(f"--template: {e}" if opts.template else f"the run's data.template: {e}") from None
    if not (math.isfinite(src.temperature) and src.temperature > 0):  # --temperature is checked by `check`
        raise ConfigError(
            f"the run's rollout.temperature is {src.temperature}: the signals need one > 0; give --temperature"
        )
    if src.advantage not in advantages.ESTIMATORS:
        raise ConfigError(
            f"--advantage: unknown estimator {src.advantage!r}{closest(src.advantage, advantages.ESTIMATORS)}; "
            f"one of {', '.join(advantages.ESTIMATORS)}"
        )
    return src

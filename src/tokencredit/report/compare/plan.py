"""Planning the trainer runs of a comparison: one `PlannedRun` per (recipe, seed) with its TrainConfig,
and its state on disk (new, resume, finished). `execute` trains the unfinished ones."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tokencredit.errors import ConfigError
from tokencredit.recipes import requires_lora, resolve
from tokencredit.report.compare.runs import RUNTIME_KEYS, flat_config
from tokencredit.train.config import TrainConfig, load_config
from tokencredit.train.rundir import RunDir
from tokencredit.train.trainer import resolve_recipe

__all__ = ["DEFAULT_RECIPES", "DEFAULT_SEEDS", "PlanOptions", "PlannedRun", "plan_runs", "plan_state"]

DEFAULT_RECIPES = "grpo,dapo,dapo+ktae,delta,strace,arca"
DEFAULT_SEEDS = "0,1,2"


class PlanOptions(Protocol):
    """What planning reads: the parsed `tokencredit compare` arguments (an argparse.Namespace) or any
    object with these attributes. `recipes` / `seeds` are comma-separated; None means the defaults."""

    recipes: str | None
    seeds: str | None
    config: str | None
    set: list[str]
    lora_rank: int | None
    lora_only_rank: int
    out: str


@dataclass
class PlannedRun:
    recipe: str
    seed: int
    run_dir: Path
    cfg: TrainConfig

    @property
    def name(self) -> str:
        return f"{self.recipe} seed {self.seed}"


def _split(text: str, what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ConfigError(f"--{what}: empty list")
    if len(set(items)) != len(items):
        raise ConfigError(f"--{what}: duplicate entries in {text!r}")
    return items


def _check_recipes(names: list[str]) -> None:
    """Each --recipes name read by the project's one name rule (`tokencredit.recipes.resolve`): an unknown
    name, or two names of the same recipe (`grpo` and `recipe:grpo`), is an error before anything runs."""
    seen: dict[str, str] = {}
    for name in names:
        key = json.dumps(resolve(name).to_dict(), sort_keys=True)
        if key in seen:
            raise ConfigError(f"--recipes: {seen[key]!r} and {name!r} name the same recipe")
        seen[key] = name


def _seeds(text: str) -> list[int]:
    try:
        return [int(s) for s in _split(text, "seeds")]
    except ValueError:
        raise ConfigError(f"--seeds expects comma-separated integers, got {text!r}") from None


def plan_runs(args: PlanOptions) -> list[PlannedRun]:
    """One TrainConfig per (recipe, seed): the config file, then --set, then the seed, the recipe and the LoRA rank."""
    recipes = _split(args.recipes or DEFAULT_RECIPES, "recipes")
    seeds = _seeds(args.seeds or DEFAULT_SEEDS)
    for s in args.set:
        key = s.split("=", 1)[0].strip()
        if key in ("run.seed", "algo.recipe"):
            raise ConfigError(
                f"--set {key}=...: compare sets it per run; use --{'seeds' if 'seed' in key else 'recipes'}"
            )
    _check_recipes(recipes)
    if (args.lora_rank is not None and args.lora_rank < 0) or args.lora_only_rank < 1:
        raise ConfigError("--lora-rank must be >= 0 and --lora-only-rank >= 1")
    runs = Path(args.out) / "runs"
    plans = []
    for r in recipes:
        for s in seeds:
            cfg = load_config(args.config, [*args.set, f"run.seed={s}"], recipe=r)
            if args.lora_rank is not None:
                cfg.model.lora_rank = args.lora_rank
            if cfg.model.lora_rank <= 0 and requires_lora(resolve_recipe(cfg)):
                cfg.model.lora_rank = args.lora_only_rank
            cfg.run.name = f"{r}-s{s}"
            cfg.run.out_dir = str(runs)
            plans.append(PlannedRun(r, s, runs / cfg.run.name, cfg))
    return plans


def plan_state(plan: PlannedRun) -> str:
    """'new', 'finished' or 'resume'; a run directory made with other settings, or whose config.toml or
    summary.json this version cannot read whole, is an error."""
    run = RunDir(plan.run_dir)
    if not run.config_path.is_file():
        return "new"
    try:  # strict: an unknown key would change what the resumed run trains
        old = flat_config(run.read_config())
    except ConfigError as e:
        raise ConfigError(f"{e}; compare cannot continue that run: use another --out or remove {run.path}") from None
    new = flat_config(plan.cfg)
    free = RUNTIME_KEYS | {"run.steps"}  # run.steps may grow: the run is extended from its last checkpoint
    diff = [k for k in sorted(set(old) | set(new)) if k not in free and old.get(k) != new.get(k)]
    if diff:
        shown = "; ".join(f"{k}: {old.get(k)!r} there, {new.get(k)!r} now" for k in diff[:4])
        raise ConfigError(
            f"{run.path} was made with other settings ({shown}); use another --out or remove that run directory"
        )
    if int(old["run.steps"]) > plan.cfg.run.steps:
        raise ConfigError(
            f"{run.path} was planned for run.steps={old['run.steps']}, more than {plan.cfg.run.steps} now; "
            "use another --out or the same run.steps"
        )
    summary = run.read_summary(strict=True)
    if summary is not None and int(summary.get("steps", -1)) >= plan.cfg.run.steps:
        return "finished"
    return "resume"

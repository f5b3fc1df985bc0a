"""Planning the trainer runs of a comparison: one `PlannedRun` per (recipe, seed) with its TrainConfig,
and its state on disk (new, resume, finished). `execute` trains the unfinished ones."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tokencredit.compare.runs import RUNTIME_KEYS, flat_config
from tokencredit.credit.placebo import PLACEBOS
from tokencredit.errors import ConfigError, closest
from tokencredit.recipes import requires_lora, resolve
from tokencredit.train.config import TrainConfig, load_config
from tokencredit.train.rundir import RunDir
from tokencredit.train.trainer import resolve_recipe

__all__ = [
    "DEFAULT_RECIPES",
    "DEFAULT_SEEDS",
    "PLACEBO_ARMS",
    "Arm",
    "PlanOptions",
    "PlannedRun",
    "parse_arm",
    "parse_placebos",
    "parse_seeds",
    "plan_arms",
    "plan_run",
    "plan_runs",
    "plan_state",
]

DEFAULT_RECIPES = "grpo,dapo,dapo+ktae,delta,strace,arca"
DEFAULT_SEEDS = "0,1,2"
PLACEBO_ARMS = tuple(p for p in PLACEBOS if p != "none")  # what `--placebo` alone adds per recipe
_ARM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
_NEXT_KEY = re.compile(r",(?=\s*[A-Za-z_][\w.]*\s*=)")  # a comma that starts the next KEY=VALUE


class PlanOptions(Protocol):
    """What planning reads: the parsed `tokencredit compare` arguments (an argparse.Namespace) or any
    object with these attributes. `recipes` / `seeds` are comma-separated; None means the defaults;
    `arm` holds the --arm values (NAME=RECIPE:KEY=VALUE[,KEY=VALUE...]); `placebo` (optional) the
    --placebo value (comma-separated placebos, None for none)."""

    recipes: str | None
    seeds: str | None
    config: str | None
    set: list[str]
    arm: list[str]
    lora_rank: int | None
    lora_only_rank: int
    out: str


@dataclass(frozen=True)
class Arm:
    """One row of the comparison: `label` trains `recipe` with the extra trainer overrides `sets`
    (applied after the shared --set). A --recipes entry is an arm labelled by itself, without overrides."""

    label: str
    recipe: str
    sets: tuple[str, ...] = ()
    named: bool = False  # an --arm (its label is stored as run.label), not a --recipes entry
    placebo_of: str = ""  # a --placebo arm: the label of the row whose update size it keeps


@dataclass
class PlannedRun:
    recipe: str
    seed: int
    run_dir: Path
    cfg: TrainConfig
    label: str = ""  # the arm's label ("" = the recipe)
    variant: str = ""  # what else tells it apart in messages (a tune run's "lr 0.0001")

    @property
    def name(self) -> str:
        return f"{self.label or self.recipe}{f' {self.variant}' if self.variant else ''} seed {self.seed}"


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


def parse_seeds(text: str, what: str = "seeds") -> list[int]:
    """Comma-separated integers of --`what` (an empty list, a duplicate or a non-integer is an error)."""
    try:
        return [int(s) for s in _split(text, what)]
    except ValueError:
        raise ConfigError(f"--{what} expects comma-separated integers, got {text!r}") from None


def _check_sets(sets: list[str] | tuple[str, ...], flag: str) -> None:
    """run.seed and algo.recipe are set per run by compare: an override of them is an error."""
    for s in sets:
        key = s.split("=", 1)[0].strip()
        if key in ("run.seed", "algo.recipe", "run.label", "algo.placebo"):
            use = {
                "run.seed": "--seeds",
                "algo.recipe": "--recipes or --arm NAME=RECIPE:...",
                "run.label": "--arm NAME=...",
                "algo.placebo": "--placebo",
            }
            raise ConfigError(f"{flag} {key}=...: compare sets it per run; use {use[key]}")


def parse_arm(text: str) -> Arm:
    """``NAME=RECIPE:KEY=VALUE[,KEY=VALUE...]`` -> Arm (a comma starts a new override only where a
    KEY= follows, so a list value such as ``model.lora_targets=q_proj,v_proj`` stays whole). The
    recipe is checked by `tokencredit.recipes.resolve`; the overrides by the config loader when planned."""
    usage = f"--arm {text!r}: expected NAME=RECIPE:KEY=VALUE[,KEY=VALUE...] (e.g. grpo-matched=grpo:rollout.group_size=96)"
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ConfigError(usage)
    if not _ARM_NAME.fullmatch(name):
        raise ConfigError(
            f"--arm {text!r}: NAME {name!r} must be letters, digits and _ . + - (it names run directories)"
        )
    head = rest.split("=", 1)[0]  # RECIPE:KEY (a recipe name may hold ':' itself: recipe:grpo)
    recipe, colon, _ = head.rpartition(":")
    if not colon or "=" not in rest or not recipe.strip():
        raise ConfigError(usage)
    sets = tuple(x.strip() for x in _NEXT_KEY.split(rest[len(recipe) + 1 :]) if x.strip())
    try:
        resolve(recipe.strip())
    except ConfigError as e:
        raise ConfigError(f"--arm {name}: {e}") from None
    _check_sets(sets, f"--arm {name}:")
    return Arm(name, recipe.strip(), sets, named=True)


def parse_placebos(text: str | None) -> tuple[str, ...]:
    """--placebo's comma-separated placebos (`tokencredit.credit.placebo`); None: no placebo arms."""
    if text is None:
        return ()
    names = tuple(_split(text, "placebo"))
    for n in names:
        if n not in PLACEBO_ARMS:
            raise ConfigError(
                f"--placebo: unknown placebo {n!r}{closest(n, PLACEBO_ARMS)}; choose from {', '.join(PLACEBO_ARMS)}"
            )
    return names


def has_placement(recipe: str) -> bool:
    """True when a recipe places credit: its credit method or its ratio kernel is not GRPO's uniform,
    per-token one (so its placebo arms differ from it)."""
    r = resolve(recipe)
    return r.credit != "uniform" or (r.uses_ratio and r.kernel != "token")


def placebo_arms(arms: list[Arm], placebos: tuple[str, ...]) -> list[Arm]:
    """For each --recipes row that places credit (`has_placement`), one row per placebo, LABEL.PLACEBO:
    the same recipe and overrides with algo.placebo set (`tokencredit.recipes.placebo_credit`)."""
    return [
        Arm(f"{a.label}.{p}", a.recipe, (*a.sets, f"algo.placebo={p}"), named=True, placebo_of=a.label)
        for a in arms
        if not a.named and has_placement(a.recipe)
        for p in placebos
    ]


def plan_arms(args: PlanOptions) -> list[Arm]:
    """The rows of the comparison: each --recipes entry, then each --arm, then the --placebo rows; checked
    before anything runs (unknown recipes, overrides compare sets itself, an arm NAME that repeats a recipe
    or another arm, a --placebo with no recipe that places credit)."""
    recipes = _split(args.recipes or DEFAULT_RECIPES, "recipes")
    _check_sets(args.set, "--set")
    _check_recipes(recipes)
    if (args.lora_rank is not None and args.lora_rank < 0) or args.lora_only_rank < 1:
        raise ConfigError("--lora-rank must be >= 0 and --lora-only-rank >= 1")
    arms = [Arm(r, r) for r in recipes]
    taken = {r: "--recipes" for r in recipes} | {resolve(r).name: "--recipes" for r in recipes}
    for text in getattr(args, "arm", None) or []:
        arm = parse_arm(text)
        if arm.label in taken:
            raise ConfigError(
                f"--arm {arm.label}: the name is already a row ({taken[arm.label]}); choose another NAME"
            )
        taken[arm.label] = "another --arm"
        arms.append(arm)
    placebos = parse_placebos(getattr(args, "placebo", None))
    extra = placebo_arms(arms, placebos)
    if placebos and not extra:
        raise ConfigError(
            "--placebo: none of --recipes places credit (each uses uniform credit and the per-token ratio), "
            "so a placebo would train the recipe itself; add a token-credit recipe such as delta"
        )
    for arm in extra:
        if arm.label in taken:
            raise ConfigError(f"--arm {arm.label}: the name is a --placebo row; choose another NAME")
        arms.append(arm)
    return arms


def plan_run(
    args: PlanOptions, arm: Arm, seed: int, runs: Path, sets: tuple[str, ...] = (), name: str = ""
) -> PlannedRun:
    """One TrainConfig: the config file, then --set, the arm's overrides, `sets`, the seed, the recipe and
    the LoRA rank; in ``runs / name`` (default ``LABEL-sSEED``)."""
    cfg = load_config(args.config, [*args.set, *arm.sets, *sets, f"run.seed={seed}"], recipe=arm.recipe)
    if args.lora_rank is not None:
        cfg.model.lora_rank = args.lora_rank
    if cfg.model.lora_rank <= 0 and requires_lora(resolve_recipe(cfg)):
        cfg.model.lora_rank = args.lora_only_rank
    cfg.run.label = arm.label if arm.named else ""
    cfg.run.name = name or f"{arm.label}-s{seed}"
    cfg.run.out_dir = str(runs)
    return PlannedRun(arm.recipe, seed, runs / cfg.run.name, cfg, arm.label)


def plan_runs(args: PlanOptions, lr: dict[str, float] | None = None) -> list[PlannedRun]:
    """One planned run per (row, seed) in OUT/runs (`plan_arms`, `plan_run`); `lr` sets optim.lr per row
    label (the values `--tune-lr` chose)."""
    arms = plan_arms(args)
    seeds = parse_seeds(args.seeds or DEFAULT_SEEDS)
    runs = Path(args.out) / "runs"
    # a placebo row trains at the learning rate of the row whose update size it keeps
    return [
        plan_run(args, a, s, runs, (f"optim.lr={lr[a.placebo_of or a.label]!r}",) if lr else ())
        for a in arms
        for s in seeds
    ]


def plan_state(plan: PlannedRun) -> str:
    """'new', 'finished' or 'resume'; a run directory made with other settings, or whose config.toml or
    summary.json this version cannot read whole, is an error."""
    run = RunDir(plan.run_dir)
    if not run.config_path.is_file():
        return "new"
    try:  # strict: an unknown key would change what the resumed run trains
        old = flat_config(run.read_config())
    except ConfigError as e:
        raise ConfigError(
            f"{e}; compare cannot continue that run: use another --out or remove {run.path}"
        ) from None
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

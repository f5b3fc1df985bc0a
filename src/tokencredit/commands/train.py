"""`tokencredit train`: config file + --recipe + --set overrides; --resume RUN_DIR continues a run.

Only the standard library is imported before the arguments are parsed: the library (torch) is imported
by `run`, so `--help` and a mistyped flag answer at once, and the config is checked before the trainer
and its model library load."""

from __future__ import annotations

import argparse
import difflib
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tokencredit.errors import ConfigError

if TYPE_CHECKING:
    from tokencredit.train.rundir import RunDir


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        help="TOML file with [run] [model] [data] [rollout] [optim] [reward] [eval] [checkpoint] [algo]",
    )
    p.add_argument("--recipe", help="recipe name (see `tokencredit recipes`)")
    p.add_argument(
        "--model",
        help="'toy' (default), 'toy-hard', 'toy-free', 'smollm2', a model directory, a .gguf file or a cached hub id ORG/NAME",
    )
    p.add_argument("--steps", type=int, help="number of RL steps (run.steps)")
    p.add_argument("--seed", type=int, help="run.seed")
    p.add_argument("--out", help="run directory (default runs/<recipe>-s<seed>-<time>)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. optim.lr=3e-4 or algo.kernel_params.lam=0.9 (repeatable)",
    )
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last good checkpoint")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in --out (without it, a directory that holds a run is refused)",
    )
    p.add_argument("--no-progress", action="store_true", help="plain log lines instead of the progress bar")


def resume_dir(path: str) -> RunDir:
    """The run directory `--resume` names, checked: ConfigError when it does not exist (naming the
    closest run directory beside it, if any), is not a directory, or holds no config.toml."""
    from tokencredit.train.rundir import RunDir

    run = RunDir(path)
    if not run.path.exists():
        parent = run.path.parent
        runs = sorted(d.name for d in parent.iterdir() if RunDir(d).is_run()) if parent.is_dir() else []
        close = difflib.get_close_matches(run.path.name, runs, n=1, cutoff=0.5)
        hint = (
            f"; did you mean {parent / close[0]}?"
            if close
            else (f" ({parent} holds no run directory)" if parent.is_dir() and not runs else "")
        )
        raise ConfigError(f"--resume {run.path}: the directory does not exist{hint}")
    if not run.path.is_dir():
        raise ConfigError(
            f"--resume {run.path}: not a directory (give a run directory of `tokencredit train`)"
        )
    if not run.config_path.is_file():
        raise ConfigError(f"--resume {run.path}: no config.toml there (not a tokencredit run directory)")
    return run


def run(args: argparse.Namespace) -> int:
    from tokencredit.models.sources import MODEL_ALIASES
    from tokencredit.models.toy import TOY_VARIANTS
    from tokencredit.train.config import apply_set, load_config

    sets = list(args.set)
    for flag, key in ((args.model, "model.name"), (args.steps, "run.steps"), (args.seed, "run.seed")):
        if flag is not None:
            sets.append(f"{key}={flag}")
    if args.no_progress:
        sets.append("run.progress=false")
    if args.resume:
        run = resume_dir(args.resume)
        if args.config or args.recipe:
            raise ConfigError(
                "--resume uses the run's saved config; pass only --set overrides (e.g. run.steps=200)"
            )
        if args.overwrite or args.out:
            raise ConfigError(
                "--resume continues the run in its own directory; --out and --overwrite start a new run"
            )
        cfg = run.read_config()
        run_dir = run.path
        for s in sets:
            apply_set(cfg, s)
        options = {"resume": True}
    else:
        cfg = load_config(args.config, sets, args.recipe)
        if Path(cfg.model.name).expanduser().exists() and cfg.model.name not in {
            *MODEL_ALIASES,
            *TOY_VARIANTS,
        }:
            # a directory or .gguf file is recorded absolute: --resume, explain and probe reload it from anywhere
            cfg.model.name = str(Path(cfg.model.name).expanduser().resolve())
        if args.out is not None and not args.out.strip():
            raise ConfigError(
                "--out is empty: give the run's directory (or leave --out out for runs/<recipe>-s<seed>-<time>)"
            )
        if args.out:
            run_dir = Path(args.out)
        else:
            name = cfg.run.name or f"{cfg.algo.recipe}-s{cfg.run.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
            run_dir = Path(cfg.run.out_dir) / name
        options = {"overwrite": args.overwrite}
    # imported once the config is read and checked: the trainer pulls in the rest of the library
    from tokencredit.train.trainer import Trainer

    Trainer(cfg, run_dir, **options).fit()
    return 0

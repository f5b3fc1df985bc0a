"""Reading trainer runs for a comparison. Every file of a run directory that compare reads is read
here, at paths given by `tokencredit.train.rundir.RunDir` (the one owner of the layout).

Damaged parts are read leniently (`RunDir`'s lenient mode): a damaged metrics.jsonl line (cut off, not
JSON), a config key or recipe field this version does not know is skipped, and one line naming file:line
and what to do goes into `RunData.damaged` (printed by the command and listed in compare.md). A file that
cannot be read at all (config.toml, summary.json) is an error naming it; `collect_runs` leaves that run
out with the error as the reason and compares the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokencredit.errors import ConfigError
from tokencredit.train.config import TrainConfig
from tokencredit.train.rundir import RunDir

__all__ = [
    "RUNTIME_KEYS",
    "RunData",
    "collect_runs",
    "damaged_parts",
    "expand_run_dirs",
    "flat_config",
    "read_run",
]

# Keys that may differ between the runs of one comparison without changing what is compared.
RUNTIME_KEYS = {"run.threads", "run.progress", "run.device", "run.name", "run.out_dir", "run.report_to"}


@dataclass
class RunData:
    """One finished or unfinished trainer run, as read from its directory."""

    run_dir: Path
    recipe: str
    seed: int
    lora_rank: int
    recipe_dict: dict[str, Any]
    config: dict[str, Any]  # flat {"section.key": value}
    evals: list[dict[str, Any]]
    steps: list[dict[str, Any]]  # step records that trained (skipped steps left out)
    skipped_steps: int
    summary: dict[str, Any] | None
    damaged: list[str] = field(default_factory=list)  # parts skipped, one line each (file:line, what to do)

    @property
    def label(self) -> str:
        """The row the run belongs to: its run.label (`compare --arm NAME=...`), else its recipe's name."""
        return str(self.config.get("run.label") or self.recipe)

    @property
    def finished(self) -> bool:
        return self.summary is not None and int(self.summary.get("steps", -1)) >= int(
            self.config["run.steps"]
        )


def flat_config(cfg: TrainConfig) -> dict[str, Any]:
    """{"section.key": value} of a TrainConfig."""
    return {f"{sec}.{k}": v for sec, values in cfg.to_dict().items() for k, v in values.items()}


def read_run(run_dir: str | Path) -> RunData:
    """A run directory written by the trainer: config.toml, recipe.json, metrics.jsonl, summary.json,
    read leniently (see the module docstring)."""
    run = RunDir(run_dir)
    damaged: list[str] = []
    cfg = run.read_config(damaged)
    config = flat_config(cfg)
    recipe = run.read_recipe(cfg, damaged)
    records = run.metrics.read(damaged)
    evals = sorted((r for r in records if r.get("type") == "eval"), key=lambda r: r["step"])
    trained = [r for r in records if r.get("type") != "eval" and "skipped" not in r]
    skipped = sum(1 for r in records if r.get("type") != "eval" and "skipped" in r)
    return RunData(
        run.path,
        recipe.name,
        int(config["run.seed"]),
        int(config["model.lora_rank"]),
        recipe.to_dict(),
        config,
        evals,
        sorted(trained, key=lambda r: r["step"]),
        skipped,
        run.read_summary(strict=True),
        damaged,
    )


def damaged_parts(runs: list[RunData]) -> list[dict[str, str]]:
    """{"run_dir", "reason"} for every part of `runs` that was skipped as damaged (compare.json's "damaged")."""
    return [{"run_dir": str(r.run_dir), "reason": note} for r in runs for note in r.damaged]


def expand_run_dirs(paths: list[str]) -> list[Path]:
    """Run directories from --collect: a directory with config.toml, or one whose sub-directories have one."""
    out: list[Path] = []
    for p in map(Path, paths):
        if RunDir(p).config_path.is_file():
            out.append(p)
        elif p.is_dir() and (subs := sorted(s for s in p.iterdir() if RunDir(s).config_path.is_file())):
            out += subs
        else:
            raise ConfigError(
                f"--collect {p}: not a run directory (no config.toml in it or its sub-directories)"
            )
    return out


def collect_runs(paths: list[str]) -> tuple[list[RunData], list[dict[str, str]]]:
    """The finished runs under `paths` (see `expand_run_dirs`), and {"run_dir", "reason"} for each left
    out: unfinished, or a file of it that cannot be read at all (the reason names it)."""
    runs, left_out = [], []
    for d in expand_run_dirs(paths):
        try:
            r = read_run(d)
        except ConfigError as e:
            left_out.append({"run_dir": str(d), "reason": str(e)})
            continue
        if r.finished:
            runs.append(r)
        else:
            left_out.append({"run_dir": str(d), "reason": "unfinished (no summary.json for its run.steps)"})
    return runs, left_out

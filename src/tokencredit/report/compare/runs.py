"""Reading trainer runs for a comparison. Every file of a run directory that compare reads is read
here, at paths given by `tokencredit.train.rundir.RunDir` (the one owner of the layout).

A damaged file is an error naming it (and the line, for metrics.jsonl), except a torn last line of
metrics.jsonl (a crash mid-write), which is dropped as the trainer's own resume drops it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokencredit.errors import ConfigError
from tokencredit.train.config import TrainConfig
from tokencredit.train.rundir import RunDir

__all__ = [
    "RUNTIME_KEYS", "RunData", "collect_runs", "expand_run_dirs", "flat_config", "read_json", "read_metrics",
    "read_run", "read_summary",
]  # fmt: skip

# Keys that may differ between the runs of one comparison without changing what is compared.
RUNTIME_KEYS = {"run.threads", "run.progress", "run.device", "run.name", "run.out_dir"}


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

    @property
    def finished(self) -> bool:
        return self.summary is not None and int(self.summary.get("steps", -1)) >= int(
            self.config["run.steps"]
        )


def flat_config(cfg: TrainConfig) -> dict[str, Any]:
    """{"section.key": value} of a TrainConfig."""
    return {f"{sec}.{k}": v for sec, values in cfg.to_dict().items() for k, v in values.items()}


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl; a torn last line (a crash mid-write) is dropped, any other bad line is an error."""
    lines = path.read_text().splitlines() if path.is_file() else []
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines):
                continue
            raise ConfigError(f"{path}:{i}: invalid JSON ({e.msg})") from None
        if not isinstance(rec, dict) or "step" not in rec:
            raise ConfigError(f"{path}:{i}: expected an object with a 'step' field")
        out.append(rec)
    return out


def read_summary(run: RunDir) -> dict[str, Any] | None:
    """summary.json, None when there is none. Unlike `RunDir.read_summary`, a damaged file is an error:
    compare must not take a damaged summary for an unfinished run and train it again."""
    return read_json(run.summary_path) if run.summary_path.is_file() else None


def read_run(run_dir: str | Path) -> RunData:
    """A run directory written by the trainer: config.toml, recipe.json, metrics.jsonl, summary.json."""
    run = RunDir(run_dir)
    cfg = run.read_config()
    config = flat_config(cfg)
    recipe = run.read_recipe(cfg)
    records = read_metrics(run.metrics.path)
    evals = sorted((r for r in records if r.get("type") == "eval"), key=lambda r: r["step"])
    trained = [r for r in records if r.get("type") != "eval" and "skipped" not in r]
    skipped = sum(1 for r in records if r.get("type") != "eval" and "skipped" in r)
    return RunData(
        run.path, recipe.name, int(config["run.seed"]), int(config["model.lora_rank"]), recipe.to_dict(),
        config, evals, sorted(trained, key=lambda r: r["step"]), skipped, read_summary(run),
    )  # fmt: skip


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
    """The finished runs under `paths` (see `expand_run_dirs`), and {"run_dir", "reason"} for each left out."""
    runs, left_out = [], []
    for d in expand_run_dirs(paths):
        r = read_run(d)
        if r.finished:
            runs.append(r)
        else:
            left_out.append({"run_dir": str(d), "reason": "unfinished (no summary.json for its run.steps)"})
    return runs, left_out

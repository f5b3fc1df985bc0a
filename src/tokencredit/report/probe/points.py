"""Which models the probe samples: a model directory, the toy warm start, or a training run's
exported model, one checkpoint, or its start and every checkpoint (`ProbePoint`s, loaded lazily).

A run directory is read only through `tokencredit.train.rundir.RunDir`, and a checkpoint's policy
only through `tokencredit.train.checkpoint.load_run_policy`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokencredit.errors import ConfigError
from tokencredit.models import load_model, resolve_device
from tokencredit.recipes import Recipe
from tokencredit.train.checkpoint import load_run_policy
from tokencredit.train.config import TrainConfig
from tokencredit.train.rundir import RunDir

__all__ = ["ProbePoint", "default_output", "parse_checkpoint", "resolve_points"]


@dataclass
class ProbePoint:
    """One model to probe: its label in the tables, a description, the training step, a loader."""

    label: str
    source: str
    step: int | None
    load: Callable[[], tuple[Any, Any]]


def parse_checkpoint(name: str) -> int:
    """The step number of "step_N", "step_000020", "N" or a path to step_N.pt."""
    m = re.fullmatch(r"(?:.*/)?(?:step_)?(\d+)(?:\.pt)?", name.strip())
    if m is None:
        raise ConfigError(f"--checkpoint: expected step_N (e.g. step_20), got {name!r}")
    return int(m.group(1))


def _checkpoint_policy(run: RunDir, step: int, device: Any) -> tuple[Any, Any]:
    model, tok, _ = load_run_policy(run, step, device)
    return model, tok


def _checkpoint_point(run: RunDir, base: str, step: int, device: Any) -> ProbePoint:
    return ProbePoint(
        f"step {step}",
        f"run {run.path}, checkpoint step {step} on {base!r}",
        step,
        lambda: _checkpoint_policy(run, step, device),
    )


def _all_checkpoint_points(run: RunDir, base: str, device: Any) -> list[ProbePoint]:
    """The run's starting model (step 0), then every saved checkpoint."""
    steps = run.checkpoint_steps()
    if not steps:
        raise ConfigError(f"{run.path}: no checkpoints in {run.checkpoints_dir}")
    start = ProbePoint(
        "step 0 (start)", f"the run's starting model {base!r}", 0, lambda: load_model(base, device=device)
    )
    return [start] + [_checkpoint_point(run, base, s, device) for s in steps]


def _final_point(run: RunDir, run_cfg: TrainConfig, device: Any) -> ProbePoint:
    """The run's exported model (LoRA merged), labelled with its last checkpoint's step."""
    final = run.final_dir
    if not run.has_final_model():
        have = ", ".join(f"step_{s}" for s in run.checkpoint_steps()) or "none"
        raise ConfigError(
            f"{run.path}: no exported model in {final} (the run did not finish?); probe a checkpoint with "
            f"--checkpoint step_N (saved: {have})"
        )
    steps = run.checkpoint_steps()
    merged = (
        " (LoRA merged into the weights: probe a --checkpoint for ARCA / policy-divergence)"
        if run_cfg.model.lora_rank > 0
        else ""
    )
    return ProbePoint(
        "final",
        f"run {run.path}, exported model (final){merged}",
        steps[-1] if steps else None,
        lambda: load_model(str(final), device=device),
    )


def resolve_points(
    model: str, *, checkpoint: str | None = None, all_checkpoints: bool = False, device: str = "auto"
) -> tuple[list[ProbePoint], TrainConfig | None, Recipe | None, Path | None]:
    """(points to probe, run TrainConfig or None, run recipe or None, run directory or None).

    model: "toy", a model directory, or a run directory; with a run, `checkpoint` ("step_N") picks
    one checkpoint and `all_checkpoints` the start and every checkpoint (default: its final/).
    """
    dev = resolve_device(device, "--device")
    run = RunDir(Path(model).expanduser())
    if model != "toy" and run.is_run():
        run_cfg = run.read_config()
        recipe = run.read_recipe(run_cfg)
        if all_checkpoints and checkpoint:
            raise ConfigError("give --checkpoint step_N or --all-checkpoints, not both")
        if all_checkpoints:
            points = _all_checkpoint_points(run, run_cfg.model.name, dev)
        elif checkpoint:
            points = [_checkpoint_point(run, run_cfg.model.name, parse_checkpoint(checkpoint), dev)]
        else:
            points = [_final_point(run, run_cfg, dev)]
        return points, run_cfg, recipe, run.path
    if all_checkpoints or checkpoint:
        raise ConfigError(
            f"--checkpoint / --all-checkpoints need --model RUN_DIR (a training run directory); {model!r} is not one"
        )
    label = "warm start (toy)" if model == "toy" else f"model {model}"
    source = "the shipped toy warm start" if model == "toy" else f"model directory {model}"
    return [ProbePoint(label, source, None, lambda: load_model(model, device=dev))], None, None, None


def default_output(run_dir: Path | None) -> Path:
    """Where the JSON report goes without --out: RUN_DIR/probe.json for a run, else ./probe.json."""
    return RunDir(run_dir).probe_path if run_dir is not None else Path("probe.json")

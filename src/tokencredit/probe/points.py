"""Which models the probe samples: a model directory, the toy warm start, or a training run's
exported model, one checkpoint, or its start and every checkpoint (`ProbePoint`s, loaded lazily).

A run directory is read only through `tokencredit.train.rundir.RunDir` (leniently: a config key or
recipe field this version does not know is skipped and said), and a checkpoint's policy only through
`tokencredit.train.checkpoint.load_run_policy`. Checkpoints are checked before anything is sampled: with
--all-checkpoints one that is gone (a digest without its .pt) or unusable (no digest, a digest mismatch)
is skipped and said, and the others are probed; a --checkpoint that is missing or unusable is an error
saying which ones there are.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tokencredit.errors import ConfigError
from tokencredit.models import load_model, resolve_device, resolve_model
from tokencredit.probe.precondition import AdamMoments, read_adam_moments
from tokencredit.recipes import Recipe
from tokencredit.train.checkpoint import load_run_policy, verify_checkpoint
from tokencredit.train.config import TrainConfig
from tokencredit.train.rundir import RunDir

__all__ = ["ProbePoint", "default_output", "parse_checkpoint", "resolve_points"]


def _not_a_run() -> str:
    return "the probed model is not a training run's checkpoint"


@dataclass
class ProbePoint:
    """One model to probe: its label in the tables, a description, the training step, a loader, and a
    reader of the run's AdamW second moments at that point (`precondition.AdamMoments`) or why there are
    none, for the gradients' preconditioned metric."""

    label: str
    source: str
    step: int | None
    load: Callable[[], tuple[Any, Any]]
    moments: Callable[[], AdamMoments | str] = field(default=_not_a_run)


def _checkpoint_moments(run: RunDir, step: int, note: str = "") -> AdamMoments | str:
    """The AdamW moments saved in checkpoint `step` (its digest was verified when the point was made)."""
    path = run.checkpoint_path(step)
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - an unreadable file: the stand-in is used, and said
        return f"{path} could not be read ({type(e).__name__})"
    return read_adam_moments(state, f"checkpoint step {step}{note}")


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
        lambda: _checkpoint_moments(run, step),
    )


def _saved(run: RunDir) -> str:
    return ", ".join(f"step_{s}" for s in run.checkpoint_steps()) or "none"


def _checked_checkpoint(run: RunDir, step: int) -> int:
    """`step` when its checkpoint is there and its digest verifies, else a ConfigError saying what to do."""
    path = run.checkpoint_path(step)
    if not path.is_file():
        raise ConfigError(
            f"{path}: no checkpoint at step {step}; probe a saved one with --checkpoint step_N "
            f"(saved: {_saved(run)})"
        )
    ok, why = verify_checkpoint(path)
    if not ok:
        raise ConfigError(
            f"{path}: checkpoint step {step} is unusable ({why}); probe another with --checkpoint step_N "
            f"(saved: {_saved(run)}) or --all-checkpoints, which skips unusable ones"
        )
    return step


def _usable_checkpoints(run: RunDir, log: Callable[[str], None]) -> list[int]:
    """The steps whose checkpoint verifies; one line to `log` for each one gone or unusable."""
    usable, bad = [], []
    for step in sorted(set(run.checkpoint_steps()) | set(run.digest_steps())):
        path = run.checkpoint_path(step)
        if not path.is_file():
            bad.append(f"{path.with_suffix('.json')}: checkpoint step {step} is gone (no {path.name})")
            continue
        ok, why = verify_checkpoint(path)
        if ok:
            usable.append(step)
        else:
            bad.append(f"{path}: checkpoint step {step} is unusable ({why})")
    for line in bad:
        log(
            f"{line}; skipped, the other {len(usable)} checkpoint(s) are probed (restore it from a copy to probe it)"
            if usable
            else f"{line}; skipped"
        )
    return usable


def _all_checkpoint_points(
    run: RunDir, base: str, device: Any, log: Callable[[str], None]
) -> list[ProbePoint]:
    """The run's starting model (step 0), then every usable saved checkpoint."""
    steps = _usable_checkpoints(run, log)
    if not steps:
        raise ConfigError(f"{run.path}: no usable checkpoint in {run.checkpoints_dir}")
    start = ProbePoint(
        "step 0 (start)",
        f"the run's starting model {base!r}",
        0,
        lambda: load_model(base, device=device),
        lambda: "the run's starting model: AdamW has taken no step",
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
        lambda: (
            _checkpoint_moments(run, steps[-1], ", the run's last (the final model may be later)")
            if steps
            else "the run saved no checkpoint (no AdamW state)"
        ),
    )


def _stderr(msg: str) -> None:
    print(f"[probe] {msg}", file=sys.stderr)


def resolve_points(
    model: str,
    *,
    checkpoint: str | None = None,
    all_checkpoints: bool = False,
    device: str = "auto",
    log: Callable[[str], None] = _stderr,
) -> tuple[list[ProbePoint], TrainConfig | None, Recipe | None, Path | None]:
    """(points to probe, run TrainConfig or None, run recipe or None, run directory or None).

    model: "toy", a model directory, or a run directory; with a run, `checkpoint` ("step_N") picks
    one checkpoint and `all_checkpoints` the start and every usable checkpoint (default: its final/).
    What of a damaged run is skipped goes to `log`, one line each naming the file (and line).
    """
    dev = resolve_device(device, "--device")
    run = RunDir(Path(model).expanduser())
    if model != "toy" and run.is_run():
        skipped: list[str] = []
        run_cfg = run.read_config(skipped)
        recipe = run.read_recipe(run_cfg, skipped)
        for line in skipped:
            log(line)
        if all_checkpoints and checkpoint:
            raise ConfigError("give --checkpoint step_N or --all-checkpoints, not both")
        if all_checkpoints:
            points = _all_checkpoint_points(run, run_cfg.model.name, dev, log)
        elif checkpoint:
            step = _checked_checkpoint(run, parse_checkpoint(checkpoint))
            points = [_checkpoint_point(run, run_cfg.model.name, step, dev)]
        else:
            points = [_final_point(run, run_cfg, dev)]
        return points, run_cfg, recipe, run.path
    if all_checkpoints or checkpoint:
        raise ConfigError(
            f"--checkpoint / --all-checkpoints need --model RUN_DIR (a training run directory); {model!r} is not one"
        )
    label = "warm start (toy)" if model == "toy" else f"model {model}"
    source = "the shipped toy warm start" if model == "toy" else resolve_model(model).description
    return [ProbePoint(label, source, None, lambda: load_model(model, device=dev))], None, None, None


def default_output(run_dir: Path | None) -> Path:
    """Where the JSON report goes without --out: RUN_DIR/probe.json for a run, else ./probe.json."""
    return RunDir(run_dir).probe_path if run_dir is not None else Path("probe.json")

"""Atomic checkpoints: save, verify, load the newest good one, restore a trainer or a policy.

A checkpoint is one file `checkpoints/step_NNNNNN.pt` (paths: `tokencredit.train.rundir`) holding
the trainable parameters (the LoRA adapter, or every weight under full fine-tuning), optimizer
and scheduler states, RNG states and the step, plus a SHA-256 of its bytes in `step_NNNNNN.json`.
Both are written atomically, so a crash leaves either the old or the new file, never a torn one
(a temporary file left by a killed writer is deleted by the next save); a save that fails (a full
disk) removes what it wrote, so the previous checkpoint stays the newest. Loading verifies the
digest; a corrupt or partial checkpoint is reported and the previous one is used.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from tokencredit import models
from tokencredit.atomic import atomic_write_bytes, atomic_write_text
from tokencredit.critic import TrainedCritic, critic_recipes, needs_values, value_model_from_state
from tokencredit.errors import ConfigError
from tokencredit.train.config import TrainConfig
from tokencredit.train.rundir import RunDir

__all__ = [
    "load_latest_checkpoint",
    "load_run_critic",
    "load_run_policy",
    "restore",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
    "trainable_state",
    "verify_checkpoint",
]


def rng_state() -> dict[str, Any]:
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),  # noqa: NPY002 - the legacy global RNG other libraries use
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])  # noqa: NPY002
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters the optimizer updates (LoRA adapter only, or all weights), detached on CPU."""
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}


def save_checkpoint(
    run_dir: Path | RunDir,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    extra: dict[str, Any] | None = None,
    keep: int = 2,
) -> Path:
    rd = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    rd.checkpoints_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(rd.checkpoints_dir)
    payload = {
        "step": step,
        "model": trainable_state(model),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": rng_state(),
        "extra": extra or {},
    }
    buf = io.BytesIO()
    torch.save(payload, buf)
    data = buf.getvalue()
    path = rd.checkpoint_path(step)
    meta = {"step": step, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    atomic_write_bytes(path, data)  # on failure nothing was written
    try:
        atomic_write_text(path.with_suffix(".json"), json.dumps(meta))
    except BaseException:
        # Without its digest the new file is not a checkpoint: remove it, so the newest checkpoint
        # on disk stays the previous good one (a failed write is most often a full disk).
        path.unlink(missing_ok=True)
        raise
    for old in rd.checkpoint_steps()[:-keep] if keep > 0 else []:
        rd.checkpoint_path(old).unlink(missing_ok=True)
        rd.checkpoint_path(old).with_suffix(".json").unlink(missing_ok=True)
    return path


def _remove_stale_temps(ckdir: Path) -> None:
    """Delete temp files a killed process left behind (a checkpoint-sized file each, never renamed).

    Only another process's temps are stale: ours are renamed before `atomic_write_bytes` returns.
    """
    mine = f".tmp-{os.getpid()}"
    for tmp in ckdir.glob(".step_*.tmp-*"):
        if not tmp.name.endswith(mine):
            tmp.unlink(missing_ok=True)


def verify_checkpoint(path: Path) -> tuple[bool, str]:
    """(True, "") when `path` (a step_N.pt) matches the size and SHA-256 in its step_N.json, else (False, why)."""
    meta_path = path.with_suffix(".json")
    if not meta_path.is_file():
        return False, "no digest file (partial write)"
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError:
        return False, "unreadable digest file"
    data = path.read_bytes()
    if len(data) != meta.get("bytes") or hashlib.sha256(data).hexdigest() != meta.get("sha256"):
        return False, "digest mismatch (corrupt or truncated)"
    return True, ""


def _read(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=False)


def load_latest_checkpoint(run_dir: Path | RunDir, log: Any = None) -> dict[str, Any] | None:
    """The newest checkpoint whose digest verifies (earlier ones are tried in turn); None if none."""
    say = log or (lambda msg: print(msg, file=sys.stderr))
    rd = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    for step in reversed(rd.checkpoint_steps()):
        path = rd.checkpoint_path(step)
        ok, why = verify_checkpoint(path)
        if not ok:
            say(f"checkpoint {path} is unusable ({why}); trying the previous one")
            continue
        try:
            return _read(path)
        except Exception as e:  # noqa: BLE001 - any unpickling failure means a bad file
            say(f"checkpoint {path} could not be read ({type(e).__name__}: {e}); trying the previous one")
    return None


def restore(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, ckpt: dict[str, Any]) -> int:
    """Put a checkpoint's parameters, optimizer, scheduler and RNG states back; returns its step."""
    params = dict(model.named_parameters())
    missing = [n for n in ckpt["model"] if n not in params]
    if missing:
        raise RuntimeError(
            f"checkpoint has parameters the model lacks (different model or LoRA config?): {missing[:3]}"
        )
    models.restore_parameters(model, ckpt["model"], "checkpoint")
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    set_rng_state(ckpt["rng"])
    return int(ckpt["step"])


def build_policy(cfg: TrainConfig, device: str | torch.device = "cpu") -> tuple[Any, Any]:
    """(model, tokenizer) as a run with `cfg` builds it before training: the base model in the
    configured dtype, wrapped in its LoRA adapter when the run trains one."""
    model, tok = models.load_model(cfg.model.name, dtype=cfg.model.dtype, device=device)
    if cfg.model.lora_rank > 0:
        m = cfg.model
        model = models.add_lora(
            model,
            rank=m.lora_rank,
            alpha=m.lora_alpha,
            dropout=m.lora_dropout,
            targets=m.lora_targets,
            name=repr(m.name),
        )
    return model, tok


def load_run_policy(
    run_dir: Path | RunDir, step: int | None = None, device: str | torch.device = "cpu", log: Any = None
) -> tuple[Any, Any, str]:
    """(model, tokenizer, description) of a run's policy at checkpoint `step` (None: the newest good one).

    The run's base model and LoRA configuration come from its config.toml (read leniently, as the
    reports that call this read it: a key this version does not know is ignored; they say so); the
    checkpoint's digest is verified first. The model is in eval mode.
    """
    rd = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    cfg = rd.read_config(skipped=[])
    if step is None:
        state = load_latest_checkpoint(rd, log=log)
        if state is None:
            raise ConfigError(f"no usable checkpoint in {rd.checkpoints_dir}")
    else:
        path = rd.checkpoint_path(step)
        if not path.is_file():
            have = ", ".join(f"step_{s}" for s in rd.checkpoint_steps()) or "none"
            raise ConfigError(f"{rd.path}: no checkpoint at step {step} ({path.name}); saved: {have}")
        ok, why = verify_checkpoint(path)
        if not ok:
            raise ConfigError(f"checkpoint {path} is unusable: {why}")
        state = _read(path)
    model, tok = build_policy(cfg, device)
    models.restore_parameters(model, state["model"], f"checkpoint step {int(state['step'])} of {rd.path}")
    model.eval()
    adapter = " + LoRA adapter" if cfg.model.lora_rank > 0 else ""
    return model, tok, f"base {cfg.model.name!r}{adapter} from checkpoint step {int(state['step'])}"


def _critic_state(rd: RunDir, step: int | None, log: Any) -> tuple[dict[str, Any], int, str]:
    """(the critic's weights, their step, which file): checkpoint `step` when named, else final/critic.pt
    (written at the end of the run), else the newest usable checkpoint that holds a critic."""
    say = log or (lambda msg: print(msg, file=sys.stderr))
    if step is None and rd.has_final_critic():
        try:
            saved = _read(rd.final_critic_path)
            return saved["model"], int(saved["step"]), str(rd.final_critic_path)
        except Exception as e:  # noqa: BLE001 - any unpickling failure means a bad file: try the checkpoints
            say(f"{rd.final_critic_path} could not be read ({type(e).__name__}); trying the checkpoints")
    if step is not None:
        path = rd.checkpoint_path(step)
        ok, why = verify_checkpoint(path) if path.is_file() else (False, "no such file")
        if not ok:
            have = ", ".join(f"step_{s}" for s in rd.checkpoint_steps()) or "none"
            raise ConfigError(f"{path}: checkpoint step {step} is unusable ({why}); saved: {have}")
        state: dict[str, Any] | None = _read(path)
    else:
        state = load_latest_checkpoint(rd, log=say)
    critic = (state or {}).get("extra", {}).get("critic")
    if state is None or critic is None:
        where = (
            f"checkpoint step {step}"
            if step is not None
            else f"no {rd.final_critic_path.name} in {rd.final_dir}"
        )
        raise ConfigError(
            f"{rd.path}: no saved critic ({where}, and no usable checkpoint holds one); train the run to a "
            "checkpoint first"
        )
    return critic["model"], int(state["step"]), str(rd.checkpoint_path(int(state["step"])))


def load_run_critic(
    path: str | Path, device: str | torch.device = "cpu", log: Any = None, option: str = "--critic"
) -> TrainedCritic:
    """The trained critic of the run at `path` (RUN_DIR, its final/ or checkpoints/, or one step_N.pt): its
    saved weights (`_critic_state`) on a value model of the run's `model.name`, with that model's tokenizer and
    the run's recipe. ConfigError naming `option` when the run trained no critic or saved none."""
    rd, step = RunDir.containing(path, option)
    cfg = rd.read_config(skipped=[])
    recipe = rd.read_recipe(cfg, skipped=[])
    if not needs_values(recipe):
        raise ConfigError(
            f"{option} {path}: the run trained with recipe {recipe.name!r}, which has no critic (a run trained "
            f"with {' / '.join(critic_recipes())} has one)"
        )
    weights, at, where = _critic_state(rd, step, log)
    lm, tok = models.load_model(cfg.model.name, dtype=cfg.model.dtype, device=device)
    model = value_model_from_state(lm, weights, recipe, f"{option} {where}").to(device)
    return TrainedCritic(model, tok, recipe, at, f"the critic of run {rd.path} after step {at} ({where})")

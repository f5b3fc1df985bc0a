"""Atomic checkpoints and crash-safe metrics.

A checkpoint is one file `checkpoints/step_NNNNNN.pt` holding the trainable parameters (the
LoRA adapter, or every weight under full fine-tuning), optimizer and scheduler states, RNG
states and the step, plus a SHA-256 of its bytes in `step_NNNNNN.json`. Both are written to a
temporary file, fsynced and renamed, so a crash leaves either the old or the new file, never a
torn one (a temporary file left by a killed writer is deleted by the next save). Loading
verifies the digest; a corrupt or partial checkpoint is reported and the previous one is used.

`metrics.jsonl` gets one line per step, flushed and fsynced; on resume, lines after the
checkpoint's step and any torn last line are dropped, so the file has no duplicates.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    _atomic_write_bytes(Path(path), text.encode())


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
    run_dir: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    extra: dict[str, Any] | None = None,
    keep: int = 2,
) -> Path:
    ckdir = Path(run_dir) / "checkpoints"
    ckdir.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(ckdir)
    payload = {
        "step": step,
        "model": trainable_state(model),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": rng_state(),
        "extra": extra or {},
    }
    import io

    buf = io.BytesIO()
    torch.save(payload, buf)
    data = buf.getvalue()
    path = ckdir / f"step_{step:06d}.pt"
    _atomic_write_bytes(path, data)
    meta = {"step": step, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    atomic_write_text(path.with_suffix(".json"), json.dumps(meta))
    for old in sorted(ckdir.glob("step_*.pt"))[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
        old.with_suffix(".json").unlink(missing_ok=True)
    return path


def _remove_stale_temps(ckdir: Path) -> None:
    """Delete temp files a killed process left behind (a checkpoint-sized file each, never renamed).

    Only another process's temps are stale: ours are renamed before `_atomic_write_bytes` returns.
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


def load_latest_checkpoint(run_dir: Path, log: Any = None) -> dict[str, Any] | None:
    """The newest checkpoint whose digest verifies (earlier ones are tried in turn); None if none."""
    say = log or (lambda msg: print(msg, file=sys.stderr))
    for path in sorted((Path(run_dir) / "checkpoints").glob("step_*.pt"), reverse=True):
        ok, why = verify_checkpoint(path)
        if not ok:
            say(f"checkpoint {path} is unusable ({why}); trying the previous one")
            continue
        try:
            return torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e:  # noqa: BLE001 - any unpickling failure means a bad file
            say(f"checkpoint {path} could not be read ({type(e).__name__}: {e}); trying the previous one")
    return None


def restore(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, ckpt: dict[str, Any]) -> int:
    params = dict(model.named_parameters())
    missing = [n for n in ckpt["model"] if n not in params]
    if missing:
        raise RuntimeError(f"checkpoint has parameters the model lacks (different model or LoRA config?): {missing[:3]}")
    with torch.no_grad():
        for n, t in ckpt["model"].items():
            params[n].copy_(t.to(params[n].device, params[n].dtype))
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    set_rng_state(ckpt["rng"])
    return int(ckpt["step"])


class MetricsLog:
    """Append-only JSONL of per-step metrics; each line flushed and fsynced."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def truncate_after(self, step: int) -> None:
        """Keep only complete lines with step <= `step` (drops a torn tail and lines a crash will redo)."""
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if int(rec.get("step", -1)) <= step:
                kept.append(line)
        atomic_write_text(self.path, "".join(k + "\n" for k in kept))

    def append(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

"""The run directory: the one module that knows where a run keeps each file and how it is written.

    RUN_DIR/config.toml            the resolved TrainConfig (`tokencredit train --resume` reads it)
    RUN_DIR/recipe.json            the resolved recipe (overrides applied)
    RUN_DIR/metrics.jsonl          one JSON line per step / evaluation, flushed and fsynced
    RUN_DIR/rollouts/step_N.jsonl  saved rollout groups with per-token Â and signals (`tokencredit explain`)
    RUN_DIR/checkpoints/step_N.pt  trainable parameters + optimizer, scheduler, RNG; step_N.json its SHA-256
    RUN_DIR/summary.json           start / final evaluation, wall time, the exported model's path
    RUN_DIR/curves.png             training curves
    RUN_DIR/final/                 the trained model as a plain Hugging Face directory (LoRA merged)
    RUN_DIR/train.log              the output of a run that `tokencredit compare --jobs` started
    RUN_DIR/explain_step_N.html    `tokencredit explain`'s page of saved step N (default output)
    RUN_DIR/probe.json (+ .md)     `tokencredit probe`'s report on the run (default output)

Every file is written atomically (temporary file, fsync, rename): a crash leaves the old file or
the new one, never a torn one. `metrics.jsonl` is append-only; on resume, lines after the
checkpoint's step and a torn last line are dropped. A failed write (a full disk above all) leaves
nothing behind: the temporary file is removed, a partly appended metrics line is cut off, and a
full disk (ENOSPC, or EDQUOT for a quota) raises `DiskFullError` naming the file.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from tokencredit.batch import MC_SIGNALS
from tokencredit.errors import ConfigError, DiskFullError
from tokencredit.recipes import Recipe, from_dict, resolve
from tokencredit.train.config import TrainConfig, dump_toml, load_config

__all__ = [
    "MetricsLog", "RunDir", "atomic_write_bytes", "atomic_write_text", "disk_full", "fsync_dir", "is_disk_full",
    "rollout_records",
]  # fmt: skip

_STEP_FILE = re.compile(r"^step_(\d+)\.(jsonl|pt)$")


def fsync_dir(d: Path) -> None:
    """Make a rename inside `d` durable (best effort: not every file system supports it)."""
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


def is_disk_full(e: BaseException) -> bool:
    """True for the OSError of a write to a full disk or an exhausted quota."""
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full(path: Path, e: OSError) -> DiskFullError:
    """The one-line error of a write to `path` that found the disk full."""
    return DiskFullError(f"disk full while writing {path} ({e.strerror or e}); that write was undone", str(path))


def _write_all(fd: int, data: bytes) -> None:
    """os.write until all of `data` is written (a write may be short, e.g. when the disk fills up)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, fsync it, rename it over `path`. On any
    failure the temporary file is removed and `path` is untouched; a full disk raises DiskFullError."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:  # also KeyboardInterrupt: never leave a temporary file behind
        tmp.unlink(missing_ok=True)
        if is_disk_full(e):
            raise disk_full(path, e) from e  # type: ignore[arg-type]
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(Path(path), text.encode())


class MetricsLog:
    """Append-only JSONL of per-step metrics; each line flushed and fsynced."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def truncate_after(self, step: int) -> None:
        """Keep only complete lines with step <= `step` (drops a torn tail and lines a crash will redo)."""
        if not self.path.exists():
            return
        kept = [line for line, rec in self._lines() if int(rec.get("step", -1)) <= step]
        atomic_write_text(self.path, "".join(k + "\n" for k in kept))

    def append(self, record: dict[str, Any]) -> None:
        """Append one line, fsynced. If the write fails part-way (a full disk: DiskFullError) the
        file is cut back to its previous length, so it never ends in a torn line."""
        data = (json.dumps(record, sort_keys=True) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            size = os.fstat(fd).st_size
            try:
                _write_all(fd, data)
                os.fsync(fd)
            except BaseException as e:
                os.ftruncate(fd, size)  # frees space, so it works on a full disk too
                if is_disk_full(e):
                    raise disk_full(self.path, e) from e  # type: ignore[arg-type]
                raise
        finally:
            os.close(fd)

    def read(self) -> list[dict[str, Any]]:
        """Every complete record (a torn or damaged line is skipped)."""
        return [rec for _, rec in self._lines()]

    def _lines(self) -> Iterator[tuple[str, dict[str, Any]]]:
        if not self.path.exists():
            return
        for line in self.path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                yield line, rec


class RunDir:
    """Paths and file I/O of one run directory (see the module docstring for the layout)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.config_path = self.path / "config.toml"
        self.recipe_path = self.path / "recipe.json"
        self.metrics = MetricsLog(self.path / "metrics.jsonl")
        self.rollouts_dir = self.path / "rollouts"
        self.checkpoints_dir = self.path / "checkpoints"
        self.summary_path = self.path / "summary.json"
        self.curves_path = self.path / "curves.png"
        self.final_dir = self.path / "final"
        self.log_path = self.path / "train.log"

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def is_run(self) -> bool:
        """True for a directory a trainer wrote (a config, or at least checkpoints)."""
        return self.path.is_dir() and (self.config_path.is_file() or self.checkpoints_dir.is_dir())

    # ------------------------------------------------------------------ config and recipe
    def write_config(self, cfg: TrainConfig) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.config_path, dump_toml(cfg))

    def read_config(self) -> TrainConfig:
        if not self.config_path.is_file():
            raise ConfigError(f"{self.path}: no config.toml (not a tokencredit run directory?)")
        return load_config(self.config_path)

    def write_recipe(self, recipe: Recipe) -> None:
        atomic_write_text(self.recipe_path, json.dumps(recipe.to_dict(), indent=2))

    def read_recipe(self, cfg: TrainConfig | None = None) -> Recipe:
        """The recipe the run trained with: recipe.json, else the one its config resolves to."""
        if not self.recipe_path.is_file():
            cfg = cfg if cfg is not None else self.read_config()
            return resolve(cfg.algo.recipe, cfg.algo.overrides)
        try:
            data = json.loads(self.recipe_path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{self.recipe_path}: not a recipe ({e})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{self.recipe_path}: not a recipe (a JSON object is expected)")
        return from_dict(data, str(self.recipe_path))

    # ------------------------------------------------------------------ rollouts
    def rollout_path(self, step: int) -> Path:
        return self.rollouts_dir / f"step_{step:06d}.jsonl"

    def rollout_steps(self) -> list[int]:
        """Steps with saved rollouts, ascending."""
        return self._steps(self.rollouts_dir, "jsonl")

    def write_rollouts(self, step: int, records: list[dict[str, Any]]) -> Path:
        """One JSON line per saved group."""
        self.rollouts_dir.mkdir(parents=True, exist_ok=True)
        path = self.rollout_path(step)
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))
        return path

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_path(self, step: int) -> Path:
        return self.checkpoints_dir / f"step_{step:06d}.pt"

    def checkpoint_steps(self) -> list[int]:
        """Steps with a checkpoint file, ascending (their digests are checked when they are loaded)."""
        return self._steps(self.checkpoints_dir, "pt")

    # ------------------------------------------------------------------ outputs
    def has_final_model(self) -> bool:
        """True once the trainer exported the final model (a Hugging Face directory) to final/."""
        return (self.final_dir / "config.json").is_file()

    def explain_path(self, step: int) -> Path:
        return self.path / f"explain_step_{step:06d}.html"

    @property
    def probe_path(self) -> Path:
        return self.path / "probe.json"

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_text(self.summary_path, json.dumps(summary, indent=2))

    def read_summary(self) -> dict[str, Any] | None:
        if not self.summary_path.is_file():
            return None
        try:
            data = json.loads(self.summary_path.read_text())
        except json.JSONDecodeError:
            return None
        return data if isinstance(data, dict) else None

    @staticmethod
    def _steps(folder: Path, suffix: str) -> list[int]:
        if not folder.is_dir():
            return []
        found = (_STEP_FILE.match(p.name) for p in folder.iterdir())
        return sorted(int(m.group(1)) for m in found if m is not None and m.group(2) == suffix)


def rollout_records(
    step: int, recipe: Recipe, ro: Any, batch: Any, credit: Any, tokenizer: Any, max_groups: int
) -> list[dict[str, Any]]:
    """The saved form of a step's first `max_groups` groups (rollouts/step_N.jsonl, read by
    `tokencredit explain`): per completion its text, token ids and tokens, score, whether the
    verifier timed out on it, sequence advantage A, per-token Â, the old policy's entropy and log-probs, and
    the Monte-Carlo signals (`batch.MC_SIGNALS`) when the recipe sampled them."""
    groups = torch.unique(ro.group_ids, sorted=True)[:max_groups]
    seq, tok = credit.seq_advantages, credit.token_advantages
    out = []
    for gid in groups.tolist():
        rows = (ro.group_ids == gid).nonzero().flatten().tolist()
        p = ro.problems[rows[0]]
        comps = []
        for i in rows:
            n = int(batch.mask[i].sum())
            ids = batch.token_ids[i, :n].tolist()
            comps.append({
                "text": ro.texts[i],
                "token_ids": ids,
                "tokens": tokenizer.convert_ids_to_tokens(ids),
                "score": float(ro.scores[i]),
                "correct": bool(ro.correct[i]),
                "verify_timeout": bool(ro.timed_out[i]),
                "advantage": float(seq[i]),
                "token_advantages": [round(float(x), 6) for x in tok[i, :n]],
                "entropy": None if batch.entropy is None else [round(float(x), 5) for x in batch.entropy[i, :n]],
                "old_log_probs": None if batch.old_log_probs is None else [
                    round(float(x), 5) for x in batch.old_log_probs[i, :n]
                ],
                "truncated": bool(ro.truncated[i]),
                **{s: [round(float(x), 6) for x in getattr(batch, s)[i, :n]] for s in MC_SIGNALS
                   if getattr(batch, s, None) is not None},
            })  # fmt: skip
        out.append({
            "step": step, "recipe": recipe.name, "credit": recipe.credit, "group": gid,
            "id": str(getattr(p, "id", "")), "problem": p.problem, "answer": p.answer, "completions": comps,
        })  # fmt: skip
    return out

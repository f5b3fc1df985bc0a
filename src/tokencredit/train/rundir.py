"""The run directory: the one module that knows where a run keeps each file and how it is written.

    RUN_DIR/config.toml            the resolved TrainConfig (`tokencredit train --resume` reads it)
    RUN_DIR/recipe.json            the resolved recipe (overrides applied)
    RUN_DIR/metrics.jsonl          one JSON line per step / evaluation, flushed and fsynced
    RUN_DIR/rollouts/step_N.jsonl  saved rollout groups with per-token Â and signals (`tokencredit explain`)
    RUN_DIR/checkpoints/step_N.pt  trainable parameters + optimizer, scheduler, RNG; step_N.json its SHA-256
    RUN_DIR/summary.json           start / final evaluation, wall time, the exported model's path
    RUN_DIR/curves.png             training curves
    RUN_DIR/final/                 the trained model as a plain Hugging Face directory (LoRA merged)
    RUN_DIR/final/critic.pt        a critic's weights at the end of the run (recipes ppo / bpco; explain, probe)
    RUN_DIR/train.log              the output of a run that `tokencredit compare --jobs` started
    RUN_DIR/explain_step_N.html    `tokencredit explain`'s page of saved step N (default output)
    RUN_DIR/probe.json (+ .md)     `tokencredit probe`'s report on the run (default output)
    RUN_DIR/tensorboard/           TensorBoard event files (run.report_to, tokencredit.train.trackers)
    RUN_DIR/wandb/                 the wandb run's local files (unless WANDB_DIR is set)
    RUN_DIR/mlruns/                the MLflow file store (unless MLFLOW_TRACKING_URI is set)
    RUN_DIR/trackers.json          the wandb / MLflow run ids, so that a resumed run continues them
    RUN_DIR/.lock                  held (flock) by the one process that writes the run (`RunLock`)

One writer per run directory: `tokencredit train`, `--resume` and `compare`'s runs hold an exclusive
lock on RUN_DIR/.lock for the life of the process (`tokencredit.train.lock.RunLock`, taken by
`RunDir.claim`; the OS releases it on any exit, kill -9 included); a second writer stops at once naming the holder's pid. Readers (explain, probe, eval)
take no lock. A new run never lands in a directory that holds another (`RunDir.check_fresh`):
`--overwrite` replaces a run directory whole (`replace_run`), never a folder of other files.

Every file is written atomically (`tokencredit.atomic`: temporary file, fsync, rename): a crash leaves
the old file or the new one, never a torn one. `metrics.jsonl` is append-only; on resume, lines after the
checkpoint's step and a torn last line are dropped, and a damaged line before the last is an error
naming file:line (nothing is dropped that the user has not seen). A failed write leaves nothing
behind: the temporary file is removed and a partly appended metrics line is cut off; a full disk
(ENOSPC, or EDQUOT for a quota) raises `DiskFullError` naming the file, and a file system that turned
read-only, a permission taken away or an I/O error raises its parent `WriteFailedError`
(`tokencredit.atomic.write_error`).

Reading has two modes. Strict (the default, what `tokencredit train --resume` needs): a config key
or recipe field this version does not know, or a saved-rollouts line that is not JSON, is an error
naming the file. Lenient (the reports: explain, probe, compare): pass a list as `skipped`, and what
is readable is used while each part left out (a damaged line, an unknown key or field) adds one line
there naming file:line, what was skipped and what to do. `metrics.jsonl` always skips damaged lines
(a run stopped mid-write leaves a cut-off last line), saying so when `skipped` is given.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from tokencredit.atomic import atomic_write_text, fsync_dir, write_all, write_error
from tokencredit.batch import MC_SIGNALS
from tokencredit.errors import ConfigError
from tokencredit.recipes import Recipe, from_dict, resolve
from tokencredit.rollout import records
from tokencredit.train.config import TrainConfig, dump_toml, load_config
from tokencredit.train.lock import LOCK_NAME, RunLock

__all__ = [
    "CRITIC_FILE",
    "MetricsLog",
    "RunDir",
    "damaged_line",
    "check_replaceable",
    "parse_json_line",
    "replace_run",
    "rollout_records",
]

_STEP_FILE = re.compile(r"^step_(\d+)\.(jsonl|json|pt)$")
# The critic's weights in final/ (a file name, so the trainer can write it into final/'s temporary copy)
CRITIC_FILE = "critic.pt"
_REMEDY = "repair or delete that line, or copy the file again, to silence this"


class MetricsLog:
    """Append-only JSONL of per-step metrics; each line flushed and fsynced."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def truncate_after(self, step: int) -> None:
        """Keep only complete lines with step <= `step` (drops a torn last line and lines a crash will
        redo). A damaged line before the last is a ConfigError naming file:line: it is not a crash's
        cut-off write, and dropping it would lose a record without a word."""
        if not self.path.exists():
            return
        lines = list(self._lines())
        for n, _, rec, why in lines[:-1]:
            if rec is None:
                raise ConfigError(
                    f"{self.path}:{n}: damaged line in the middle of the run's metrics ({why}); repair or "
                    "delete that line, then resume again"
                )
        kept = [line for _, line, rec, _ in lines if rec is not None and rec["step"] <= step]
        atomic_write_text(self.path, "".join(k + "\n" for k in kept))

    def append(self, record: dict[str, Any]) -> None:
        """Append one line, fsynced. If the write fails part-way (a full disk: DiskFullError) the
        file is cut back to its previous length, so it never ends in a torn line."""
        data = (json.dumps(record, sort_keys=True) + "\n").encode()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as e:
            if (err := write_error(self.path, e)) is not None:
                raise err from e
            raise
        try:
            size = os.fstat(fd).st_size
            try:
                write_all(fd, data)
                os.fsync(fd)
            except BaseException as e:
                try:
                    os.ftruncate(fd, size)  # frees space, so it works on a full disk too
                except OSError:
                    pass  # read-only by now: the torn tail is dropped on resume (`truncate_after`)
                if (err := write_error(self.path, e)) is not None:
                    raise err from e
                raise
        finally:
            os.close(fd)

    def read(self, skipped: list[str] | None = None) -> list[dict[str, Any]]:
        """Every whole record. A damaged line (cut off, not JSON, not an object with an integer "step")
        is left out; with `skipped` a list, one line per damaged line is appended there."""
        lines = list(self._lines())
        records = [rec for _, _, rec, _ in lines if rec is not None]
        if skipped is not None:
            last = lines[-1][0] if lines else 0
            bad = [(n, why) for n, _, rec, why in lines if rec is None]
            skipped += [damaged_line(self.path, n, why, len(records), last=n == last) for n, why in bad]
        return records

    def _lines(self) -> Iterator[tuple[int, str, dict[str, Any] | None, str]]:
        """(line number, line, record or None, why it is not one) of every non-blank line."""
        if not self.path.exists():
            return
        for n, line in enumerate(self.path.read_text(errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            obj, why = parse_json_line(line)
            step = obj.get("step") if isinstance(obj, dict) else None
            if why is None and (isinstance(step, bool) or not isinstance(step, int)):
                why = 'not a record with an integer "step"'
            yield n, line, (obj if why is None else None), why or ""


def parse_json_line(line: str) -> tuple[Any, str | None]:
    """(value, None) for a line of JSON, else (None, why not)."""
    try:
        return json.loads(line), None
    except json.JSONDecodeError as e:
        return None, f"not JSON: {e.msg}, column {e.colno}"
    except RecursionError:
        return None, "JSON nested too deeply to read"


def _parse_json_bytes(line: bytes) -> tuple[Any, str | None]:
    """`parse_json_line` of one line of bytes, which must be UTF-8."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"not UTF-8 text: byte 0x{line[e.start]:02x} at byte {e.start + 1} of the line"
    return parse_json_line(text)


def damaged_line(path: Path, n: int, why: str, kept: int, *, last: bool = False, what: str = "line") -> str:
    """The one line a lenient read adds to `skipped` for a damaged line of a JSONL file."""
    cut = "cut-off last line" if last else f"damaged {what}"
    return f"{path}:{n}: {cut} skipped ({why}); the rest is used ({kept} {what}{'' if kept == 1 else 's'}; {_REMEDY})"


def _line_of(text: str, pattern: str, section: str | None = None) -> str:
    """':N' for the first line of `text` matching regex `pattern` (in TOML [`section`] if given), else ''."""
    current = None
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("[") and section is not None:
            current = stripped.strip("[] ")
        elif current == section and re.match(pattern, stripped):
            return f":{n}"
    return ""


def _toml_line(text: str, name: str) -> str:
    """':N' for the line of `[section]` (name "section") or of `key =` inside it ("section.key")."""
    section, _, key = name.partition(".")
    if not key:
        return _line_of(text, rf"\[\s*{re.escape(section)}\s*\]")
    return _line_of(text, rf'"?{re.escape(key)}"?\s*=', section)


class RunDir:
    """Paths and file I/O of one run directory (see the module docstring for the layout)."""

    def __init__(self, path: str | Path) -> None:
        # normalised as text ("a/../run" is "run"): making it never creates a directory it passes through
        self.path = Path(os.path.normpath(path))
        self.config_path = self.path / "config.toml"
        self.recipe_path = self.path / "recipe.json"
        self.metrics = MetricsLog(self.path / "metrics.jsonl")
        self.rollouts_dir = self.path / "rollouts"
        self.checkpoints_dir = self.path / "checkpoints"
        self.summary_path = self.path / "summary.json"
        self.curves_path = self.path / "curves.png"
        self.final_dir = self.path / "final"
        self.final_critic_path = self.final_dir / CRITIC_FILE
        self.log_path = self.path / "train.log"
        self.tensorboard_dir = self.path / "tensorboard"
        self.mlflow_dir = self.path / "mlruns"
        self.trackers_path = self.path / "trackers.json"

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def is_run(self) -> bool:
        """True for a directory a trainer wrote (a config, or at least checkpoints)."""
        return self.path.is_dir() and (self.config_path.is_file() or self.checkpoints_dir.is_dir())

    # ------------------------------------------------------------------ claiming the directory
    def check_fresh(self, option: str = "--out") -> None:
        """ConfigError unless a new run may start here: the path is absent, an empty directory, or one
        that holds only what comes before a run's first record (`_PREPARED`: the config that
        `tokencredit compare` writes before it starts the run, a lock, a start-up log). Only reads."""
        where = f"{option} {self.path}"
        try:
            exists, is_dir = self.path.exists(), self.path.is_dir()
            if exists and not is_dir:
                raise ConfigError(f"{where} is a file, not a directory: give a directory for the run")
            if not exists:
                _check_creatable(self.path, where)
                return
            entries = sorted(p.name for p in self.path.iterdir())
        except OSError as e:  # a name too long, a loop of links, a directory it may not read
            raise ConfigError(f"{where}: cannot use it ({e.strerror or e})") from None
        if not set(entries) - _PREPARED:
            if not os.access(self.path, os.W_OK | os.X_OK):
                raise ConfigError(f"{where}: the directory is not writable")
            return
        if not self.is_run():
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            raise ConfigError(
                f"{where} is not empty ({len(entries)} entries: {shown}) and is not a tokencredit run "
                "directory: give a new or empty directory"
            )
        raise ConfigError(
            f"{where} already holds a run ({self._what_is_here()}): continue it with `tokencredit train "
            f"--resume {self.path}`, or give a new {option} (--overwrite replaces that run)"
        )

    def claim(self, *, fresh: bool, option: str = "--out") -> RunLock:
        """Make the directory and take its lock (`RunLock`) for this process's life; for a fresh run,
        check again under the lock that no other run was written here since `check_fresh`."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"{option} {self.path}: cannot create it ({e.strerror or e})") from None
        lock = RunLock(self.path, option)
        if fresh:
            try:
                self.check_fresh(option)
            except ConfigError:
                lock.release()
                raise
        return lock

    def _what_is_here(self) -> str:
        """'N steps logged, checkpoints up to step K' or what else shows a run was written here."""
        steps = sum(1 for r in self.metrics.read() if r.get("type") != "eval")
        ckpts = self.checkpoint_steps()
        parts = [f"{steps} step{'' if steps == 1 else 's'} logged"]
        if ckpts:
            parts.append(f"checkpoints up to step {ckpts[-1]}")
        if self.has_final_model():
            parts.append("a final model")
        return ", ".join(parts)

    # ------------------------------------------------------------------ config and recipe
    def write_config(self, cfg: TrainConfig) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.config_path, dump_toml(cfg))

    def read_config(self, skipped: list[str] | None = None) -> TrainConfig:
        """The run's TrainConfig. A section or key this version does not know is an error (what
        `tokencredit train --resume` needs); with `skipped` a list it is ignored and said there."""
        if not self.config_path.is_file():
            raise ConfigError(f"{self.path}: no config.toml (not a tokencredit run directory?)")
        if skipped is None:
            return load_config(self.config_path)
        unknown: list[str] = []
        cfg = load_config(self.config_path, unknown=unknown)
        text = self.config_path.read_text(errors="replace") if unknown else ""
        for name in unknown:
            kind = "key" if "." in name else "section"
            skipped.append(
                f"{self.config_path}{_toml_line(text, name)}: unknown {kind} {name} ignored (written by a "
                "newer tokencredit?); the run's other settings are used (upgrade tokencredit to read it)"
            )
        return cfg

    def write_recipe(self, recipe: Recipe) -> None:
        atomic_write_text(self.recipe_path, json.dumps(recipe.to_dict(), indent=2))

    def read_recipe(self, cfg: TrainConfig | None = None, skipped: list[str] | None = None) -> Recipe:
        """The recipe the run trained with: recipe.json, else the one its config resolves to. A field this
        version does not know is an error; with `skipped` a list it is dropped and said there, and a
        recipe.json that is not JSON gives way to the config's recipe, said there too."""
        if not self.recipe_path.is_file():
            cfg = cfg if cfg is not None else self.read_config(skipped)
            return resolve(cfg.algo.recipe, cfg.algo.overrides)
        text = self.recipe_path.read_text(errors="replace")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            if skipped is None:
                raise ConfigError(f"{self.recipe_path}:{e.lineno}: not a recipe ({e.msg})") from None
            cfg = cfg if cfg is not None else self.read_config(skipped)
            skipped.append(
                f"{self.recipe_path}:{e.lineno}: damaged, not read ({e.msg}); the recipe is resolved from "
                f"config.toml ({cfg.algo.recipe!r} with its algo.overrides) instead (copy the file again)"
            )
            return resolve(cfg.algo.recipe, cfg.algo.overrides)
        if not isinstance(data, dict):
            raise ConfigError(f"{self.recipe_path}: not a recipe (a JSON object is expected)")
        if skipped is None:
            return from_dict(data, str(self.recipe_path))
        unknown: list[str] = []
        recipe = from_dict(data, str(self.recipe_path), unknown)
        for k in unknown:
            where = _line_of(text, re.escape(json.dumps(k)) + r"\s*:")
            skipped.append(
                f"{self.recipe_path}{where}: unknown recipe field {k!r} ignored (written by a newer "
                "tokencredit?); the recipe's other fields are used (upgrade tokencredit to read it)"
            )
        return recipe

    # ------------------------------------------------------------------ experiment trackers
    def read_tracker_ids(self) -> dict[str, str]:
        """{tracker name: its run id} from trackers.json; {} when there is none or it is damaged (a resumed
        run then starts a new tracker run rather than not training)."""
        try:
            data = json.loads(self.trackers_path.read_text(errors="replace"))
        except (OSError, json.JSONDecodeError):
            return {}
        return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}

    def write_tracker_id(self, tracker: str, run_id: str) -> None:
        """Record `tracker`'s run id (the others are kept)."""
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(
            self.trackers_path, json.dumps({**self.read_tracker_ids(), tracker: run_id}, indent=2)
        )

    # ------------------------------------------------------------------ rollouts
    def rollout_path(self, step: int) -> Path:
        return self.rollouts_dir / f"step_{step:06d}.jsonl"

    def rollout_steps(self) -> list[int]:
        """Steps with saved rollouts, ascending."""
        return self._steps(self.rollouts_dir, "jsonl")

    def read_rollouts(self, step: int, skipped: list[str] | None = None) -> list[tuple[int, Any]]:
        """(line number, JSON value) of each saved group of `step`. A line that is not JSON, or not UTF-8
        (no character is replaced: a guessed one would change the tokens a report scores), is an error
        naming file:line; with `skipped` a list it is left out and said there."""
        path = self.rollout_path(step)
        lines = [(n, x) for n, x in enumerate(path.read_bytes().split(b"\n"), 1) if x.strip()]
        parsed = [(n, *_parse_json_bytes(x)) for n, x in lines]
        bad = [(n, why) for n, _, why in parsed if why is not None]
        if bad and skipped is None:
            raise ConfigError(f"{path}:{bad[0][0]}: damaged saved rollouts ({bad[0][1]})")
        out = [(n, obj) for n, obj, why in parsed if why is None]
        if skipped is not None:
            last = lines[-1][0]
            skipped += [damaged_line(path, n, why, len(out), last=n == last, what="group") for n, why in bad]
        return out

    def write_rollouts(self, step: int, groups: list[dict[str, Any]]) -> Path:
        """One JSON line per saved group (`rollout_records`); a non-finite number is an error naming it."""
        self.rollouts_dir.mkdir(parents=True, exist_ok=True)
        path = self.rollout_path(step)
        atomic_write_text(path, records.jsonl_text(groups))
        return path

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_path(self, step: int) -> Path:
        return self.checkpoints_dir / f"step_{step:06d}.pt"

    def checkpoint_steps(self) -> list[int]:
        """Steps with a checkpoint file, ascending (their digests are checked when they are loaded)."""
        return self._steps(self.checkpoints_dir, "pt")

    def digest_steps(self) -> list[int]:
        """Steps with a checkpoint digest (step_N.json), ascending (without its .pt: a lost checkpoint)."""
        return self._steps(self.checkpoints_dir, "json")

    # ------------------------------------------------------------------ outputs
    def has_final_model(self) -> bool:
        """True once the trainer exported the final model (a Hugging Face directory) to final/."""
        return (self.final_dir / "config.json").is_file()

    def has_final_critic(self) -> bool:
        """True once the trainer saved its critic's final weights (final/critic.pt)."""
        return self.final_critic_path.is_file()

    @classmethod
    def containing(cls, path: str | Path, option: str) -> tuple[RunDir, int | None]:
        """(the run, the checkpoint step a path names or None) for RUN_DIR, RUN_DIR/final, RUN_DIR/checkpoints
        or RUN_DIR/checkpoints/step_N.pt; ConfigError naming `option` for a path that is none of these."""
        p = Path(os.path.normpath(Path(path).expanduser()))
        step = None
        if (
            p.suffix == ".pt"
            and (m := _STEP_FILE.match(p.name)) is not None
            and p.parent.name == "checkpoints"
        ):
            p, step = p.parent.parent, int(m.group(1))
        elif p.name in ("final", "checkpoints") and RunDir(p.parent).is_run():
            p = p.parent
        run = cls(p)
        if not run.is_run():
            raise ConfigError(
                f"{option} {path}: not a tokencredit run directory (no config.toml or checkpoints/ there)"
            )
        return run, step

    def explain_path(self, step: int) -> Path:
        return self.path / f"explain_step_{step:06d}.html"

    @property
    def probe_path(self) -> Path:
        return self.path / "probe.json"

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_text(self.summary_path, json.dumps(summary, indent=2))

    def read_summary(self, strict: bool = False) -> dict[str, Any] | None:
        """summary.json, None when there is none. A damaged one reads as None, or with `strict` is an error
        naming file:line (`tokencredit compare` must not take it for an unfinished run and train it again)."""
        if not self.summary_path.is_file():
            return None
        try:
            data = json.loads(self.summary_path.read_text(errors="replace"))
        except json.JSONDecodeError as e:
            if strict:
                raise ConfigError(
                    f"{self.summary_path}:{e.lineno}: damaged, not JSON ({e.msg}); "
                    f"`tokencredit train --resume {self.path}` writes it again"
                ) from None
            return None
        return data if isinstance(data, dict) else None

    @staticmethod
    def _steps(folder: Path, suffix: str) -> list[int]:
        if not folder.is_dir():
            return []
        found = (_STEP_FILE.match(p.name) for p in folder.iterdir())
        return sorted(int(m.group(1)) for m in found if m is not None and m.group(2) == suffix)


# What a run directory may hold before its first record: `check_fresh` lets a new run start there.
_PREPARED = frozenset({"config.toml", "recipe.json", "train.log", LOCK_NAME})
# Every name a run directory's layout has (the module docstring); `replace_run` removes nothing else.
_LAYOUT = re.compile(
    r"^(config\.toml|recipe\.json|metrics\.jsonl|rollouts|checkpoints|summary\.json|curves\.png|final|train\.log"
    r"|explain_step_\d+\.(html|png)|probe\.(json|md)|tensorboard|wandb|mlruns|trackers\.json|\.lock|\.final\.tmp"
    r"|\..+\.tmp-\d+)$"
)


def _check_creatable(path: Path, where: str) -> None:
    """ConfigError when `path` (absent) cannot be created: its nearest existing ancestor is a file or
    not writable. Only reads."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{where}: cannot create it, {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{where}: cannot create it, {parent} is not writable")


def check_replaceable(path: str | Path, option: str = "--out") -> None:
    """ConfigError unless `--overwrite` may remove `path`: absent, or a directory that is a tokencredit run
    and holds only names of a run's layout (a folder of other files is never removed). Only reads."""
    path = Path(path)
    if not path.exists():
        return
    if not path.is_dir():
        raise ConfigError(
            f"{option} {path} is a file, not a run directory; --overwrite replaces only a run directory"
        )
    foreign = sorted(p.name for p in path.iterdir() if not _LAYOUT.match(p.name))
    if foreign or not (RunDir(path).is_run() or not any(path.iterdir())):
        what = (
            f"holds {', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}"
            if foreign
            else "is not one"
        )
        raise ConfigError(
            f"{option} {path}: --overwrite replaces only a tokencredit run directory, and this one {what}; "
            "remove it yourself or give another directory"
        )


def replace_run(path: str | Path, option: str = "--out") -> None:
    """`--overwrite`: remove the run directory at `path` whole (`check_replaceable` first), so that a new
    run starts empty. No other process may be writing it: its lock is taken first. It is renamed aside in
    one step and then deleted, so `path` never holds half of the old run; a copy that cannot be deleted
    is left beside it, named in a ConfigError."""
    path = Path(path)
    check_replaceable(path, option)
    if not path.exists():
        return
    lock = RunLock(path, option)
    aside = path.with_name(f".{path.name}.replaced-{os.getpid()}-{time.time_ns()}")
    try:
        os.replace(path, aside)
    except OSError as e:
        raise ConfigError(
            f"{option} {path}: cannot move the old run aside ({e.strerror or e}); nothing was removed"
        ) from None
    finally:
        lock.release()
    fsync_dir(path.parent)
    shutil.rmtree(aside, ignore_errors=True)
    if aside.exists():
        raise ConfigError(
            f"{option} {path}: the old run was moved to {aside} but could not be deleted; delete it yourself"
        )


def rollout_records(
    step: int, recipe: Recipe, ro: Any, batch: Any, credit: Any, tokenizer: Any, max_groups: int
) -> list[dict[str, Any]]:
    """The saved form of a step's first `max_groups` groups (rollouts/step_N.jsonl, read by
    `tokencredit explain`), written by the one writer of that format (`tokencredit.rollout.records`):
    per completion its text, token ids and tokens, score, whether the verifier timed out on it,
    sequence advantage A, per-token Â, the old policy's entropy and log-probs, and the Monte-Carlo
    signals (`batch.MC_SIGNALS`) when the recipe sampled them."""
    groups = torch.unique(ro.group_ids, sorted=True)[:max_groups]
    rows = torch.isin(ro.group_ids, groups).nonzero().flatten()
    lengths = batch.mask[rows].sum(1).tolist()
    signals = {
        s: getattr(batch, s) for s in ("entropy", "old_log_probs")
    }  # None: the pass did not compute it
    signals |= {s: getattr(batch, s) for s in MC_SIGNALS if getattr(batch, s, None) is not None}
    comps = records.completion_records(
        batch.token_ids[rows],
        batch.mask[rows],
        ro.scores[rows],
        credit.seq_advantages[rows],
        credit.token_advantages[rows],
        texts=[ro.texts[i] for i in rows.tolist()],
        tokens=[
            tokenizer.convert_ids_to_tokens(batch.token_ids[i, :n].tolist())
            for i, n in zip(rows.tolist(), lengths)
        ],
        truncated=ro.truncated[rows],
        correct=ro.correct[rows].tolist(),
        signals={s: None if v is None else v[rows] for s, v in signals.items()},
        row_fields=[{"verify_timeout": bool(ro.timed_out[i])} for i in rows.tolist()],
    )
    fields = {}
    for gid in groups.tolist():
        p = ro.problems[int((ro.group_ids == gid).nonzero()[0])]
        ref = getattr(
            p.answer, "ref", None
        )  # a reasoning-gym answer names its entry: explain re-scores with it
        fields[gid] = {
            "id": str(getattr(p, "id", "")),
            "problem": p.problem,
            "answer": p.answer,
            "answer_ref": ref,
        }
    return records.group_records(
        step=step,
        recipe=recipe.name,
        credit=recipe.credit,
        group_ids=ro.group_ids[rows],
        completions=comps,
        fields=fields,
    )

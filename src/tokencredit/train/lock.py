"""One writer per run directory: `RunLock`, an exclusive flock on RUN_DIR/.lock (see
`tokencredit.train.rundir` for who takes it and why)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tokencredit.errors import ConfigError

try:  # POSIX; elsewhere a run directory is not locked (RunLock says so in its docstring)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_NAME", "RunLock"]

LOCK_NAME = ".lock"


class RunLock:
    """The one writer of a run directory: an exclusive, non-blocking `fcntl.flock` on RUN_DIR/.lock,
    held until `release()` or the process's end (the OS drops it on any exit, kill -9 included, so a
    stale lock file never blocks anyone). The holder's pid is written into the file, and a second
    writer's ConfigError names it. Without fcntl (Windows) nothing is locked."""

    def __init__(self, run_dir: str | Path, option: str = "--out") -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self._file: Any = None
        if fcntl is None:  # pragma: no cover - Windows
            return
        try:
            f = open(self.path, "a+")  # noqa: SIM115 - held for the life of the lock
        except OSError as e:
            raise ConfigError(
                f"{option} {run_dir}: cannot create its lock file ({e.strerror or e})"
            ) from None
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            f.close()
            raise ConfigError(
                f"{option} {run_dir} is in use by another tokencredit process (pid {holder}); wait for it to "
                "end, or give another directory"
            ) from None
        f.truncate(0)
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._file = f

    def release(self) -> None:
        """Let another process write the run (idempotent)."""
        if self._file is not None:
            self._file.close()  # closing the file drops the flock
            self._file = None

"""Atomic file writes, and the one-line errors of a write the machine refused.

Every file tokencredit writes (a run directory's files, a checkpoint, compare's report, the saved rollouts
of the TRL and verl plugins) goes through `atomic_write_bytes` / `atomic_write_text`: a temporary file beside
the target, fsynced, renamed over it, and the directory fsynced (`fsync_dir`). A crash leaves the old file or
the new one, never a torn one; a failed write leaves nothing behind (the temporary file is removed). A full
disk (ENOSPC, or EDQUOT for a quota) raises `DiskFullError` naming the file (`disk_full`), and a file system
that turned read-only, a permission taken away or an I/O error raises its parent `WriteFailedError`
(`write_error`, which also translates the failures of writes made elsewhere, e.g. an append to
metrics.jsonl with `write_all`).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from tokencredit.errors import DiskFullError, WriteFailedError

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "disk_full",
    "fsync_dir",
    "is_disk_full",
    "write_all",
    "write_error",
]


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
    return DiskFullError(
        f"disk full while writing {path} ({e.strerror or e}); that write was undone", str(path)
    )


# A write refused by the system rather than by the program: the run's state is kept, and it resumes once fixed.
_WRITE_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO)


def write_error(path: Path, e: BaseException) -> WriteFailedError | None:
    """The one-line error of a failed write to `path`: DiskFullError for a full disk or quota,
    WriteFailedError for a read-only file system, a lost permission or an I/O error; None for any
    other failure (a bug, not the machine: the caller re-raises it)."""
    if is_disk_full(e):
        return disk_full(path, e)  # type: ignore[arg-type]
    if isinstance(e, OSError) and e.errno in _WRITE_ERRNOS:
        return WriteFailedError(f"cannot write {path} ({e.strerror or e}); that write was undone", str(path))
    return None


def write_all(fd: int, data: bytes) -> None:
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
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:  # also KeyboardInterrupt: never leave a temporary file behind
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # a read-only file system refuses the clean-up too; nothing was renamed over `path`
        if (err := write_error(path, e)) is not None:
            raise err from e
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    """`atomic_write_bytes` of `text`, UTF-8 encoded."""
    atomic_write_bytes(Path(path), text.encode())

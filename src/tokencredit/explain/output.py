"""Where an explain report goes: its files checked before any model loads (`check_output`) and written
whole or not at all (`write_whole`), so a failed run never leaves a half-written page or picture that a
later command or a browser would take for a finished one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from tokencredit.errors import ConfigError

__all__ = ["check_output", "same_file", "write_whole"]


def _existing_ancestor(path: Path) -> Path:
    """The nearest ancestor of `path` (or `path` itself) that exists."""
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_output(path: Path, what: str) -> None:
    """ConfigError naming `what` (the option, e.g. "--out") and `path` unless a file can be written there:
    not a directory, its nearest existing ancestor a writable directory (a probe file is made and removed
    there, so a read-only file system or a missing permission is caught even for root). Creates nothing."""
    if path.is_dir():
        raise ConfigError(f"{what} {path}: is a directory; give a file name (e.g. {path / 'credit.html'})")
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{what} {path}: the file exists and cannot be written (no permission)")
    base = _existing_ancestor(path.parent)
    if not base.is_dir():
        raise ConfigError(f"{what} {path}: {base} is a file, not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".tokencredit-probe-", dir=base)
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot write in {base} ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(probe)


def same_file(a: Path, b: Path) -> bool:
    """Whether `a` and `b` name the same file (after resolving links and '..')."""
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def write_whole(path: Path, data: bytes, what: str) -> Path:
    """Write `data` to a temporary file beside `path`, then rename it over `path`: `path` holds either its
    previous contents or all of `data`. A failure is a ConfigError naming `what` and `path`."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            view = memoryview(data)
            while view:  # a write may be short (a disk filling up)
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:  # also KeyboardInterrupt: never leave the temporary file behind
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise ConfigError(
                f"{what} {path}: cannot write it ({e.strerror or e}); nothing was written"
            ) from None
        raise
    return path

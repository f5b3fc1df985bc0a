"""Stopping a training run on SIGINT (Ctrl-C) or SIGTERM without losing a finished step.

The first signal asks the run to stop: the step in progress runs to its end (sampling, scoring,
update, its metrics line and, when they are due, its evaluation and checkpoint), a checkpoint of
that step is written, and the run ends with `tokencredit.errors.Interrupted` (exit code 130 / 143)
and a line saying how to continue. A step is finished rather than abandoned because most of its
time is generation, which cannot be resumed half-way: cutting it would throw that time away, and
finishing it keeps `--resume` identical to an uninterrupted run. A second signal stops at once
(`StopNow`): the step in progress is abandoned, and `--resume` continues from the newest checkpoint.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

__all__ = ["StopNow", "StopSignals", "signal_name", "stopped_message"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopNow(BaseException):
    """The second stop signal: leave the step in progress now."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal_name(signum))
        self.signum = signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopSignals:
    """SIGINT / SIGTERM handlers for the duration of a `with` block (the previous handlers come
    back after it). The first signal sets `signum` and calls `on_first(signum)`; a second one
    raises `StopNow`. Outside the main thread, where Python cannot install handlers, it does nothing."""

    def __init__(self, on_first: Callable[[int], None] | None = None) -> None:
        self.on_first = on_first
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)  # type: ignore[arg-type]
        self._previous = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            raise StopNow(signum)
        self.signum = signum
        if self.on_first is not None:
            self.on_first(signum)


def stopped_message(
    signum: int, run_dir: Path, step_done: int, *, abandoned: bool, checkpoint: int | None
) -> str:
    """The one line a stopped run ends with: what was kept and the command that continues it."""
    name = signal_name(signum)
    resume = f"continue with: tokencredit train --resume {run_dir}"
    if abandoned:
        kept = f"the newest checkpoint is step {checkpoint}" if checkpoint else "there is no checkpoint yet"
        return f"stopped by {name} during step {step_done + 1}, which is abandoned ({kept}); {resume}"
    if step_done == 0:
        return f"stopped by {name} before step 1; {resume}"
    return f"stopped by {name} after step {step_done}; {resume}"

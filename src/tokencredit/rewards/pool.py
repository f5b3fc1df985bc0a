"""The verifier's worker processes: `_worker.py` subprocesses judging (golds, answer) pairs under a
wall-clock limit per answer (or another worker script speaking the same protocol, such as
`_rg_worker.py`, reasoning-gym's checkers, whose jobs are JSON objects and whose verdicts are scores,
or `_custom_worker.py`, a user's reward function, whose verdicts are JSON objects passed through).

Each answer is sent to an idle worker; a worker that has not answered when its deadline passes is
killed and replaced, and that answer is reported as timed out (None), never as a verdict. A worker
counts as ready only after its start-up self-check: real symbolic comparisons that pay math-verify's
and sympy's lazy imports before the first timed answer does (a cold first comparison costs about a
second, several under load, which a 5 s limit does not always cover). The workers are plain
subprocesses talking JSON lines over pipes (POSIX), so nothing depends on the multiprocessing start
method or on the caller's ``__main__`` module.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

_WORKER_SCRIPT = str(Path(__file__).with_name("_worker.py"))
# A job: (acceptable golds, answer) for the math worker, or a JSON object for another worker script.
Job = tuple[Sequence[str], str] | dict[str, Any]

__all__ = ["WorkerPool", "WorkerStartError"]


class WorkerStartError(RuntimeError):
    """A worker could not start: it failed its start-up self-check, exited or did not become ready in
    time. `detail` is the worker's own reason when it gave one (else "")."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


def _crash_is_wrong(code: int | None) -> bool:
    # the math verifier's rule: an answer that kills its worker (a C stack overflow in the parser) is wrong
    return False


class _Worker:
    __slots__ = ("proc", "fd", "buf", "ready", "job", "deadline", "started", "code")

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        assert proc.stdout is not None
        self.fd = proc.stdout.fileno()
        os.set_blocking(self.fd, False)
        self.buf = b""
        self.ready = False
        self.job: int | None = None
        self.deadline = 0.0
        self.started = time.monotonic()
        self.code: int | None = None  # exit code, once it exited

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass

    def close_input(self) -> None:
        """End the worker's input: it finishes its job and exits (`close` then waits for it)."""
        try:
            if self.proc.stdin is not None and not self.proc.stdin.closed:
                self.proc.stdin.close()
        except OSError:
            pass

    def close(self) -> None:
        self.close_input()
        try:
            self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass
        self.kill()


def _shutdown(workers: list[_Worker], owner_pid: int) -> None:
    # Never touch the processes of the parent after a fork.
    if os.getpid() != owner_pid:
        return
    for w in workers:  # all told first, so they exit side by side (each takes ~0.4 s to exit)
        w.close_input()
    for w in workers:
        w.close()
    workers.clear()


class WorkerPool:
    """Worker processes running `_worker.py` (or `script`); `run(jobs, timeout)` judges the jobs.

    Counters: `timeouts` (answers not judged in time), `crashes` (answers that killed their worker),
    `restarts`; `ready_seconds` holds each worker's time from spawn to ready (import + self-check);
    `errors` the messages of jobs a worker reported as unusable (not the answer's fault: a bad
    dataset configuration, an entry that does not match its problem); the caller raises them.
    `label` names the workers in errors ("math verifier", "reasoning-gym checker"), `package` what
    they import (None: nothing to install). `env` is added to each worker's environment;
    `crash_result(exit_code)` is the result of a job whose worker exited while judging it (default:
    False, a wrong answer); `quiet` sends the workers' stderr to /dev/null (else to the parent's).
    """

    def __init__(
        self,
        num_workers: int,
        *,
        max_memory_mb: int | None = 2048,
        startup_timeout: float = 120.0,
        script: str | None = None,
        label: str = "math verifier",
        package: str | None = "math-verify",
        env: Mapping[str, str] | None = None,
        crash_result: Callable[[int | None], Any] = _crash_is_wrong,
        quiet: bool = True,
    ):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.num_workers = num_workers
        self.max_memory_mb = max_memory_mb
        self.startup_timeout = startup_timeout
        self.script = script
        self.label, self.package = label, package
        self.env = dict(env or {})
        self.crash_result = crash_result
        self.quiet = quiet
        self.errors: list[str] = []
        self._workers: list[_Worker] = []
        self._pid = os.getpid()
        self._finalizer = weakref.finalize(self, _shutdown, self._workers, self._pid)
        self.restarts = 0
        self.timeouts = 0
        self.crashes = 0
        self.ready_seconds: list[float] = []

    def _spawn(self) -> _Worker:
        env = dict(os.environ)
        env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        env["TOKENCREDIT_VERIFIER_MAX_MB"] = str(self.max_memory_mb or 0)
        env.update(self.env)
        proc = subprocess.Popen(
            [sys.executable, self._script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if self.quiet else None,
            env=env,
            close_fds=True,
        )
        return _Worker(proc)

    @property
    def _script(self) -> str:
        return self.script or _WORKER_SCRIPT

    def _ensure(self) -> None:
        if os.getpid() != self._pid:
            # Forked child: the workers belong to the parent; start our own.
            self._workers = []
            self._pid = os.getpid()
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, _shutdown, self._workers, self._pid)
        self._workers[:] = [w for w in self._workers if w.proc.poll() is None]
        while len(self._workers) < self.num_workers:
            self._workers.append(self._spawn())

    def _replace(self, w: _Worker) -> None:
        w.kill()
        i = self._workers.index(w)
        self._workers[i] = self._spawn()
        self.restarts += 1

    def _poll(self, wait_s: float) -> list[tuple[_Worker, dict | None]]:
        """Wait up to `wait_s` for worker output. Marks workers ready; returns (worker, message)
        for each result and (worker, None) for a worker that exited (already replaced)."""
        # poll, not select: a big training process may hold file descriptors above FD_SETSIZE.
        poller = select.poll()
        for w in self._workers:
            poller.register(w.fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        readable = [fd for fd, _ in poller.poll(wait_s * 1000.0)]
        by_fd = {w.fd: w for w in self._workers}
        events: list[tuple[_Worker, dict | None]] = []
        for fd in readable:
            w = by_fd[fd]
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                self._on_exit(w)
                events.append((w, None))
                continue
            w.buf += chunk
            while b"\n" in w.buf:
                raw, w.buf = w.buf.split(b"\n", 1)
                msg = json.loads(raw)
                if msg.get("ready"):
                    self._on_ready(w, msg)
                else:
                    events.append((w, msg))
        return events

    def _on_ready(self, w: _Worker, msg: dict) -> None:
        if not msg.get("self_check", False) and msg.get("error"):
            self.close()
            raise WorkerStartError(f"{self.label} worker could not start: {msg['error']}", str(msg["error"]))
        if not msg.get("self_check", False):
            self.close()
            raise WorkerStartError(
                f"{self.label} worker failed its start-up self-check ({msg.get('failed', '?')} judged "
                "not equal): is the installed version supported?"
            )
        w.ready = True
        self.ready_seconds.append(time.monotonic() - w.started)

    def _check_startup(self) -> None:
        now = time.monotonic()
        if any(not w.ready and now >= w.started + self.startup_timeout for w in self._workers):
            self.close()
            raise WorkerStartError(
                f"{self.label} worker did not start within {self.startup_timeout:.0f} s "
                f"(run `{sys.executable} {self._script}` to see why)"
            )

    def start(self, wait: bool = False) -> None:
        """Start the workers now (otherwise they start on the first `run`); with `wait`, block
        until every worker has imported math-verify, passed its self-check and is ready."""
        self._ensure()
        while wait and not all(w.ready for w in self._workers):
            first = min(w.started for w in self._workers if not w.ready)
            self._poll(max(0.0, first + self.startup_timeout - time.monotonic()))
            self._check_startup()

    def _send(self, w: _Worker, j: int, job: Job, timeout: float) -> bool:
        """Hand job `j` to idle worker `w`; False when `w` turned out to be dead (it is replaced)."""
        if isinstance(job, dict):
            line = json.dumps({**job, "id": j}) + "\n"
        else:
            golds, pred = job
            line = json.dumps({"id": j, "gold": list(golds), "pred": pred}) + "\n"
        try:
            assert w.proc.stdin is not None
            w.proc.stdin.write(line.encode("utf-8"))
            w.proc.stdin.flush()
        except OSError:
            self._replace(w)
            return False
        w.job, w.deadline = j, time.monotonic() + timeout
        return True

    def run(self, jobs: Sequence[Job], timeout: float) -> list[Any]:
        """Judge each (acceptable golds, answer) pair: True / False, or None when it was not judged
        within `timeout` seconds of reaching a worker (the worker is replaced). An answer that
        crashes its worker is `crash_result(exit code)`: False (a wrong answer, e.g. a C stack overflow
        in the parser) unless the pool was given another. A worker that answers with a number (a
        score) gives that float, one that answers with a list or an object gives it as it is; one
        that reports an "error" adds it to `errors`."""
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self._ensure()
        results: list[Any] = [False] * len(jobs)
        queue = list(range(len(jobs)))[::-1]
        pending = len(jobs)
        while pending:
            for w in self._workers:
                if w.ready and w.job is None and queue:
                    j = queue.pop()
                    if not self._send(w, j, jobs[j], timeout):
                        queue.append(j)  # the worker died while idle: not this answer's fault, so retry it
            waits = [w.deadline for w in self._workers if w.job is not None]
            waits += [w.started + self.startup_timeout for w in self._workers if not w.ready]
            wait_s = max(0.0, min(waits) - time.monotonic()) if waits else 0.0
            for w, msg in self._poll(wait_s):
                if w.job is None:
                    continue
                if msg is None:
                    results[w.job] = self.crash_result(w.code)
                    pending -= 1
                elif msg.get("id") == w.job:
                    ok = msg.get("ok")
                    if isinstance(ok, list | dict):
                        results[w.job] = ok
                    else:
                        results[w.job] = (
                            float(ok)
                            if isinstance(ok, int | float) and not isinstance(ok, bool)
                            else bool(ok)
                        )
                    if msg.get("error"):
                        self.errors.append(str(msg["error"]))
                    w.job = None
                    pending -= 1
            now = time.monotonic()
            for w in list(self._workers):
                if w.job is not None and now >= w.deadline:
                    self.timeouts += 1
                    results[w.job] = None
                    w.job = None
                    pending -= 1
                    self._replace(w)
            self._check_startup()
        return results

    def _on_exit(self, w: _Worker) -> None:
        try:
            code = w.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        w.code = code
        if not w.ready:
            self.close()
            if self.package is None:
                raise WorkerStartError(f"{self.label} worker exited during start-up (exit code {code})")
            raise WorkerStartError(
                f"{self.label} worker exited during start-up (exit code {code}); is {self.package} "
                f"installed? run `{sys.executable} {self._script}` to see the error"
            )
        self.crashes += 1
        self._replace(w)

    def close(self) -> None:
        _shutdown(self._workers, self._pid)

"""Math answer verifier: math-verify in a pool of worker processes with a wall-clock limit per answer.

math-verify's own timeouts use ``signal.alarm`` (main thread only), so they are turned off
(``parsing_timeout=None``, ``timeout_seconds=None``) and the limit is enforced here: each
answer is sent to an idle worker process; a worker that has not answered when its deadline
passes is killed and replaced, and that answer scores 0. One slow answer therefore costs at most
``timeout`` seconds and blocks only its own worker.

Cheap paths, in order, before any process is involved: no extracted answer -> 0; the normalised
answer string equals a normalised gold -> 1; a verdict cache keyed on (golds, normalised answer)
(the G rollouts of a prompt often give the same answer). Model output is never evaluated as
code: it is only scanned by regexes here and parsed by math-verify's LaTeX / arithmetic
parsers in the worker.

Create one `MathVerifier` for a training run (the pool stays warm across steps) and `close()` it
at the end (it is also closed at interpreter exit). It is safe to call from any thread. The
workers are plain subprocesses talking JSON lines over pipes (POSIX), so nothing depends on the
multiprocessing start method or on the caller's ``__main__`` module.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from tokencredit.rewards.extract import canonical_number, clean_for_verifier, extract_answer, normalize_answer

Gold = str | int | float | Sequence[str | int | float]

_WORKER_SCRIPT = str(Path(__file__).with_name("_worker.py"))


def normalize_golds(gold: Gold, where: str = "gold") -> tuple[str, ...]:
    """A gold answer (a string, a number such as 142.0, or a list of acceptable answers) as a
    tuple of cleaned strings. Raises ValueError naming `where` when it is empty or of a bad type."""
    items = [gold] if isinstance(gold, str | int | float) else gold
    if isinstance(items, bytes) or not isinstance(items, Sequence):
        raise ValueError(f"{where}: expected a string or a list of strings, got {type(gold).__name__}")
    out: list[str] = []
    for g in items:
        if isinstance(g, bool) or not isinstance(g, str | int | float):
            raise ValueError(
                f"{where}: acceptable answers must be strings or numbers, got {type(g).__name__}"
            )
        s = clean_for_verifier(str(g))
        if s:
            out.append(s)
    if not out:
        raise ValueError(f"{where}: empty gold answer")
    return tuple(dict.fromkeys(out))


class _Worker:
    __slots__ = ("proc", "fd", "buf", "ready", "job", "deadline", "started")

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

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=1)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


def _shutdown(workers: list[_Worker], owner_pid: int) -> None:
    # Never touch the processes of the parent after a fork.
    if os.getpid() != owner_pid:
        return
    for w in workers:
        w.close()
    workers.clear()


class WorkerPool:
    """Worker processes running `_worker.py`; `run(jobs, timeout)` judges (golds, answer) pairs."""

    def __init__(self, num_workers: int, *, max_memory_mb: int | None = 2048, startup_timeout: float = 120.0):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.num_workers = num_workers
        self.max_memory_mb = max_memory_mb
        self.startup_timeout = startup_timeout
        self._workers: list[_Worker] = []
        self._pid = os.getpid()
        self._finalizer = weakref.finalize(self, _shutdown, self._workers, self._pid)
        self.restarts = 0
        self.timeouts = 0
        self.crashes = 0

    def _spawn(self) -> _Worker:
        env = dict(os.environ)
        env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        env["TOKENCREDIT_VERIFIER_MAX_MB"] = str(self.max_memory_mb or 0)
        proc = subprocess.Popen(
            [sys.executable, _WORKER_SCRIPT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
        return _Worker(proc)

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
                    w.ready = True
                else:
                    events.append((w, msg))
        return events

    def _check_startup(self) -> None:
        now = time.monotonic()
        if any(not w.ready and now >= w.started + self.startup_timeout for w in self._workers):
            self.close()
            raise RuntimeError(
                f"math verifier worker did not start within {self.startup_timeout:.0f} s "
                f"(run `{sys.executable} {_WORKER_SCRIPT}` to see why)"
            )

    def start(self, wait: bool = False) -> None:
        """Start the workers now (otherwise they start on the first `run`); with `wait`, block
        until every worker has imported math-verify and is ready."""
        self._ensure()
        while wait and not all(w.ready for w in self._workers):
            first = min(w.started for w in self._workers if not w.ready)
            self._poll(max(0.0, first + self.startup_timeout - time.monotonic()))
            self._check_startup()

    def run(self, jobs: Sequence[tuple[Sequence[str], str]], timeout: float) -> list[bool]:
        """Judge each (acceptable golds, answer) pair; an answer not judged within `timeout`
        seconds of reaching a worker, or one that crashes its worker, is False."""
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self._ensure()
        results = [False] * len(jobs)
        queue = list(range(len(jobs)))[::-1]
        pending = len(jobs)
        while pending:
            for w in self._workers:
                if w.ready and w.job is None and queue:
                    j = queue.pop()
                    golds, pred = jobs[j]
                    line = json.dumps({"id": j, "gold": list(golds), "pred": pred}) + "\n"
                    try:
                        assert w.proc.stdin is not None
                        w.proc.stdin.write(line.encode("utf-8"))
                        w.proc.stdin.flush()
                    except OSError:
                        # The worker died while idle: not this answer's fault, so retry it.
                        queue.append(j)
                        self._replace(w)
                        continue
                    w.job, w.deadline = j, time.monotonic() + timeout
            waits = [w.deadline for w in self._workers if w.job is not None]
            waits += [w.started + self.startup_timeout for w in self._workers if not w.ready]
            wait_s = max(0.0, min(waits) - time.monotonic()) if waits else 0.0
            for w, msg in self._poll(wait_s):
                if w.job is None:
                    continue
                if msg is None:
                    # The answer it was judging crashed it (e.g. a C stack overflow): wrong.
                    pending -= 1
                elif msg.get("id") == w.job:
                    results[w.job] = bool(msg.get("ok"))
                    w.job = None
                    pending -= 1
            now = time.monotonic()
            for w in list(self._workers):
                if w.job is not None and now >= w.deadline:
                    self.timeouts += 1
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
        if not w.ready:
            self.close()
            raise RuntimeError(
                f"math verifier worker exited during start-up (exit code {code}); is math-verify "
                f"installed? run `{sys.executable} {_WORKER_SCRIPT}` to see the error"
            )
        self.crashes += 1
        self._replace(w)

    def close(self) -> None:
        _shutdown(self._workers, self._pid)


class MathVerifier:
    """Scores math completions against gold answers with math-verify (1.0 correct, 0.0 otherwise).

    Args:
      timeout: wall-clock seconds allowed per answer (default; `score` can override it per call).
      num_workers: worker processes (default min(4, CPU count)).
      allow_last_number: when no boxed / <answer> / #### answer exists, use the last number.
      max_answer_chars: longer extracted answers score 0 without parsing (None: no limit; the
        limit grows to 4x the longest gold).
      cache_size: verdicts kept (LRU) keyed on (golds, normalised answer).
      max_memory_mb: address-space limit of each worker (None: no limit).
    """

    def __init__(
        self,
        timeout: float = 5.0,
        *,
        num_workers: int | None = None,
        allow_last_number: bool = False,
        max_answer_chars: int | None = 1000,
        cache_size: int = 100_000,
        max_memory_mb: int | None = 2048,
    ):
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.timeout = float(timeout)
        self.allow_last_number = allow_last_number
        self.max_answer_chars = max_answer_chars
        self.cache_size = cache_size
        n = num_workers if num_workers is not None else min(4, os.cpu_count() or 1)
        self._pool = WorkerPool(n, max_memory_mb=max_memory_mb)
        self._cache: OrderedDict[tuple[tuple[str, ...], str], bool] = OrderedDict()
        self._lock = threading.RLock()
        self.stats = {"answers": 0, "no_answer": 0, "fast_path": 0, "cache_hits": 0, "verified": 0}

    # -- public API -------------------------------------------------------------------------
    def extract(self, completion: str) -> str | None:
        """The answer this verifier would judge for `completion` (None when there is none)."""
        return extract_answer(completion, allow_last_number=self.allow_last_number)

    def score(
        self, completions: Sequence[str], golds: Sequence[Gold], *, timeout: float | None = None
    ) -> list[float]:
        """[N] rewards: 1.0 when the completion's final answer matches a gold answer, else 0.0."""
        if len(completions) != len(golds):
            raise ValueError(f"got {len(completions)} completions but {len(golds)} gold answers")
        answers = []
        for i, c in enumerate(completions):
            if not isinstance(c, str):
                raise ValueError(f"completion {i}: expected a str, got {type(c).__name__}")
            answers.append(self.extract(c))
        return [float(v) for v in self.judge(answers, golds, timeout=timeout)]

    def judge(
        self, answers: Sequence[str | None], golds: Sequence[Gold], *, timeout: float | None = None
    ) -> list[bool]:
        """[N] verdicts for already extracted answers (None = no answer = False)."""
        if len(answers) != len(golds):
            raise ValueError(f"got {len(answers)} answers but {len(golds)} gold answers")
        t = self.timeout if timeout is None else float(timeout)
        gold_keys = [normalize_golds(g, where=f"gold {i}") for i, g in enumerate(golds)]
        with self._lock:
            verdicts: list[bool | None] = [None] * len(answers)
            todo: dict[tuple[tuple[str, ...], str], tuple[tuple[str, ...], str, list[int]]] = {}
            for i, (a, gk) in enumerate(zip(answers, gold_keys)):
                self.stats["answers"] += 1
                if a is None or not a.strip():
                    self.stats["no_answer"] += 1
                    verdicts[i] = False
                    continue
                limit = self.max_answer_chars
                if limit is not None and len(a) > max(limit, 4 * max(len(g) for g in gk)):
                    verdicts[i] = False
                    continue
                na = normalize_answer(a)
                gold_norms = {normalize_answer(g) for g in gk}
                if na in gold_norms:
                    self.stats["fast_path"] += 1
                    verdicts[i] = True
                    continue
                if canonical_number(na) == na and all(canonical_number(g) == g for g in gold_norms):
                    # two different plain decimals can never be equal: no math-verify round trip
                    self.stats["fast_path"] += 1
                    verdicts[i] = False
                    continue
                key = (gk, na)
                hit = self._cache.get(key)
                if hit is not None:
                    self._cache.move_to_end(key)
                    self.stats["cache_hits"] += 1
                    verdicts[i] = hit
                    continue
                if key in todo:
                    todo[key][2].append(i)
                else:
                    todo[key] = (gk, clean_for_verifier(a), [i])
            if todo:
                entries = list(todo.items())
                results = self._pool.run([(gk, pred) for _, (gk, pred, _) in entries], t)
                self.stats["verified"] += len(entries)
                for (key, (_, _, idx)), ok in zip(entries, results):
                    self._cache[key] = ok
                    for i in idx:
                        verdicts[i] = ok
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return [bool(v) for v in verdicts]

    def equivalent(self, a: str, b: str, *, timeout: float | None = None) -> bool:
        """Whether answer `b` verifies against `a` taken as the gold (math-verify is asymmetric)."""
        return self.judge([b], [a], timeout=timeout)[0]

    def start(self, wait: bool = True) -> MathVerifier:
        """Start the worker processes now rather than on first use (with `wait`, until they are
        ready to judge); returns self."""
        with self._lock:
            self._pool.start(wait=wait)
        return self

    @property
    def pool(self) -> WorkerPool:
        return self._pool

    def close(self) -> None:
        """Stop the worker processes (a later call starts new ones)."""
        with self._lock:
            self._pool.close()

    def __enter__(self) -> MathVerifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(self, completions: Sequence[str], golds: Sequence[Gold]) -> list[float]:
        return self.score(completions, golds)


_DEFAULT: MathVerifier | None = None
_DEFAULT_LOCK = threading.Lock()


def default_verifier() -> MathVerifier:
    """The process-wide verifier behind `math_reward` (created on first use, closed at exit)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = MathVerifier()
        return _DEFAULT


def math_reward(completions: Sequence[str], golds: Sequence[Gold], timeout: float = 5.0) -> list[float]:
    """1.0 for each completion whose final answer matches its gold (a string or a list of
    acceptable strings), else 0.0; at most `timeout` seconds of verification per answer."""
    return default_verifier().score(completions, golds, timeout=timeout)

"""Math answer verifier: math-verify in a pool of worker processes with a wall-clock limit per answer.

math-verify's own timeouts use ``signal.alarm`` (main thread only), so they are turned off
(``parsing_timeout=None``, ``timeout_seconds=None``) and the limit is enforced by the worker pool
(`tokencredit.rewards.pool`): each answer is sent to an idle, warmed-up worker process; a worker
that has not answered when its deadline passes is killed and replaced. One slow answer therefore
costs at most ``timeout`` seconds (plus the retry, when on) and blocks only its own worker.

A timed-out answer scores 0, but it is never mixed silently with wrong ones: `verify` returns
which answers timed out, `stats["timeouts"]` counts them, and the trainer and `tokencredit eval`
report the count. With ``retry_timeouts`` an answer that timed out is judged once more with
`RETRY_FACTOR` x the limit before it counts as timed out. A timed-out answer is cached as timed
out: when it recurs it counts as a timeout again, without costing the limit again.

Cheap paths, in order, before any process is involved: no extracted answer -> 0; the normalised
answer string equals a normalised gold -> 1; a verdict cache keyed on (golds, normalised answer)
(the G rollouts of a prompt often give the same answer). Model output is never evaluated as
code: it is only scanned by regexes here and parsed by math-verify's LaTeX / arithmetic
parsers in the worker.

Create one `MathVerifier` for a training run (the pool stays warm across steps) and `close()` it
at the end (it is also closed at interpreter exit). It is safe to call from any thread.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokencredit.rewards.extract import canonical_number, clean_for_verifier, extract_answer, normalize_answer
from tokencredit.rewards.pool import WorkerPool

Gold = str | int | float | Sequence[str | int | float]
# The retry of a timed-out answer (retry_timeouts=True) gets this many times the per-answer limit.
RETRY_FACTOR = 4.0


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


@dataclass(frozen=True)
class Verification:
    """One call's verdicts: `scores` [N] (1.0 correct, 0.0 otherwise) and `timed_out` [N], True
    where the answer was not judged within the limit (after the retry, when on) and scored 0 for
    that reason rather than for being wrong."""

    scores: list[float]
    timed_out: list[bool]

    @property
    def timeouts(self) -> int:
        return sum(self.timed_out)


_Key = tuple[tuple[str, ...], str]


class PooledVerifier:
    """What the verifiers that judge in a `WorkerPool` share (`MathVerifier`, the reasoning-gym one): the
    per-answer time limit, one retry of timed-out answers with `RETRY_FACTOR` x the limit, and the pool's
    lifecycle (started on first use or by `start`, closed by `close` or the context manager)."""

    def __init__(self, timeout: float, retry_timeouts: bool, pool: WorkerPool):
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.timeout = float(timeout)
        self.retry_timeouts = bool(retry_timeouts)
        self._pool = pool
        self._lock = threading.RLock()
        self.stats: dict[str, int] = {"verified": 0, "timeouts": 0, "retried": 0}

    def _run(self, jobs: list[Any], timeout: float) -> list[Any]:
        """The pool's results; timed-out jobs (None) are judged once more with RETRY_FACTOR x `timeout`
        when `retry_timeouts` is on."""
        results = self._pool.run(jobs, timeout)
        self.stats["verified"] += len(jobs)
        again = [j for j, r in enumerate(results) if r is None]
        if self.retry_timeouts and again:
            self.stats["retried"] += len(again)
            for j, r in zip(again, self._pool.run([jobs[j] for j in again], RETRY_FACTOR * timeout)):
                results[j] = r
        return results

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self, wait: bool = True) -> PooledVerifier:
        """Start the worker processes now rather than on first use (with `wait`, until they are
        warm and ready to judge); returns self."""
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

    def __enter__(self) -> PooledVerifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(self, completions: Sequence[str], golds: Sequence[Any]) -> list[float]:
        return self.score(completions, golds)  # type: ignore[attr-defined]  # each verifier's own scoring


class MathVerifier(PooledVerifier):
    """Scores math completions against gold answers with math-verify (1.0 correct, 0.0 otherwise).

    Args:
      timeout: wall-clock seconds allowed per answer (default; `score` can override it per call).
      num_workers: worker processes (default min(4, CPU count)).
      allow_last_number: when no boxed / <answer> / #### / "the answer is" answer exists, use the last number.
      max_answer_chars: longer extracted answers score 0 without parsing (None: no limit; the
        limit grows to 4x the longest gold).
      cache_size: verdicts kept (LRU) keyed on (golds, normalised answer).
      max_memory_mb: address-space limit of each worker (None: no limit).
      retry_timeouts: judge a timed-out answer once more with `RETRY_FACTOR` x the limit.
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
        retry_timeouts: bool = False,
    ):
        n = num_workers if num_workers is not None else min(4, os.cpu_count() or 1)
        super().__init__(timeout, retry_timeouts, WorkerPool(n, max_memory_mb=max_memory_mb))
        self.allow_last_number = allow_last_number
        self.max_answer_chars = max_answer_chars
        self.cache_size = cache_size
        # verdict per (golds, normalised answer); None = timed out
        self._cache: OrderedDict[_Key, bool | None] = OrderedDict()
        self.stats = {"answers": 0, "no_answer": 0, "fast_path": 0, "cache_hits": 0, **self.stats}

    # -- public API -------------------------------------------------------------------------
    def extract(self, completion: str) -> str | None:
        """The answer this verifier would judge for `completion` (None when there is none)."""
        return extract_answer(completion, allow_last_number=self.allow_last_number)

    def verify(
        self, completions: Sequence[str], golds: Sequence[Gold], *, timeout: float | None = None
    ) -> Verification:
        """Scores of `completions` against `golds` and which of them timed out (see `Verification`)."""
        if len(completions) != len(golds):
            raise ValueError(f"got {len(completions)} completions but {len(golds)} gold answers")
        answers = []
        for i, c in enumerate(completions):
            if not isinstance(c, str):
                raise ValueError(f"completion {i}: expected a str, got {type(c).__name__}")
            answers.append(self.extract(c))
        verdicts = self._judge(answers, golds, timeout)
        return Verification([1.0 if v else 0.0 for v in verdicts], [v is None for v in verdicts])

    def score(
        self, completions: Sequence[str], golds: Sequence[Gold], *, timeout: float | None = None
    ) -> list[float]:
        """[N] rewards: 1.0 when the completion's final answer matches a gold answer, else 0.0."""
        return self.verify(completions, golds, timeout=timeout).scores

    def judge(
        self, answers: Sequence[str | None], golds: Sequence[Gold], *, timeout: float | None = None
    ) -> list[bool]:
        """[N] verdicts for already extracted answers (None = no answer = False; timed out = False)."""
        if len(answers) != len(golds):
            raise ValueError(f"got {len(answers)} answers but {len(golds)} gold answers")
        return [bool(v) for v in self._judge(answers, golds, timeout)]

    def equivalent(self, a: str, b: str, *, timeout: float | None = None) -> bool:
        """Whether answer `b` verifies against `a` taken as the gold (math-verify is asymmetric)."""
        return self.judge([b], [a], timeout=timeout)[0]

    # -- judging ------------------------------------------------------------------------------
    def _cheap(self, a: str | None, gk: tuple[str, ...]) -> bool | None:
        """The verdict when no worker is needed (no answer, too long, equal strings, two plain
        decimals), else None. Counts the answer in `stats`."""
        self.stats["answers"] += 1
        if a is None or not a.strip():
            self.stats["no_answer"] += 1
            return False
        limit = self.max_answer_chars
        if limit is not None and len(a) > max(limit, 4 * max(len(g) for g in gk)):
            return False
        na = normalize_answer(a)
        gold_norms = {normalize_answer(g) for g in gk}
        if na in gold_norms:
            self.stats["fast_path"] += 1
            return True
        if canonical_number(na) == na and all(canonical_number(g) == g for g in gold_norms):
            # two different plain decimals can never be equal: no math-verify round trip
            self.stats["fast_path"] += 1
            return False
        return None

    def _judge(
        self, answers: Sequence[str | None], golds: Sequence[Gold], timeout: float | None
    ) -> list[bool | None]:
        """[N] True / False, or None for an answer that timed out."""
        t = self.timeout if timeout is None else float(timeout)
        gold_keys = [normalize_golds(g, where=f"gold {i}") for i, g in enumerate(golds)]
        with self._lock:
            verdicts: list[bool | None] = [False] * len(answers)
            todo: dict[_Key, tuple[str, list[int]]] = {}
            for i, (a, gk) in enumerate(zip(answers, gold_keys)):
                cheap = self._cheap(a, gk)
                if cheap is not None:
                    verdicts[i] = cheap
                    continue
                assert a is not None
                key = (gk, normalize_answer(a))
                if key in self._cache:
                    self._cache.move_to_end(key)
                    self.stats["cache_hits"] += 1
                    verdicts[i] = self._cache[key]
                elif key in todo:
                    todo[key][1].append(i)
                else:
                    todo[key] = (clean_for_verifier(a), [i])
            if todo:
                results = self._run([(key[0], pred) for key, (pred, _) in todo.items()], t)
                for (key, (_, idx)), ok in zip(todo.items(), results):
                    self._cache[key] = ok
                    for i in idx:
                        verdicts[i] = ok
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
            self.stats["timeouts"] += sum(v is None for v in verdicts)
        return verdicts


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

"""reasoning-gym's own checkers as a reward: ``dataset.score_answer(answer=..., entry=...)`` in worker
processes with a wall-clock limit per answer, like the math verifier.

A reasoning-gym problem (`tokencredit.data.reasoning_gym`) carries as its gold answer a
`GymAnswer`: the entry's reference answer as a string (what logs, saved groups and math-verify
see) that also names the entry it came from (dataset, configuration, index, a hash of the
question). `ReasoningGymVerifier` extracts the answer from each completion with the same
`extract_answer` as the math verifier (docs/spec/evaluation.md#answer-extraction) and sends
(entry reference, answer) to a `_rg_worker.py` process (`tokencredit.rewards.pool.WorkerPool`),
which rebuilds the entry with ``reasoning_gym.create_dataset(name, **config)[index]`` and
answers with the dataset's ``score_answer``. The checker's score is a float in [0, 1]; some
datasets give partial credit (the default checker gives ``len(gold) / len(answer)`` when the
gold is a substring of the answer). The reward is 1.0 when the checker gives full marks and 0.0
otherwise (``partial_credit=False``, the default: "correct" and accuracy keep their meaning),
or the checker's score itself (``partial_credit=True``, reward spec
``reasoning-gym?partial_credit=true``).

Cheap paths before any process: no extracted answer scores 0 (every reasoning-gym checker gives
0 to a missing answer); a verdict cache keyed on (entry, answer). A timed-out answer scores 0 and
is reported in `Verification.timed_out`, as with the math verifier. Model output is never
evaluated here; what a checker does with it is reasoning-gym's code, in the worker.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokencredit.errors import ConfigError
from tokencredit.rewards.extract import extract_answer
from tokencredit.rewards.pool import WorkerPool
from tokencredit.rewards.verifier import PooledVerifier, Verification

__all__ = ["EXTRA", "GymAnswer", "ReasoningGymVerifier", "is_gym_gold", "question_sha256"]

_WORKER_SCRIPT = str(Path(__file__).with_name("_rg_worker.py"))
# The optional dependency that brings reasoning-gym: pip install 'tokencredit[reasoning-gym]'.
EXTRA = "reasoning-gym"


def question_sha256(question: str) -> str:
    """The hash of a question that the worker checks the rebuilt entry against."""
    return hashlib.sha256(question.encode("utf-8")).hexdigest()


class GymAnswer(str):
    """A reasoning-gym entry's reference answer (the string itself) that names its entry: `dataset`
    (its registered name), `config` (every argument of ``create_dataset`` but the name, seed and
    size included), `index` (of the entry in that dataset) and `question_sha256`."""

    dataset: str
    config: dict[str, Any]
    index: int
    question_sha256: str

    def __new__(cls, answer: str, *, dataset: str, config: dict[str, Any], index: int, question_sha256: str):
        obj = super().__new__(cls, answer)
        obj.dataset, obj.config, obj.index, obj.question_sha256 = (
            dataset,
            dict(config),
            int(index),
            question_sha256,
        )
        return obj

    def __reduce__(self):
        return (_rebuild, (str(self), self.ref))

    @property
    def ref(self) -> dict[str, Any]:
        """The entry reference as plain JSON data (the worker's job, a saved group's field)."""
        return {
            "dataset": self.dataset,
            "config": self.config,
            "index": self.index,
            "question_sha256": self.question_sha256,
        }

    @property
    def key(self) -> str:
        return json.dumps(self.ref, sort_keys=True, default=str)


def _rebuild(answer: str, ref: dict[str, Any]) -> GymAnswer:
    return GymAnswer(answer, **ref)


def is_gym_gold(gold: Any) -> bool:
    return isinstance(gold, GymAnswer)


class ReasoningGymVerifier(PooledVerifier):
    """Scores completions of reasoning-gym problems with each dataset's own checker.

    The API of `MathVerifier` (`extract`, `verify`, `score`, `start`, `close`, `stats`), so the
    trainer and ``evaluate`` use it the same way. Golds must be `GymAnswer`s (the answers of
    problems from `tokencredit.data.reasoning_gym`); anything else is a ValueError naming it.

    Args:
      timeout: wall-clock seconds per answer.
      num_workers: worker processes (default min(2, CPU count): the checkers are quick).
      allow_last_number: when no boxed / <answer> / #### / "the answer is" answer exists, use the last number.
      partial_credit: the reward is the checker's score in [0, 1] (else 1.0 for full marks, 0.0 otherwise).
      cache_size: verdicts kept (LRU) keyed on (entry, answer).
      max_memory_mb: address-space limit of each worker (None: no limit).
      retry_timeouts: judge a timed-out answer once more with `RETRY_FACTOR` x the limit.
    """

    def __init__(
        self,
        timeout: float = 5.0,
        *,
        num_workers: int | None = None,
        allow_last_number: bool = False,
        partial_credit: bool = False,
        cache_size: int = 100_000,
        max_memory_mb: int | None = 4096,
        retry_timeouts: bool = False,
    ):
        n = num_workers if num_workers is not None else min(2, os.cpu_count() or 1)
        pool = WorkerPool(
            n,
            max_memory_mb=max_memory_mb,
            script=_WORKER_SCRIPT,
            label="reasoning-gym checker",
            package="reasoning-gym",
        )
        super().__init__(timeout, retry_timeouts, pool)
        self.allow_last_number = bool(allow_last_number)
        self.partial_credit = bool(partial_credit)
        self.cache_size = cache_size
        self._installed = False
        self._cache: OrderedDict[tuple[str, str], float | None] = OrderedDict()
        self.stats = {"answers": 0, "no_answer": 0, "cache_hits": 0, **self.stats}

    def extract(self, completion: str) -> str | None:
        """The answer this verifier sends to the checker for `completion` (None when there is none)."""
        return extract_answer(completion, allow_last_number=self.allow_last_number)

    def verify(
        self, completions: Sequence[str], golds: Sequence[Any], *, timeout: float | None = None
    ) -> Verification:
        """Rewards of `completions` against their problems' `GymAnswer`s and which of them timed out."""
        if len(completions) != len(golds):
            raise ValueError(f"got {len(completions)} completions but {len(golds)} gold answers")
        if golds and not self._installed:
            check_installed()
            self._installed = True
        for i, g in enumerate(golds):
            if not is_gym_gold(g):
                raise ValueError(
                    f"gold {i} ({str(g)[:40]!r}) is not a reasoning-gym problem's answer: reward 'reasoning-gym' "
                    "scores problems from data 'reasoning-gym:NAME' (use reward.function = 'auto' for mixed data)"
                )
        answers = []
        for i, c in enumerate(completions):
            if not isinstance(c, str):
                raise ValueError(f"completion {i}: expected a str, got {type(c).__name__}")
            answers.append(self.extract(c))
        scores = self._judge(answers, golds, self.timeout if timeout is None else float(timeout))
        rewards = [0.0 if s is None else (s if self.partial_credit else float(s >= 1.0)) for s in scores]
        return Verification(rewards, [s is None for s in scores])

    def score(
        self, completions: Sequence[str], golds: Sequence[Any], *, timeout: float | None = None
    ) -> list[float]:
        return self.verify(completions, golds, timeout=timeout).scores

    def checker_scores(self, answers: Sequence[str | None], golds: Sequence[GymAnswer]) -> list[float | None]:
        """The checker's raw scores of already extracted answers (None: timed out)."""
        return self._judge(answers, golds, self.timeout)

    def _judge(
        self, answers: Sequence[str | None], golds: Sequence[GymAnswer], timeout: float
    ) -> list[float | None]:
        with self._lock:
            out: list[float | None] = [0.0] * len(answers)
            todo: dict[tuple[str, str], tuple[dict[str, Any], list[int]]] = {}
            for i, (a, g) in enumerate(zip(answers, golds)):
                self.stats["answers"] += 1
                if a is None:
                    self.stats["no_answer"] += 1
                    continue
                key = (g.key, a)
                if key in self._cache:
                    self._cache.move_to_end(key)
                    self.stats["cache_hits"] += 1
                    out[i] = self._cache[key]
                elif key in todo:
                    todo[key][1].append(i)
                else:
                    todo[key] = ({**g.ref, "answer": a}, [i])
            if todo:
                results = self._run([job for job, _ in todo.values()], timeout)
                for (key, (_, idx)), r in zip(todo.items(), results):
                    self._cache[key] = r
                    for i in idx:
                        out[i] = r
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
            self.stats["timeouts"] += sum(s is None for s in out)
        return out

    def _run(self, jobs: list[dict[str, Any]], timeout: float) -> list[float | None]:
        """The checkers' scores (None: timed out, after the retry); a checker that failed to rebuild its
        entry is an error, not a 0."""
        results = super()._run(jobs, timeout)
        if self._pool.errors:
            errors, self._pool.errors[:] = list(self._pool.errors), []
            raise RuntimeError(
                f"reasoning-gym checker: {errors[0]}"
                + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")
            )
        return [None if r is None else float(r) for r in results]

    def start(self, wait: bool = True) -> ReasoningGymVerifier:
        """Start the worker processes now (with `wait`, until they are warm); returns self."""
        check_installed()
        super().start(wait)
        return self


def check_installed() -> None:
    """ConfigError naming the extra when reasoning-gym is not installed (checked without importing it)."""
    import importlib.util

    if importlib.util.find_spec("reasoning_gym") is None:
        raise ConfigError(
            f"reasoning-gym data and rewards need the reasoning-gym package: pip install 'tokencredit[{EXTRA}]'"
        )

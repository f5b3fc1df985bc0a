"""`evaluate`: generate answers to held-out problems, verify them, score them (also the trainer's periodic eval)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tokencredit import rollout
from tokencredit.data.templates import render_all
from tokencredit.evaluation.metrics import (
    avg_at_k,
    greedy_accuracy,
    mean_maj_at_k,
    mean_pass_at_k,
    mean_response_length,
    powers_of_two,
)
from tokencredit.evaluation.settings import EvalSettings
from tokencredit.rewards.verifier import MathVerifier
from tokencredit.rollout import SamplingSettings

__all__ = ["EvalSettings", "evaluate"]


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not enabled,
        transient=False,
    )


def _judged(v: Any, texts: list[str], golds: list[Any]) -> tuple[np.ndarray, int]:
    """([N] bool verdicts, timed-out verifications) from a `MathVerifier` (or any verifier with
    `score` and no `verify`, which reports no timeouts)."""
    if hasattr(v, "verify"):
        res = v.verify(texts, golds)
        return np.asarray(res.scores, dtype=np.float64) > 0.5, res.timeouts
    return np.asarray(v.score(texts, golds), dtype=np.float64) > 0.5, 0


def _chunk_seed(seed: int | None, start: int) -> int | None:
    return None if seed is None else int(seed) * 1_000_003 + start


@dataclass
class _Answers:
    """Decoded answers in problem-major order, with their lengths (tokens) and truncation flags."""

    texts: list[str] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)

    def repeated(self, n: int) -> _Answers:
        """Each answer n times in a row (the 'samples' of a temperature-0 evaluation)."""
        return _Answers(
            *([x for x in xs for _ in range(n)] for xs in (self.texts, self.lengths, self.truncated))
        )


def _answers(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    n_per: int,
    sampling: SamplingSettings,
    *,
    seed: int | None,
    advance: Callable[[int], None],
) -> _Answers:
    """`n_per` answers per prompt, the prompts of about `sampling.batch_size` sequences per generate call
    (each chunk seeded from `seed`; at least one prompt per call, all at once when batch_size is None)."""
    out = _Answers()
    per_chunk = len(prompts) if sampling.batch_size is None else max(1, sampling.batch_size // n_per)
    whole_chunk = replace(sampling, batch_size=None)  # a chunk's rows go in one generate call
    for start in range(0, len(prompts), per_chunk):
        r = rollout.generate(
            model,
            tokenizer,
            prompts[start : start + per_chunk],
            n_per,
            sampling=whole_chunk,
            seed=_chunk_seed(seed, start) if sampling.temperature > 0 else None,
        )
        out.texts += r.texts
        out.lengths += r.response_lengths.tolist()
        out.truncated += r.truncated.tolist()
        advance(r.num_rollouts)
    return out


def _sample_scores(v: Any, answers: _Answers, correct: np.ndarray, samples: int) -> dict[str, float]:
    """avg@samples, pass@k, maj@k (k = 1, 2, 4, ... <= samples), mean length and truncation rate of
    `samples` answers per problem (`correct` [P, samples])."""
    extracted = [v.extract(t) for t in answers.texts]
    per_problem = [extracted[i * samples : (i + 1) * samples] for i in range(correct.shape[0])]
    out = {f"avg@{samples}": avg_at_k(correct)}
    out.update({f"pass@{k}": mean_pass_at_k(correct, k) for k in powers_of_two(samples)})
    out.update({f"maj@{k}": mean_maj_at_k(per_problem, correct.tolist(), k) for k in powers_of_two(samples)})
    return {**out, **_length_scores(answers)}


def _length_scores(answers: _Answers) -> dict[str, float]:
    return {
        "mean_response_length": mean_response_length(answers.lengths),
        "truncated_rate": float(np.mean(answers.truncated)),
    }


def evaluate(
    model: Any,
    tokenizer: Any,
    problems: Sequence[Any],
    settings: EvalSettings | None = None,
    *,
    verifier: Any = None,
    progress: bool = True,
    description: str = "eval",
) -> dict[str, float]:
    """Generate, verify and score `problems` (objects with .problem and .answer) as `settings` say
    (default: `EvalSettings()`, the defaults of ``tokencredit eval``).

    Runs `settings.samples` samples per problem with `settings.sampling` (pass@k, maj@k, avg@samples;
    k = 1, 2, 4, ... <= samples) and, with `settings.greedy`, one temperature-0 answer (greedy_acc). At
    temperature 0 the samples are the greedy answer repeated. `verifier` is a `MathVerifier` or any
    object with ``score(completions, golds) -> list[float]`` and ``extract(text) -> str | None`` (a
    temporary `MathVerifier` is created and closed when None). `description` labels the progress bar;
    pass ``progress=False`` inside another rich live display. Returns a flat
    dict of floats: num_problems, greedy_acc, avg@n, pass@k, maj@k, mean_response_length,
    truncated_rate, verify_timeouts (a count: answers scored wrong because they timed out).

    Over 60 lines because the greedy and the sampled pass share one progress bar, one verifier's
    lifetime and the greedy answers (reused as the samples at temperature 0); split, each part would
    need all three passed in.
    """
    if not problems:
        raise ValueError("no problems to evaluate")
    settings = EvalSettings() if settings is None else settings
    samples, sampling, greedy = settings.samples, settings.sampling, settings.greedy
    prompts = render_all(settings.template, [p.problem for p in problems], tokenizer)
    golds = [p.answer for p in problems]
    P = len(problems)
    sampled_run = samples > 0 and not sampling.greedy
    greedy_run = greedy or (samples > 0 and sampling.greedy)
    total = (P * samples if sampled_run else 0) + (P if greedy_run else 0)
    own_verifier = verifier is None
    v = MathVerifier() if own_verifier else verifier
    out: dict[str, float] = {"num_problems": float(P)}
    timeouts = 0
    try:
        with _progress(progress) as prog:
            task = prog.add_task(description, total=total)

            def advance(label: str) -> Callable[[int], None]:
                return lambda n: prog.update(task, advance=n, description=f"{description} {label}")

            if greedy_run:
                greedy_sampling = replace(sampling, temperature=0.0)
                g = _answers(
                    model,
                    tokenizer,
                    prompts,
                    1,
                    greedy_sampling,
                    seed=settings.seed,
                    advance=advance("greedy"),
                )
                g_correct, timeouts = _judged(v, g.texts, golds)
                if greedy:
                    out["greedy_acc"] = greedy_accuracy(g_correct)
            if sampled_run:
                s = _answers(
                    model,
                    tokenizer,
                    prompts,
                    samples,
                    sampling,
                    seed=settings.seed,
                    advance=advance("samples"),
                )
                s_flat, n_to = _judged(v, s.texts, [g for g in golds for _ in range(samples)])
                timeouts += n_to
                out.update(_sample_scores(v, s, s_flat.reshape(P, samples), samples))
            elif samples > 0:
                out.update(
                    _sample_scores(v, g.repeated(samples), np.repeat(g_correct[:, None], samples, 1), samples)
                )
            else:
                out.update(_length_scores(g))
        out["verify_timeouts"] = float(timeouts)
    finally:
        if own_verifier:
            v.close()
    return out

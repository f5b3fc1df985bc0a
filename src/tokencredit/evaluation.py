"""Math evaluation: metrics (pure functions), `evaluate` (shared with the trainer's periodic eval)
and `evaluate_benchmarks` (benchmarks x seeds, used by ``tokencredit eval``).

Metrics, per problem then averaged over problems:
  avg@n     mean accuracy over the n samples (a pass@1 estimate).
  pass@k    unbiased estimator 1 - C(n - c, k) / C(n, k) from n >= k samples with c correct
            (Chen et al. 2021), in the stable product form 1 - prod_{i=n-c+1}^{n} (1 - k / i).
  maj@k     majority vote over the extracted answers of the first k samples. Votes are grouped
            so that every answer the verifier accepts is one group (they all equal the gold, hence
            each other) and the other answers group by normalised string; samples without an
            extracted answer do not vote. Ties: the score is the expected accuracy of picking one
            of the tied groups uniformly at random (1 / #tied if the correct group is among them),
            so the metric does not depend on sample order. No votes at all scores 0.
  greedy    accuracy of the temperature-0 answer.
Lengths are response tokens (the EOS included); `truncated_rate` is the share of samples that hit
the token limit. `verify_timeouts` counts the answers the verifier could not judge within its
limit (they count as wrong in every metric, and are reported so that this is never silent).
Evaluation numbers move with the template, temperature, top-p and token limit, so the command
reports them with every table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tokencredit import rollout
from tokencredit.data import benchmarks, load_problems
from tokencredit.data.templates import check_template, render_all
from tokencredit.rewards.extract import normalize_answer
from tokencredit.rewards.verifier import MathVerifier

# ---------------------------------------------------------------------------------------------
# metrics (pure)
# ---------------------------------------------------------------------------------------------


def pass_at_k(n: int | np.ndarray, c: int | np.ndarray, k: int) -> float | np.ndarray:
    """Unbiased pass@k for n samples with c correct: 1 - C(n-c, k) / C(n, k) (product form).

    n and c may be arrays (one entry per problem); requires 1 <= k <= n and 0 <= c <= n.
    """
    n_arr = np.asarray(n, dtype=np.int64)
    c_arr = np.asarray(c, dtype=np.int64)
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got {k}")
    if (n_arr < k).any():
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got n={int(n_arr.min())}")
    if (c_arr < 0).any() or (c_arr > n_arr).any():
        raise ValueError("pass@k needs 0 <= c <= n")
    n_b, c_b = np.broadcast_arrays(n_arr, c_arr)
    shape = n_b.shape
    n_f, c_f = n_b.reshape(-1), c_b.reshape(-1)
    # log prod_{i=n-c+1}^{n} (1 - k/i) as a masked sum over i = 1..max(n); every selected i > k
    # when n - c >= k, so each log1p term is finite. Rows with n - c < k are exactly 1.
    has_fail = (n_f - c_f) >= k
    i = np.arange(1, int(n_f.max(initial=k)) + 1, dtype=np.float64)[None, :]
    sel = (i > (n_f - c_f)[:, None]) & (i <= n_f[:, None]) & has_fail[:, None]
    terms = np.where(sel, np.log1p(-k / np.where(sel, i, np.inf)), 0.0)
    out = np.where(has_fail, -np.expm1(terms.sum(axis=1)), 1.0).reshape(shape) + 0.0
    return float(out) if out.ndim == 0 else out


def mean_pass_at_k(correct: np.ndarray | Sequence[Sequence[bool]], k: int) -> float:
    """Mean over problems of pass@k; correct: [P, n] bool (n samples per problem)."""
    arr = np.asarray(correct, dtype=bool)
    if arr.ndim != 2:
        raise ValueError(f"correct must be [problems, samples], got shape {arr.shape}")
    n = np.full(arr.shape[0], arr.shape[1])
    return float(np.mean(pass_at_k(n, arr.sum(axis=1), k)))


def avg_at_k(correct: np.ndarray | Sequence[Sequence[bool]]) -> float:
    """Mean accuracy over all samples of all problems; correct: [P, n] bool."""
    arr = np.asarray(correct, dtype=np.float64)
    if arr.ndim != 2 or arr.size == 0:
        raise ValueError(f"correct must be a non-empty [problems, samples] array, got shape {arr.shape}")
    return float(arr.mean())


def greedy_accuracy(correct: Sequence[bool] | np.ndarray) -> float:
    """Share of problems whose greedy answer is correct; correct: [P] bool."""
    arr = np.asarray(correct, dtype=np.float64).reshape(-1)
    if arr.size == 0:
        raise ValueError("greedy accuracy of zero problems")
    return float(arr.mean())


def majority_vote(answers: Sequence[str | None], correct: Sequence[bool], k: int) -> float:
    """maj@k for one problem from its sample answers (extracted, None = no answer) and verdicts.

    Uses the first k samples; ties score the expected accuracy of a uniform pick among the tied
    groups (see the module docstring for the grouping).
    """

    if len(answers) != len(correct):
        raise ValueError(f"got {len(answers)} answers but {len(correct)} verdicts")
    if not 1 <= k <= len(answers):
        raise ValueError(f"maj@{k} needs 1 <= k <= {len(answers)} samples")
    votes: Counter = Counter()
    for a, ok in zip(answers[:k], correct[:k]):
        if ok:
            votes[(True, "")] += 1
        elif a is not None and a.strip():
            votes[(False, normalize_answer(a))] += 1
    if not votes:
        return 0.0
    top = max(votes.values())
    tied = [key for key, v in votes.items() if v == top]
    return (1.0 if (True, "") in tied else 0.0) / len(tied)


def mean_maj_at_k(
    answers: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]], k: int
) -> float:
    """Mean over problems of `majority_vote`."""
    if len(answers) == 0:
        raise ValueError("maj@k of zero problems")
    return float(np.mean([majority_vote(a, c, k) for a, c in zip(answers, correct)]))


def mean_response_length(lengths: Sequence[int] | np.ndarray) -> float:
    """Mean number of response tokens."""
    arr = np.asarray(lengths, dtype=np.float64).reshape(-1)
    if arr.size == 0:
        raise ValueError("mean response length of zero responses")
    return float(arr.mean())


def powers_of_two(k_max: int) -> list[int]:
    """[1, 2, 4, ...] up to k_max (k_max itself appended when it is not a power of two)."""
    if k_max < 1:
        return []
    ks = [1 << i for i in range(k_max.bit_length()) if (1 << i) <= k_max]
    if ks[-1] != k_max:
        ks.append(k_max)
    return ks


# ---------------------------------------------------------------------------------------------
# evaluate
# ---------------------------------------------------------------------------------------------


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


def evaluate(
    model: Any,
    tokenizer: Any,
    problems: Sequence[Any],
    *,
    samples: int = 4,
    temperature: float = 0.6,
    top_p: float = 0.95,
    max_new_tokens: int = 1024,
    template: str = "qwen-math",
    seed: int | None = 0,
    verifier: Any = None,
    progress: bool = True,
    greedy: bool = True,
    batch_size: int = 64,
    top_k: int = 0,
    description: str = "eval",
) -> dict[str, float]:
    """Generate, verify and score `problems` (objects with .problem and .answer).

    Runs `samples` samples per problem at `temperature` (pass@k, maj@k, avg@samples; k = 1, 2,
    4, ... <= samples) and, with `greedy`, one temperature-0 answer (greedy_acc). At temperature 0
    the samples are the greedy answer repeated. `verifier` is a `MathVerifier` or any object with
    ``score(completions, golds) -> list[float]`` and ``extract(text) -> str | None`` (a temporary
    `MathVerifier` is created and closed when None). `batch_size` caps sequences per generate
    call. Pass ``progress=False`` inside another rich live display. Returns a flat
    dict of floats: num_problems, greedy_acc, avg@n, pass@k, maj@k, mean_response_length,
    truncated_rate, verify_timeouts (a count: answers scored wrong because they timed out).
    """
    if not problems:
        raise ValueError("no problems to evaluate")
    if samples < 0:
        raise ValueError(f"samples must be >= 0, got {samples}")
    if samples == 0 and not greedy:
        raise ValueError("nothing to evaluate: samples=0 and greedy=False")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    check_template(template)
    prompts = render_all(template, [p.problem for p in problems], tokenizer)
    golds = [p.answer for p in problems]
    P = len(problems)
    sampled_run = samples > 0 and temperature > 0
    greedy_run = greedy or (samples > 0 and temperature == 0)
    total = (P * samples if sampled_run else 0) + (P if greedy_run else 0)

    def run(n_per: int, temp: float, label: str, prog, task) -> tuple[list[str], list[int], list[bool]]:
        texts: list[str] = []
        lengths: list[int] = []
        trunc: list[bool] = []
        per_chunk = max(1, batch_size // n_per)
        for start in range(0, P, per_chunk):
            r = rollout.generate(
                model,
                tokenizer,
                prompts[start : start + per_chunk],
                n_per,
                temperature=temp,
                top_p=top_p,
                top_k=top_k,
                max_new_tokens=max_new_tokens,
                seed=_chunk_seed(seed, start) if temp > 0 else None,
            )
            texts += r.texts
            lengths += r.response_lengths.tolist()
            trunc += r.truncated.tolist()
            prog.update(task, advance=r.num_rollouts, description=f"{description} {label}")
        return texts, lengths, trunc

    own_verifier = verifier is None
    v = MathVerifier() if own_verifier else verifier
    out: dict[str, float] = {"num_problems": float(P)}
    timeouts = 0
    try:
        with _progress(progress) as prog:
            task = prog.add_task(description, total=total)
            if greedy_run:
                g_texts, g_len, g_trunc = run(1, 0.0, "greedy", prog, task)
                g_correct, n_to = _judged(v, g_texts, golds)
                timeouts += n_to
                if greedy:
                    out["greedy_acc"] = greedy_accuracy(g_correct)
            if samples > 0:
                if sampled_run:
                    s_texts, s_len, s_trunc = run(samples, temperature, "samples", prog, task)
                    s_golds = [g for g in golds for _ in range(samples)]
                    s_flat, n_to = _judged(v, s_texts, s_golds)
                    s_correct = s_flat.reshape(P, samples)
                    timeouts += n_to
                else:
                    s_texts = [t for t in g_texts for _ in range(samples)]
                    s_len = [n for n in g_len for _ in range(samples)]
                    s_trunc = [t for t in g_trunc for _ in range(samples)]
                    s_correct = np.repeat(g_correct[:, None], samples, axis=1)
                answers = [v.extract(t) for t in s_texts]
                ans_pp = [answers[i * samples : (i + 1) * samples] for i in range(P)]
                out[f"avg@{samples}"] = avg_at_k(s_correct)
                for k in powers_of_two(samples):
                    out[f"pass@{k}"] = mean_pass_at_k(s_correct, k)
                for k in powers_of_two(samples):
                    out[f"maj@{k}"] = mean_maj_at_k(ans_pp, s_correct.tolist(), k)
                out["mean_response_length"] = mean_response_length(s_len)
                out["truncated_rate"] = float(np.mean(s_trunc))
            else:
                out["mean_response_length"] = mean_response_length(g_len)
                out["truncated_rate"] = float(np.mean(g_trunc))
        out["verify_timeouts"] = float(timeouts)
    finally:
        if own_verifier:
            v.close()
    return out


def load_benchmark(name: str, limit: int | None) -> list[Any]:
    """A shipped benchmark by name, or problems from a data file (.jsonl / .json / .parquet / datasets dir)."""
    p = Path(name)
    if name not in benchmarks.COUNTS and (p.suffix in (".jsonl", ".json", ".parquet") or p.is_dir()):
        return load_problems(p, limit=limit)
    return benchmarks.load(name, limit=limit)


def evaluate_benchmarks(
    model: Any,
    tokenizer: Any,
    data: dict[str, list[Any]],
    seeds: Sequence[int],
    *,
    verifier: Any,
    greedy: bool = True,
    progress: bool = True,
    **sampling: Any,
) -> dict[str, dict[str, Any]]:
    """{benchmark: {"metrics": mean over seeds, "per_seed": [...], "std": sample std (2+ seeds),
    "verify_timeouts": timed-out verifications summed over seeds}}.

    `sampling`: the keyword arguments of `evaluate` (samples, temperature, top_p, top_k,
    max_new_tokens, template, batch_size). The greedy answer does not depend on the seed: it is
    computed once, with the first seed.
    """
    results: dict[str, dict[str, Any]] = {}
    for b, problems in data.items():
        per_seed = []
        greedy_keys: dict[str, float] = {}
        for i, s in enumerate(seeds):
            m = evaluate(
                model, tokenizer, problems, seed=s, verifier=verifier, progress=progress,
                greedy=greedy and i == 0, description=f"{b} seed {s}", **sampling,
            )  # fmt: skip
            if i == 0:
                greedy_keys = {k: v for k, v in m.items() if k == "greedy_acc"}
            m.update(greedy_keys)
            per_seed.append(m)
        keys = [k for k in per_seed[0] if k != "verify_timeouts"]  # a count: summed below, not averaged
        entry: dict[str, Any] = {
            "metrics": {k: float(np.mean([m[k] for m in per_seed])) for k in keys},
            "per_seed": per_seed,
            "verify_timeouts": int(sum(m.get("verify_timeouts", 0) for m in per_seed)),
        }
        if len(seeds) > 1:
            entry["std"] = {
                k: float(np.std([m[k] for m in per_seed], ddof=1))
                for k in keys
                if k not in ("num_problems", "greedy_acc")
            }
        results[b] = entry
    return results


def _fmt(mean: float, std: float | None, pct: bool) -> str:
    if pct:
        s = f"{100 * mean:.1f}"
        return s if std is None else f"{s} ± {100 * std:.1f}"
    s = f"{mean:.1f}"
    return s if std is None else f"{s} ± {std:.1f}"


def markdown_table(results: dict[str, dict[str, Any]]) -> str:
    """A Markdown table: one row per benchmark, accuracies in percent (mean ± std over seeds)."""
    cols: list[str] = []
    for r in results.values():
        for key in r["metrics"]:
            if key not in cols and key != "num_problems":
                cols.append(key)
    order = {"greedy_acc": 0}
    for key in cols:
        order.setdefault(key, {"avg": 1, "pass": 2, "maj": 3}.get(key.split("@")[0], 4))

    def sort_key(c: str) -> tuple[int, int]:
        return order[c], int(c.split("@")[1]) if "@" in c else 0

    cols.sort(key=sort_key)
    header = ["benchmark", "n"] + [
        c.replace("greedy_acc", "greedy").replace("mean_response_length", "len") for c in cols
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, r in results.items():
        cells = [name, str(int(r["metrics"]["num_problems"]))]
        for c in cols:
            if c not in r["metrics"]:
                cells.append("")
                continue
            std = r.get("std", {}).get(c)
            cells.append(_fmt(r["metrics"][c], std, pct=c != "mean_response_length"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


__all__ = [
    "avg_at_k",
    "evaluate",
    "greedy_accuracy",
    "majority_vote",
    "markdown_table",
    "mean_maj_at_k",
    "mean_pass_at_k",
    "mean_response_length",
    "pass_at_k",
    "powers_of_two",
    "evaluate_benchmarks",
    "load_benchmark",
]

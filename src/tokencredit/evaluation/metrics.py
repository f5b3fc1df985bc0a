"""Evaluation metrics as pure functions of verdicts and answers (defined in `tokencredit.evaluation`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from tokencredit.rewards.extract import normalize_answer

__all__ = [
    "avg_at_k",
    "greedy_accuracy",
    "majority_vote",
    "mean_maj_at_k",
    "mean_pass_at_k",
    "mean_response_length",
    "pass_at_k",
    "powers_of_two",
]


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

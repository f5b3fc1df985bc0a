"""A synthetic, verifiable arithmetic task: the embedded default of `tokencredit train`.

A problem is a left-to-right chain of integer additions and subtractions, ``Compute 47 + 38 - 19 + 6.``,
and its reference solution is one step per line followed by a boxed answer, the same answer
path (``\\boxed{}``) the math verifier reads on real data::

    47 + 38 = 85
    85 - 19 = 66
    66 + 6 = 72
    The answer is \\boxed{72}.

Because every step is one ``<a> <op> <b> = <c>`` line, the checker can say not only whether a
completion is right (`check`) but where it first goes wrong (`locate_first_error`: the first
character that differs from the reference, e.g. the first digit of a wrong intermediate result)
and which characters are shared boilerplate, problem-dependent arithmetic, or the final answer
(`label_chars`). Credit-assignment probes use both.

Difficulty: ``difficulty`` is the number of steps (operands = difficulty + 1); the first operand
and every running total lie in ``[0, 10**digits - 1]`` and the later operands in
``[1, 10**operand_digits - 1]`` (default: two-digit totals, one-digit operands, so about half the
additions carry).

Bounds: ``difficulty`` 1..`MAX_DIFFICULTY`, ``digits`` 1..`MAX_DIGITS`; one ``sample`` builds at most
`MAX_SAMPLE` problems, and never more than the split holds (`ArithmeticTask.count_problems` counts the
problem space exactly, `ArithmeticTask.max_sample` the split): a larger request is a ValueError at once,
not a search that cannot end.

Train / held-out split: a problem belongs to the held-out split iff a SHA-256 hash of its
expression falls in a fixed ``heldout_fraction`` of the hash range. Membership depends only on
the expression (never on the seed), so the two splits are disjoint for every seed, and
``sample`` is deterministic in ``(difficulty, digits, seed, split)`` and prefix-stable
(``sample(n)`` is the first n items of ``sample(n + k)``).

Free choices (``phrasings=k``, the headroom knob of issue 32): each step line may open with one of
``k`` equivalent connectives and close with one of ``k`` equivalent endings (`CONNECTIVES`,
`ENDINGS`: ``Next 85 - 19 = 66;``), drawn uniformly by the teacher. Which word is chosen never changes
the reward, but a word's first character also decides something that does (that a step, not the answer
line, follows; that the number before an ending is complete), so its exact advantage is not zero: the
checker accepts any of the `CONNECTIVES` / `ENDINGS` on every task (they never change correctness), and
`label_chars` labels a word's first character "choice" and the rest, fixed by it, "free".

A reward-irrelevant tail (``tail=m``, the testbed whose exact credit is known without
sampling): after the answer line the teacher writes a line of m letters drawn uniformly from
`TAIL_ALPHABET` (``The answer is \\boxed{72}.\\nqkcvjgmp...``). The alphabet holds no digit, brace,
backslash, ``#``, ``<``, ``*`` or ``$`` and none of the letters of "answer", "boxed" or "fbox", so no
answer extraction can read a tail (`tokencredit.rewards.extract_answer`: a box, an ``<answer>`` tag, a
``####`` line, an answer statement or the last number) and none can reach across it: the reward is the
same for every tail, and for none. Its exact advantage is therefore A* = 0 on every tail token (as long
as the policy writes nothing a reward can read after it, which is what the warm start learns). The
checker accepts a tail on every task, and `label_chars` labels the line break and the letters "tail".

`ArithmeticTask.solution(..., forget_rate=q)` also writes a *noisy teacher's* solution that, in
each addition with a carry, forgets the carry with probability q (digit-wise mod-10 sum for that
step) and propagates the slip consistently to the answer (so a slip always gives a wrong answer); the supervised warm
start of the toy model (`tokencredit.models.warm_start`) imitates that teacher, which is what
leaves room for RL (see that module).
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from tokencredit.data.loaders import Problem

__all__ = [
    "CONNECTIVES",
    "ENDINGS",
    "LABELS",
    "MAX_DIFFICULTY",
    "MAX_DIGITS",
    "MAX_PHRASINGS",
    "MAX_SAMPLE",
    "MAX_TAIL",
    "TAIL_ALPHABET",
    "ArithmeticProblem",
    "ArithmeticTask",
    "ErrorLocation",
    "check",
    "extract_answer",
    "label_chars",
    "locate_first_error",
    "parse_problem",
    "reference_solution",
]


@dataclass(frozen=True)
class ArithmeticProblem(Problem):
    """A `Problem` plus its reference chain-of-thought ``solution`` (for supervised warm starts)."""

    solution: str = ""


Kind = Literal["correct", "wrong-step", "wrong-final", "malformed"]
LABELS: tuple[str, ...] = ("format", "computed", "answer", "choice", "free", "tail")

# Equivalent phrasings of a step line (distinct first characters, so the choice is one token of the
# character-level toy tokenizer); ``phrasings=k`` uses the first k of each.
CONNECTIVES: tuple[str, ...] = ("Then", "Next", "So", "Also", "Here", "We get", "Calc", "Finally")
ENDINGS: tuple[str, ...] = ("", ".", ";", ",", " ok", " done", " !", " (sure)")
MAX_PHRASINGS = len(CONNECTIVES)
# The letters of a reward-irrelevant tail (module docstring): none of them occurs in "answer", "boxed" or
# "fbox", so no answer statement or box can be spelled with them, not even across the tail's ends.
TAIL_ALPHABET = "cgjkmpqv"
MAX_TAIL = 256
"""Most tail letters: with a three-step solution (at most 62 characters) and the qwen-math prompt, 256
letters still fit the toy model's 512 positions."""

# Bounds of the task's settings and of one `ArithmeticTask.sample` call, checked before anything is drawn.
MAX_DIFFICULTY = 32
"""Most steps of a problem: its solution is one line of about 12 characters (tokens of the toy
tokenizer) per step, so 32 steps already need some 400 tokens of a model's context and rollout budget."""
MAX_DIGITS = 4
"""Most digits of the running totals (and of the operands)."""
MAX_SAMPLE = 100_000  # about 10 s to build on a busy 2-core machine (~100 us a problem)
"""Most problems one `sample` call builds: they are all built up front (about 30 s and 1 GB for a
million), and a training run draws from them with replacement across epochs, so more add nothing."""
EXACT_COUNT_LIMIT = 1_000_000
"""Problem spaces up to this size (over both splits) are enumerated to count a split exactly when a
sample asks for a large share of it (about 3 s at the limit); larger ones are estimated from the
hash fraction and a sample may take at most half of the estimate."""


@dataclass(frozen=True)
class ErrorLocation:
    """Where a completion first departs from the reference solution (character offsets).

    kind: "correct" (every step and the answer right), "wrong-step" (a well-formed step line with
      a wrong operand, operator or result), "wrong-final" (all steps right, wrong boxed answer) or
      "malformed" (a line that is not a well-formed step / answer line, missing lines, or extra text).
    step: 0-based line index of the first error (the answer line has index ``n_steps``); None when
      correct.
    start: offset of the first wrong character; for "correct", the first character of the boxed
      answer. A completion that stops early gets ``start == len(completion_text)``: the wrong
      "token" is the end of sequence itself.
    end: exclusive end of the wrong field (the whole wrong number when the first wrong character is
      a digit, otherwise ``start + 1``, capped at the text length); for "correct", the end of the
      boxed answer.
    expected: the reference line at ``step`` (None when correct).
    """

    kind: Kind
    step: int | None
    start: int
    end: int
    expected: str | None = None


_PROBLEM_RE = re.compile(r"^Compute (\d+(?: [+-] \d+)+)\.$")
_STEP_RE = re.compile(r"^(-?\d+) ([+-]) (-?\d+) = (-?\d+)$")
_ANSWER_PREFIX = "The answer is \\boxed{"
_ANSWER_RE = re.compile(r"^The answer is \\boxed\{(-?\d+)\}\.$")
_BOXED_INT_RE = re.compile(r"\\boxed\{\s*(-?\d+)\s*\}")
_AFFIXED_RE = re.compile(
    rf"^(?:({'|'.join(map(re.escape, CONNECTIVES))}) )?(.*?)({'|'.join(map(re.escape, ENDINGS[1:]))})?$"
)


def _problem_text(problem: Problem | str) -> str:
    return problem if isinstance(problem, str) else problem.problem


def parse_problem(problem: Problem | str) -> tuple[list[int], list[str]]:
    """Operands and operators of an arithmetic problem: ``"Compute 4 + 3 - 1."`` -> ([4, 3, 1], ["+", "-"]).

    Raises ValueError naming the problem when the text is not of this task's form.
    """
    text = _problem_text(problem)
    m = _PROBLEM_RE.match(text)
    if m is None:
        ident = problem if isinstance(problem, str) else f"{problem.id}: {problem.problem}"
        raise ValueError(f"not an arithmetic-task problem (expected 'Compute a + b - c.'): {ident!r}")
    parts = m.group(1).split(" ")
    return [int(p) for p in parts[0::2]], parts[1::2]


def _apply(a: int, op: str, b: int, forget: bool = False) -> int:
    """a op b; with ``forget`` an addition drops its carries (digit-wise mod-10 sum).

    Only additions of non-negative operands can forget (a negative running total is possible only
    after an earlier slip and is computed exactly). Forgetting only ever lowers a sum, so slips in
    several steps never cancel out: a teacher solution with a slip always has a wrong answer.
    """
    if op == "-":
        return a - b
    if not forget or a < 0 or b < 0:
        return a + b
    out, place = 0, 1
    while a or b:
        out += ((a % 10 + b % 10) % 10) * place
        a, b, place = a // 10, b // 10, place * 10
    return out


def _has_carry(a: int, op: str, b: int) -> bool:
    return _apply(a, op, b, forget=True) != _apply(a, op, b)


def _chain(
    terms: Sequence[int],
    ops: Sequence[str],
    forget: Sequence[bool] | None = None,
    affixes: Sequence[tuple[str, str]] | None = None,
    tail: str = "",
) -> list[str]:
    """Solution lines; ``affixes[i]`` = (connective, ending) of step i ("" = none); a non-empty ``tail``
    is a last line after the answer."""
    lines, acc = [], terms[0]
    for i, (op, b) in enumerate(zip(ops, terms[1:])):
        c = _apply(acc, op, b, forget=bool(forget[i]) if forget is not None else False)
        conn, end = affixes[i] if affixes is not None else ("", "")
        lines.append(f"{conn + ' ' if conn else ''}{acc} {op} {b} = {c}{end}")
        acc = c
    lines.append(f"{_ANSWER_PREFIX}{acc}}}.")
    return [*lines, tail] if tail else lines


def reference_solution(problem: Problem | str) -> str:
    """The correct step-by-step solution of a problem (no trailing newline)."""
    terms, ops = parse_problem(problem)
    return "\n".join(_chain(terms, ops))


def _gold(problem: Problem | str) -> int:
    if isinstance(problem, str):
        terms, ops = parse_problem(problem)
        acc = terms[0]
        for op, b in zip(ops, terms[1:]):
            acc = _apply(acc, op, b)
        return acc
    answer = problem.answer[0] if isinstance(problem.answer, list) and problem.answer else problem.answer
    try:
        return int(str(answer).strip())
    except ValueError as e:
        raise ValueError(f"problem {problem.id}: answer {problem.answer!r} is not an integer") from e


def extract_answer(completion_text: str) -> int | None:
    """The integer in the last ``\\boxed{...}`` of a completion, or None when there is none."""
    found = _BOXED_INT_RE.findall(completion_text)
    return int(found[-1]) if found else None


def check(problem: Problem | str, completion_text: str) -> bool:
    """Outcome check: does the last ``\\boxed{}`` hold the gold integer?

    ``problem`` is a record with ``answer`` or the problem text (the gold is then computed). This is
    the exact-integer version of what `tokencredit.rewards.math_reward` decides on this task; a
    boxed non-integer such as ``72.0`` is wrong here.
    """
    got = extract_answer(completion_text)
    return got is not None and got == _gold(problem)


def _lines_with_offsets(text: str) -> list[tuple[int, str]]:
    out, pos = [], 0
    for line in text.split("\n"):
        out.append((pos, line))
        pos += len(line) + 1
    return out


def _field_end(text: str, start: int) -> int:
    """End of the number starting at ``start`` (or ``start + 1`` for a non-digit), within ``text``."""
    if start >= len(text):
        return len(text)
    if not text[start].isdigit():
        return start + 1
    end = start
    while end < len(text) and text[end].isdigit():
        end += 1
    return end


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _tail_end(text: str, start: int) -> int:
    """End of the tail that starts at ``start`` (right after an answer line): a line break and the run of
    `TAIL_ALPHABET` letters after it; ``start`` itself when no letter follows the line break."""
    if not text.startswith("\n", start):
        return start
    end = start + 1
    while end < len(text) and text[end] in TAIL_ALPHABET:
        end += 1
    return end if end > start + 1 else start


def _split_affixes(line: str) -> tuple[int, str, int]:
    """(length of the free connective incl. its space, the rest, length of the free ending) of a line.

    A connective counts before a number, an ending only after a well-formed step."""
    m = _AFFIXED_RE.match(line)
    head = len(m.group(1)) + 1 if m is not None and m.group(1) else 0
    rest = line[head:]
    if not rest[:1].isdigit() and not rest.startswith("-"):
        return 0, line, 0
    if m is not None and _STEP_RE.match(m.group(2)):
        return head, m.group(2), len(m.group(3) or "")
    return head, rest, 0


def locate_first_error(problem: Problem | str, completion_text: str) -> ErrorLocation:
    """Process-level check: the first line and character where a completion departs from the
    reference solution, and what kind of error it is (see `ErrorLocation`).

    Lines are compared with the reference one by one; a tail after the answer line (`TAIL_ALPHABET`),
    trailing whitespace after it and the free connectives / endings of a step line (`CONNECTIVES`,
    `ENDINGS`) are ignored. This is stricter than `check`: a completion whose steps are wrong but whose boxed
    answer happens to be right is a "wrong-step" here (and True for `check`).
    """
    ref = _chain(*parse_problem(problem))
    gold = _gold(problem)
    n_steps = len(ref) - 1
    lines = _lines_with_offsets(completion_text)
    text_len = len(completion_text)
    for i, expected in enumerate(ref):
        if i >= len(lines):
            return ErrorLocation("malformed", i, text_len, text_len, expected)
        offset, line = lines[i]
        # Trailing whitespace after the answer is not an error.
        if (line.rstrip() if i == n_steps else line) == expected:
            continue
        if i < n_steps:  # a free connective / ending around a right step is not an error
            head, core, _ = _split_affixes(line)
            if core == expected:
                continue
            offset, line = offset + head, core
        start = offset + _common_prefix(line, expected)
        if start >= text_len:
            # The text stops inside (or right before) this line: it ended early.
            return ErrorLocation("malformed", i, text_len, text_len, expected)
        end = _field_end(completion_text, start)
        if i < n_steps:
            kind: Kind = "wrong-step" if _STEP_RE.match(line) else "malformed"
        else:
            m = _ANSWER_RE.match(line.rstrip())
            kind = "wrong-final" if m is not None and int(m.group(1)) != gold else "malformed"
        return ErrorLocation(kind, i, start, end, expected)
    # Every reference line matched: anything but a tail and whitespace after the answer is extra text.
    answer_offset = lines[n_steps][0]
    tail_start = _tail_end(completion_text, answer_offset + len(ref[-1]))
    tail = completion_text[tail_start:]
    if tail.strip():
        start = tail_start + (len(tail) - len(tail.lstrip()))
        return ErrorLocation("malformed", n_steps + 1, start, start + 1, None)
    a_start = answer_offset + len(_ANSWER_PREFIX)
    return ErrorLocation("correct", None, a_start, a_start + len(str(gold)), None)


def label_chars(problem: Problem | str, completion_text: str) -> list[str]:
    """Per-character labels of a completion, one of `LABELS`:

    - "answer": the characters inside the last ``\\boxed{...}``;
    - "computed": elsewhere, digits and the signs / operators ``+ - *`` (problem-dependent
      arithmetic: operands, operators, intermediate results);
    - "choice": the first character of a step line's connective or ending (`CONNECTIVES`, `ENDINGS`): it
      picks the phrasing, and also decides what the reward does depend on: that another step follows
      (a connective's "T" is also the answer line's) or that the number before it is complete (an ending's
      first character instead of another digit), so its exact advantage is not zero;
    - "free": the rest of a connective (with its space) or ending: characters fixed by that choice,
      which nothing depends on;
    - "tail": after a complete answer line (``The answer is \\boxed{N}.``), its line break and the run of
      `TAIL_ALPHABET` letters that follows (when there is one): characters no reward can read;
    - "format": everything else (spaces, ``=``, newlines, "The answer is \\boxed{", "}.") -- the
      boilerplate shared by every solution.

    Labels depend only on the characters, so malformed text is labelled too; ``problem`` is checked
    to be of this task (a uniform checker interface with `check` / `locate_first_error`).
    """
    parse_problem(problem)
    labels = ["computed" if (c.isdigit() or c in "+-*") else "format" for c in completion_text]
    for offset, line in _lines_with_offsets(completion_text):
        head, _, ending = _split_affixes(line)
        end = offset + len(line)
        # A free word's first character also decides something the reward depends on (that a step, not
        # the answer line, follows; that the number before an ending is complete): "choice". Only the
        # characters after it are free of any consequence.
        for start, n in ((offset, head), (end - ending, ending)):
            if n:
                labels[start : start + n] = ["choice"] + ["free"] * (n - 1)
        if _ANSWER_RE.match(line):
            end = _tail_end(completion_text, offset + len(line))
            labels[offset + len(line) : end] = ["tail"] * (end - offset - len(line))
    box = completion_text.rfind("\\boxed{")
    if box >= 0:
        open_at = box + len("\\boxed{")
        close_at = completion_text.find("}", open_at)
        if close_at >= 0:
            labels[open_at:close_at] = ["answer"] * (close_at - open_at)
    return labels


@functools.lru_cache(maxsize=16)
def _split_sizes(difficulty: int, top: int, step: int, heldout_fraction: float) -> dict[str, int]:
    """{"train": n, "heldout": m}: every chain of `difficulty` steps (the first operand 1..top, operands
    1..step, running totals in 0..top), hashed as `ArithmeticTask.split_of` does."""
    cut = heldout_fraction * 2**64
    sizes = {"train": 0, "heldout": 0}

    def walk(acc: int, expr: str, left: int) -> None:
        if not left:
            h = int.from_bytes(hashlib.sha256(expr.encode()).digest()[:8], "big")
            sizes["heldout" if h < cut else "train"] += 1
            return
        for b in range(1, step + 1):
            if acc + b <= top:
                walk(acc + b, f"{expr} + {b}", left - 1)
            if acc - b >= 0:
                walk(acc - b, f"{expr} - {b}", left - 1)

    for a in range(1, top + 1):
        walk(a, str(a), difficulty)
    return sizes


class ArithmeticTask:
    """Generator + checker for the arithmetic chain task.

    Args:
        difficulty: number of steps (operands = difficulty + 1), 1..`MAX_DIFFICULTY`.
        digits: the first operand and the running totals lie in ``[0, 10**digits - 1]``, 1..`MAX_DIGITS`.
        operand_digits: the later operands lie in ``[1, 10**operand_digits - 1]``, 1..digits.
        seed: sampling seed (split membership does not depend on it).
        heldout_fraction: share of the problem space reserved for the held-out split, in (0, 1).
        phrasings: free choices per step line (0 = none; k in 1..`MAX_PHRASINGS`: the teacher opens
            each step with one of the first k `CONNECTIVES` and closes it with one of the first k
            `ENDINGS`). The problems and the checker do not depend on it.
        tail: letters of the reward-irrelevant tail the teacher writes after the answer line (0 = none;
            0..`MAX_TAIL`, drawn uniformly from `TAIL_ALPHABET`). The problems and the checker do not
            depend on it either.
    """

    def __init__(
        self,
        difficulty: int = 3,
        digits: int = 2,
        operand_digits: int = 1,
        seed: int = 0,
        heldout_fraction: float = 0.1,
        phrasings: int = 0,
        tail: int = 0,
    ):
        if not isinstance(difficulty, int) or not 1 <= difficulty <= MAX_DIFFICULTY:
            raise ValueError(
                f"difficulty must be an int in 1..{MAX_DIFFICULTY} (number of steps), got {difficulty!r}"
            )
        if not isinstance(digits, int) or not 1 <= digits <= MAX_DIGITS:
            raise ValueError(f"digits must be an int in 1..{MAX_DIGITS}, got {digits!r}")
        if not isinstance(operand_digits, int) or not 1 <= operand_digits <= digits:
            raise ValueError(f"operand_digits must be an int in 1..digits ({digits}), got {operand_digits!r}")
        if not isinstance(heldout_fraction, int | float) or not 0.0 < heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction!r}")
        if not isinstance(phrasings, int) or not 0 <= phrasings <= MAX_PHRASINGS:
            raise ValueError(f"phrasings must be an int in 0..{MAX_PHRASINGS}, got {phrasings!r}")
        if isinstance(tail, bool) or not isinstance(tail, int) or not 0 <= tail <= MAX_TAIL:
            raise ValueError(f"tail must be an int in 0..{MAX_TAIL} (letters after the answer), got {tail!r}")
        self.difficulty = difficulty
        self.digits = digits
        self.operand_digits = operand_digits
        self.seed = seed
        self.heldout_fraction = heldout_fraction
        self.phrasings = phrasings
        self.tail = tail
        self.max_value = 10**digits - 1
        self.max_operand = 10**operand_digits - 1

    def __repr__(self) -> str:
        return (
            f"ArithmeticTask(difficulty={self.difficulty}, digits={self.digits}, "
            f"operand_digits={self.operand_digits}, seed={self.seed}"
            + (f", phrasings={self.phrasings}" if self.phrasings else "")
            + (f", tail={self.tail})" if self.tail else ")")
        )

    def describe(self) -> str:
        """The settings that fix the problem space, in words ("difficulty 3, digits 2, operand_digits 1")."""
        return f"difficulty {self.difficulty}, digits {self.digits}, operand_digits {self.operand_digits}"

    def count_problems(self, limit: int | None = None) -> int:
        """The number of distinct problems over both splits (every chain `_draw` can produce), or `limit`
        when there are at least that many (counting stops there). Exact: the running totals' counts,
        step by step, with prefix sums (difficulty x 10**digits operations)."""
        top, step = self.max_value, self.max_operand
        counts = [0] + [1] * top  # the first operand: 1..max_value
        for _ in range(self.difficulty):
            if limit is not None and sum(counts) >= limit:
                return limit  # each step keeps at least one continuation per total: counts never shrink
            prefix = [0]  # prefix[i] = counts[0] + ... + counts[i - 1]
            for c in counts:
                prefix.append(prefix[-1] + c)
            # a total c is reached from c - step..c - 1 by an addition and from c + 1..c + step by a subtraction
            counts = [
                prefix[c] - prefix[max(c - step, 0)] + prefix[min(c + step, top) + 1] - prefix[c + 1]
                for c in range(top + 1)
            ]
        total = sum(counts)
        return total if limit is None else min(total, limit)

    def split_size(self, split: str) -> int:
        """The exact number of distinct problems of `split` ("train" / "heldout"), by enumerating the whole
        problem space and hashing each expression (`split_of`); for spaces of up to `EXACT_COUNT_LIMIT`
        problems (a ValueError above it)."""
        total = self.count_problems(limit=EXACT_COUNT_LIMIT + 1)
        if total > EXACT_COUNT_LIMIT:
            raise ValueError(
                f"{self!r}: more than {EXACT_COUNT_LIMIT} problems: too many to count a split exactly"
            )
        return _split_sizes(self.difficulty, self.max_value, self.max_operand, self.heldout_fraction)[split]

    def max_sample(self, split: str, n: int | None = None) -> int:
        """The most problems `sample(.., split)` gives: `MAX_SAMPLE`, and no more than the split holds
        (exactly, for a space of up to `EXACT_COUNT_LIMIT` problems; else half the hash fraction's
        expectation, which is what rejection sampling reaches in reasonable time). With `n`, the work
        stops as soon as `n` is known to be allowed (an exact count only when `n` is a large share)."""
        share = self.heldout_fraction if split == "heldout" else 1.0 - self.heldout_fraction
        # enough to tell: a space of `enough` problems has a split of over twice MAX_SAMPLE on average
        enough = max(EXACT_COUNT_LIMIT + 1, int(4 * MAX_SAMPLE / share) + 1)
        total = self.count_problems(limit=enough)
        expected = int(total * share)
        if n is not None and n <= min(MAX_SAMPLE, expected // 2):
            return min(MAX_SAMPLE, expected // 2)  # far below the split's size: no exact count needed
        if total <= EXACT_COUNT_LIMIT:
            return min(MAX_SAMPLE, self.split_size(split))
        return min(MAX_SAMPLE, expected // 2)

    def check_sample_size(self, n: int, split: str) -> None:
        """ValueError, at once, when `sample(n, split)` cannot succeed or would be unbounded: more than
        `MAX_SAMPLE` problems, or more distinct problems than the split holds (see `max_sample`)."""
        if isinstance(n, bool) or not hasattr(n, "__index__") or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        if n > MAX_SAMPLE:
            raise ValueError(
                f"{n} problems asked, above {MAX_SAMPLE}, the most one sample builds (all are built up front)"
            )
        bound = self.max_sample(split, n)
        if n > bound:
            total = self.count_problems(limit=EXACT_COUNT_LIMIT + 1)
            how = (
                f"only {bound} distinct {split} problems exist"
                if total <= EXACT_COUNT_LIMIT
                else f"at most {bound} distinct {split} problems can be drawn (half the split's expected size)"
            )
            raise ValueError(f"{self!r} ({self.describe()}): {how}, {n} asked; raise difficulty or digits")

    def split_of(self, expression: str) -> str:
        """'heldout' or 'train' for an expression such as ``"47 + 38 - 19"`` (seed-independent)."""
        h = int.from_bytes(hashlib.sha256(expression.encode()).digest()[:8], "big")
        return "heldout" if h < self.heldout_fraction * 2**64 else "train"

    def _draw(self, rng: random.Random) -> tuple[list[int], list[str]]:
        terms = [rng.randint(1, self.max_value)]
        ops: list[str] = []
        acc = terms[0]
        while len(ops) < self.difficulty:
            op = rng.choice("+-")
            b = rng.randint(1, self.max_operand)
            c = acc + b if op == "+" else acc - b
            if 0 <= c <= self.max_value:
                terms.append(b)
                ops.append(op)
                acc = c
        return terms, ops

    def sample(self, n: int, split: str = "train") -> list[ArithmeticProblem]:
        """n distinct problems of one split, deterministic in the task's arguments and `split`. At most
        `max_sample(split)`: more is a ValueError before anything is drawn (`check_sample_size`)."""
        if split not in ("train", "heldout"):
            raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
        self.check_sample_size(n, split)
        rng = random.Random(
            f"arith|{self.difficulty}|{self.digits}|{self.operand_digits}|{self.seed}|{split}"
        )
        seen: set[str] = set()
        out: list[ArithmeticProblem] = []
        attempts, max_attempts = 0, 200 * n + 10_000
        while len(out) < n:
            attempts += 1
            if attempts > max_attempts:
                raise ValueError(
                    f"{self!r}: could only find {len(out)} distinct {split} problems of the {n} asked; "
                    "raise difficulty or digits"
                )
            terms, ops = self._draw(rng)
            expr = " ".join([str(terms[0])] + [f"{op} {b}" for op, b in zip(ops, terms[1:])])
            if expr in seen or self.split_of(expr) != split:
                continue
            seen.add(expr)
            text = f"Compute {expr}."
            canonical = [(CONNECTIVES[0], ENDINGS[0])] * len(ops) if self.phrasings else None
            lines = _chain(terms, ops, affixes=canonical, tail=TAIL_ALPHABET[0] * self.tail)
            answer = lines[-2 if self.tail else -1][len(_ANSWER_PREFIX) : -2]
            pid = f"arith-d{self.difficulty}-{split}-{self.seed}-{len(out)}"
            out.append(ArithmeticProblem(id=pid, problem=text, answer=answer, solution="\n".join(lines)))
        return out

    def solution(
        self, problem: Problem | str, *, forget_rate: float = 0.0, rng: random.Random | None = None
    ) -> str:
        """A teacher's solution: correct when ``forget_rate`` is 0; otherwise each addition with a carry
        forgets it with probability ``forget_rate`` (drawn from ``rng``), the slip propagating
        consistently through the later steps to the boxed answer. With ``phrasings`` each step's
        connective and ending are drawn uniformly from the task's first k (after the slips); with
        ``tail`` the tail's letters, uniformly from `TAIL_ALPHABET` (after the phrasings)."""
        if not 0.0 <= forget_rate <= 1.0:
            raise ValueError(f"forget_rate must be in [0, 1], got {forget_rate!r}")
        terms, ops = parse_problem(problem)
        if forget_rate == 0.0 and not self.phrasings and not self.tail:
            return "\n".join(_chain(terms, ops))
        if rng is None:
            raise ValueError("a noisy, free-phrased or tailed solution needs an explicit rng for determinism")
        forget, acc = [], terms[0]
        for op, b in zip(ops, terms[1:]):
            f = forget_rate > 0.0 and _has_carry(acc, op, b) and rng.random() < forget_rate
            forget.append(f)
            acc = _apply(acc, op, b, forget=f)
        k = self.phrasings
        affixes = [(rng.choice(CONNECTIVES[:k]), rng.choice(ENDINGS[:k])) for _ in ops] if k else None
        tail = "".join(rng.choice(TAIL_ALPHABET) for _ in range(self.tail))
        return "\n".join(_chain(terms, ops, forget, affixes, tail))

    @staticmethod
    def check(problem: Problem | str, completion_text: str) -> bool:
        return check(problem, completion_text)

    @staticmethod
    def locate_first_error(problem: Problem | str, completion_text: str) -> ErrorLocation:
        return locate_first_error(problem, completion_text)

    @staticmethod
    def label_chars(problem: Problem | str, completion_text: str) -> list[str]:
        return label_chars(problem, completion_text)

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokencredit.data.loaders import Problem
from tokencredit.data.synthetic import (
    CONNECTIVES,
    ENDINGS,
    LABELS,
    ArithmeticProblem,
    ArithmeticTask,
    check,
    extract_answer,
    label_chars,
    locate_first_error,
    parse_problem,
    reference_solution,
)

P = Problem(id="hand-0", problem="Compute 47 + 38 - 19 + 6.", answer="72")
REF = "47 + 38 = 85\n85 - 19 = 66\n66 + 6 = 72\nThe answer is \\boxed{72}."


def _signed_sum(problem: Problem) -> int:
    terms, ops = parse_problem(problem)
    return terms[0] + sum(b if op == "+" else -b for op, b in zip(ops, terms[1:]))


# ---------------------------------------------------------------- generator


def test_reference_solution_and_parse():
    assert parse_problem(P) == ([47, 38, 19, 6], ["+", "-", "+"])
    assert reference_solution(P) == REF
    assert reference_solution(P.problem) == REF
    with pytest.raises(ValueError, match="hand-1"):
        parse_problem(Problem(id="hand-1", problem="What is 2 + 2?", answer="4"))


@pytest.mark.parametrize("difficulty,digits,operand_digits", [(1, 2, 1), (3, 2, 1), (3, 2, 2), (5, 3, 2)])
def test_sample_records_are_consistent(difficulty, digits, operand_digits):
    task = ArithmeticTask(difficulty=difficulty, digits=digits, operand_digits=operand_digits, seed=3)
    probs = task.sample(200, "train")
    assert len(probs) == 200 and len({p.problem for p in probs}) == 200
    assert len({p.id for p in probs}) == 200
    for p in probs:
        assert isinstance(p, Problem) and isinstance(p, ArithmeticProblem)
        terms, ops = parse_problem(p)
        assert len(ops) == difficulty
        assert 1 <= terms[0] <= 10**digits - 1
        assert all(1 <= t <= 10**operand_digits - 1 for t in terms[1:])
        acc = terms[0]
        for op, b in zip(ops, terms[1:]):
            acc = acc + b if op == "+" else acc - b
            assert 0 <= acc <= 10**digits - 1
        assert int(p.answer) == _signed_sum(p) == acc
        assert p.solution == reference_solution(p)
        assert len(p.solution.split("\n")) == difficulty + 1
        assert check(p, p.solution)
        assert locate_first_error(p, p.solution).kind == "correct"


def test_sample_is_deterministic_and_prefix_stable():
    a = ArithmeticTask(difficulty=3, seed=7).sample(300, "heldout")
    b = ArithmeticTask(difficulty=3, seed=7).sample(300, "heldout")
    c = ArithmeticTask(difficulty=3, seed=7).sample(100, "heldout")
    d = ArithmeticTask(difficulty=3, seed=8).sample(100, "heldout")
    assert a == b
    assert a[:100] == c
    assert [p.problem for p in c] != [p.problem for p in d]


def test_train_and_heldout_are_disjoint_for_any_seeds():
    train = {p.problem for s in (0, 1) for p in ArithmeticTask(difficulty=2, seed=s).sample(3000, "train")}
    held = {p.problem for s in (0, 2) for p in ArithmeticTask(difficulty=2, seed=s).sample(600, "heldout")}
    assert len(held) > 600  # two seeds give (mostly) different held-out problems
    assert not train & held
    task = ArithmeticTask(difficulty=2)
    assert all(task.split_of(p[len("Compute ") : -1]) == "heldout" for p in held)


def test_difficulty_one_digit_exhaustion_is_a_clear_error():
    with pytest.raises(ValueError, match="distinct heldout problems"):
        ArithmeticTask(difficulty=1, digits=1).sample(500, "heldout")


@pytest.mark.parametrize(
    "kwargs",
    [{"difficulty": 0}, {"difficulty": 2.0}, {"digits": 0}, {"digits": 5}, {"heldout_fraction": 1.0}],
)
def test_bad_task_arguments(kwargs):
    with pytest.raises(ValueError):
        ArithmeticTask(**kwargs)


def test_bad_split_name():
    with pytest.raises(ValueError, match="split"):
        ArithmeticTask().sample(3, "test")


def test_noisy_teacher_forgets_carries_and_is_always_wrong():
    task = ArithmeticTask(difficulty=3, seed=0)
    probs = task.sample(300, "train")
    rng = random.Random(0)
    assert all(task.solution(p) == p.solution for p in probs)
    with pytest.raises(ValueError, match="rng"):
        task.solution(probs[0], forget_rate=0.5)
    n_wrong = 0
    for p in probs:
        noisy = task.solution(p, forget_rate=1.0, rng=rng)
        loc = locate_first_error(p, noisy)
        has_carry = "wrong" in loc.kind
        assert check(p, noisy) == (not has_carry)  # a slip is never cancelled later
        if has_carry:
            n_wrong += 1
            assert loc.kind == "wrong-step"
            line = loc.expected
            a, op, b = line.split(" ")[:3]
            assert op == "+" and (int(a) % 10 + int(b) % 10) >= 10  # the step had a carry
            # The teacher's result is the carry-less (digit-wise mod 10) sum.
            line_start = noisy.rfind("\n", 0, loc.start) + 1
            result_start = noisy.index(" = ", line_start) + 3
            true, slip = str(int(a) + int(b)), str(int(a) + int(b) - 10)
            assert noisy[result_start:].startswith(slip + "\n")
            # e.g. 85 vs 75: the tens digit; 11 vs 1: the newline that ends the number too early
            assert loc.start == result_start + (1 if true[0] == slip[0] else 0)
    assert 50 < n_wrong < 250


# ---------------------------------------------------------------- checker


def test_check_reads_the_last_boxed_integer():
    assert check(P, REF)
    assert check(P.problem, REF)  # gold computed from the text
    assert check(P, "\\boxed{3} no wait \\boxed{ 72 }")
    assert not check(P, "\\boxed{72} no wait \\boxed{73}")
    assert not check(P, "72")
    assert not check(P, "\\boxed{72.5}")
    assert extract_answer("x \\boxed{-5}.") == -5
    assert extract_answer("none") is None
    with pytest.raises(ValueError, match="hand-2"):
        check(Problem(id="hand-2", problem=P.problem, answer="seventy"), REF)


def test_check_agrees_with_math_reward():
    from tokencredit.rewards import math_reward

    texts = [REF, REF.replace("{72}", "{73}"), "47 + 38 = 85", "The answer is \\boxed{072}."]
    assert math_reward(texts, [P.answer] * len(texts)) == [float(check(P, t)) for t in texts]


# ---------------------------------------------------------------- first-error locator


def test_correct_marks_the_answer():
    loc = locate_first_error(P, REF)
    assert loc.kind == "correct" and loc.step is None and loc.expected is None
    assert REF[loc.start : loc.end] == "72"
    # trailing whitespace after the answer is fine
    assert locate_first_error(P, REF + "\n  ").kind == "correct"


def test_wrong_first_step():
    text = "47 + 38 = 75\n75 - 19 = 56\n56 + 6 = 62\nThe answer is \\boxed{62}."
    loc = locate_first_error(P, text)
    assert (loc.kind, loc.step, loc.start, loc.end) == ("wrong-step", 0, 10, 12)
    assert text[loc.start : loc.end] == "75" and loc.expected == "47 + 38 = 85"
    assert not check(P, text)


def test_wrong_later_step_units_digit():
    text = "47 + 38 = 85\n85 - 19 = 67\n67 + 6 = 73\nThe answer is \\boxed{73}."
    loc = locate_first_error(P, text)
    assert (loc.kind, loc.step) == ("wrong-step", 1)
    assert loc.start == text.index("67") + 1  # the units digit is the first wrong character
    assert text[loc.start : loc.end] == "7"
    assert loc.expected == "85 - 19 = 66"


def test_wrong_operand_copy_and_operator():
    text = "47 + 38 = 85\n85 - 91 = -6\n-6 + 6 = 0\nThe answer is \\boxed{0}."
    loc = locate_first_error(P, text)
    assert (loc.kind, loc.step) == ("wrong-step", 1) and text[loc.start : loc.end] == "91"
    text = "47 + 38 = 85\n85 + 19 = 104\n"
    loc = locate_first_error(P, text)
    assert (loc.kind, loc.step, text[loc.start]) == ("wrong-step", 1, "+")


def test_compensating_errors_are_process_errors():
    text = "47 + 38 = 84\n84 - 19 = 66\n66 + 6 = 72\nThe answer is \\boxed{72}."
    assert check(P, text)  # the outcome is right...
    loc = locate_first_error(P, text)  # ...the process is not
    assert (loc.kind, loc.step, text[loc.start : loc.end]) == ("wrong-step", 0, "4")


def test_wrong_final_answer_only():
    text = REF.replace("{72}", "{27}")
    loc = locate_first_error(P, text)
    assert (loc.kind, loc.step) == ("wrong-final", 3)
    assert text[loc.start : loc.end] == "27"
    text = REF.replace("{72}", "{75}")
    loc = locate_first_error(P, text)
    assert loc.kind == "wrong-final" and text[loc.start : loc.end] == "5"


@pytest.mark.parametrize(
    "text,step,start",
    [
        ("", 0, 0),  # empty completion: ended before the first step
        ("hello world", 0, 0),
        ("47 + 38 = 85\n", 1, 13),  # stopped after one step
        ("47 + 38 = 85\n85 - 1", 1, 19),  # truncated mid-line (start = len(text))
        ("47 + 38 85\n", 0, 8),  # a step line that is not "a op b = c"
        ("47 + 38 = 85\n85 - 19 = 66\nThe answer is \\boxed{66}.", 2, 26),  # skipped a step
        (REF[:-1], 3, len(REF) - 1),  # answer line without its closing brace
        ("47 + 38 = 85\n85 - 19 = 66\n66 + 6 = 72\nThe answer is 72.", 3, 52),
        (REF + "\n66 + 6 = 72", 4, len(REF) + 1),  # extra text after the answer
    ],
)
def test_malformed(text, step, start):
    loc = locate_first_error(P, text)
    assert (loc.kind, loc.step, loc.start) == ("malformed", step, start)
    assert loc.start <= loc.end <= len(text)


@settings(max_examples=150, deadline=None)
@given(
    difficulty=st.integers(1, 5),
    seed=st.integers(0, 10**6),
    pos=st.integers(0, 10**6),
    repl=st.sampled_from(list("0123456789+- =x.}{")),
)
def test_single_character_substitution_is_located(difficulty, seed, pos, repl):
    p = ArithmeticTask(difficulty=difficulty, seed=seed).sample(1)[0]
    k = pos % len(p.solution)
    if p.solution[k] in ("\n", repl):
        return
    text = p.solution[:k] + repl + p.solution[k + 1 :]
    loc = locate_first_error(p, text)
    assert loc.kind != "correct"
    assert loc.start == k
    assert loc.step == p.solution[:k].count("\n")


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**6), cut=st.integers(0, 10**6))
def test_truncation_is_malformed_at_the_end(seed, cut):
    p = ArithmeticTask(difficulty=3, seed=seed).sample(1)[0]
    k = cut % len(p.solution)
    loc = locate_first_error(p, p.solution[:k])
    assert (loc.kind, loc.start, loc.end) == ("malformed", k, k)


# ---------------------------------------------------------------- labels


def test_label_chars_on_reference():
    labels = label_chars(P, REF)
    assert len(labels) == len(REF) and set(labels) <= set(LABELS)
    by = {lab: "".join(c for c, l in zip(REF, labels) if l == lab) for lab in LABELS}
    assert by["answer"] == "72"
    assert by["computed"] == "47+3885" + "85-1966" + "66+672"
    assert by["format"] == "   = \n" * 3 + "The answer is \\boxed{}."
    # the shared boilerplate of two different problems has the same format characters
    q = ArithmeticTask(difficulty=3).sample(1)[0]
    fq = "".join(c for c, l in zip(q.solution, label_chars(q, q.solution)) if l == "format")
    assert fq == by["format"]


def test_label_chars_on_malformed_text():
    text = "I think -5 + 2 = 7 so \\boxed{9"  # unclosed box: no answer span
    labels = label_chars(P, text)
    assert "answer" not in labels
    assert [c for c, l in zip(text, labels) if l == "computed"] == list("-5+27") + ["9"]
    assert label_chars(P, "") == []
    with pytest.raises(ValueError, match="not an arithmetic-task problem"):
        label_chars("What is 2 + 2?", "4")


def test_task_methods_delegate():
    task = ArithmeticTask()
    assert task.check(P, REF) and task.locate_first_error(P, REF).kind == "correct"
    assert task.label_chars(P, REF) == label_chars(P, REF)


def test_hard_task_teacher_slips_only_at_carries():
    """The data of the shipped "toy-hard" warm start (tokencredit.models.TOY_HARD_CONFIG): six-step
    chains whose noisy-teacher solutions go wrong only by dropping a carry, more often than not."""
    task = ArithmeticTask(difficulty=6, seed=0)
    probs = task.sample(400, "train")
    rng = random.Random("hard")
    wrong = 0
    for p in probs:
        assert len(p.solution) + 1 <= 98  # + EOS: the rollout budget of toy-hard (128) holds it
        noisy = task.solution(p, forget_rate=0.55, rng=rng)
        loc = locate_first_error(p, noisy)
        if loc.kind == "correct":
            continue
        wrong += 1
        assert loc.kind == "wrong-step" and not check(p, noisy)
        a, op, b = loc.expected.split(" ")[:3]
        assert op == "+" and (int(a) % 10 + int(b) % 10) >= 10
    assert 0.45 < wrong / len(probs) < 0.75


# ---------------------------------------------------------------- free phrasings (the headroom knob)


def test_phrasings_change_the_solutions_not_the_problems():
    plain, free = ArithmeticTask(seed=3).sample(50), ArithmeticTask(seed=3, phrasings=4).sample(50)
    assert [p.problem for p in plain] == [p.problem for p in free]
    assert [p.answer for p in plain] == [p.answer for p in free]
    assert (
        free[0].solution.startswith("Then ")
        and locate_first_error(free[0], free[0].solution).kind == "correct"
    )
    with pytest.raises(ValueError, match="phrasings"):
        ArithmeticTask(phrasings=len(CONNECTIVES) + 1)
    with pytest.raises(ValueError, match="explicit rng"):
        ArithmeticTask(phrasings=2).solution(P)


def test_free_solutions_draw_only_the_first_k_phrasings_and_stay_correct():
    task = ArithmeticTask(phrasings=3)
    rng = random.Random(0)
    seen_conn, seen_end = set(), set()
    for p in task.sample(200):
        text = task.solution(p, rng=rng)
        assert check(p, text) and locate_first_error(p, text).kind == "correct"
        for line in text.split("\n")[:-1]:
            conn, rest = line.split(" ", 1) if not line.startswith("We get") else ("We get", line[7:])
            seen_conn.add(conn)
            seen_end.add(next((e for e in ENDINGS[1:] if rest.endswith(e)), ""))
    assert seen_conn == set(CONNECTIVES[:3]) and seen_end == set(ENDINGS[:3])
    # Same rng seed, same solutions; the slips are still drawn as without phrasings.
    a = [task.solution(p, forget_rate=0.7, rng=random.Random(5)) for p in task.sample(20)]
    b = [task.solution(p, forget_rate=0.7, rng=random.Random(5)) for p in task.sample(20)]
    assert a == b


def test_first_error_inside_a_free_phrased_line():
    text = "Next 47 + 38 = 75;\n75 - 19 = 56\n56 + 6 = 62\nThe answer is \\boxed{62}."
    loc = locate_first_error(P, text)
    assert (loc.kind, loc.step, text[loc.start : loc.end]) == ("wrong-step", 0, "75")
    # A right step with free words passes; the error is found on the next line.
    text = "We get 47 + 38 = 85 (sure)\nSo 85 - 19 = 67 ok\n67 + 6 = 73\nThe answer is \\boxed{73}."
    loc = locate_first_error(P, text)
    assert (loc.kind, loc.step, text[loc.start : loc.end]) == ("wrong-step", 1, "7")
    # Words that are not a free phrasing are an error at their first character.
    text = "Hence 47 + 38 = 85\n85 - 19 = 66\n66 + 6 = 72\nThe answer is \\boxed{72}."
    assert locate_first_error(P, text).kind == "malformed" and locate_first_error(P, text).start == 0
    # A connective before a broken step: the error is in the step, not in the free word.
    loc = locate_first_error(P, "Then 47 + 3")
    assert (loc.kind, loc.start) == ("malformed", len("Then 47 + 3"))


def test_free_words_are_labelled_free_after_their_deciding_first_character():
    text = "Next 47 + 38 = 85;\n85 - 19 = 66 ok\nSo the answer is \\boxed{72}."
    labels = label_chars(P, text)
    assert {"choice", "free"} <= set(LABELS)
    key = {"format": ".", "computed": "c", "answer": "a", "choice": "C", "free": "F"}
    got = "".join(key[lab] for lab in labels)
    first, second = text.split("\n")[:2]
    # "N" decides that a step follows (not the answer line); ";" that 85 is complete: "choice"
    assert got[: len(first)] == "CFFFFcc.c.cc...ccC"
    assert got[len(first) + 1 : len(first) + 1 + len(second)] == "cc.c.cc...ccCFF"
    assert "F" not in got[len(first) + len(second) + 2 :]  # "So" before the answer line is not a step's word


def _all_expressions(task: ArithmeticTask) -> list[str]:
    """Every chain the task can draw, by brute force (small tasks only)."""
    exprs = [(a, str(a)) for a in range(1, task.max_value + 1)]
    for _ in range(task.difficulty):
        exprs = [
            (c, f"{e} {op} {b}")
            for acc, e in exprs
            for b in range(1, task.max_operand + 1)
            for op, c in (("+", acc + b), ("-", acc - b))
            if 0 <= c <= task.max_value
        ]
    return [e for _, e in exprs]


@pytest.mark.parametrize(
    "difficulty,digits,operand_digits", [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 2, 2), (3, 1, 1)]
)
def test_the_problem_space_is_counted_exactly(difficulty, digits, operand_digits):
    task = ArithmeticTask(difficulty=difficulty, digits=digits, operand_digits=operand_digits)
    exprs = _all_expressions(task)
    assert task.count_problems() == len(exprs) == len(set(exprs))
    assert task.count_problems(limit=10) == min(10, len(exprs))
    held = sum(task.split_of(e) == "heldout" for e in exprs)
    assert (task.split_size("heldout"), task.split_size("train")) == (held, len(exprs) - held)
    # the whole split can be sampled, one more problem is refused at once
    assert len(task.sample(held, "heldout")) == held
    with pytest.raises(ValueError, match=f"only {held} distinct heldout problems exist, {held + 1} asked"):
        task.sample(held + 1, "heldout")


def test_sizes_beyond_the_bounds_are_refused_at_once():
    import time

    from tokencredit.data.synthetic import MAX_DIFFICULTY, MAX_SAMPLE

    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=f"above {MAX_SAMPLE}"):
        ArithmeticTask().sample(10**12)
    with pytest.raises(ValueError, match="only 1518 distinct train problems exist"):
        ArithmeticTask(difficulty=1).sample(2000)  # difficulty 1, digits 2: 1518 training problems
    with pytest.raises(ValueError, match=f"difficulty must be an int in 1..{MAX_DIFFICULTY}"):
        ArithmeticTask(difficulty=100_000)
    assert time.perf_counter() - t0 < 20
    big = ArithmeticTask(difficulty=6, digits=4, operand_digits=2)  # far too many to count a split exactly
    assert big.count_problems(limit=10**9) == 10**9 and big.max_sample("heldout") == MAX_SAMPLE
    # the default run's sizes take the fast path: no enumeration of the problem space
    assert ArithmeticTask().max_sample("train", 4000) == min(MAX_SAMPLE, 517821 * 9 // 10 // 2)

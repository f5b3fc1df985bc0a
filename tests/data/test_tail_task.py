"""The reward-irrelevant tail of the arithmetic task (`ArithmeticTask(tail=m)`, issue 43's testbed): the
teacher writes it, the checker ignores it, the labels name it, and no reward can read it."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokencredit.data.synthetic import (
    LABELS,
    MAX_TAIL,
    TAIL_ALPHABET,
    ArithmeticTask,
    check,
    extract_answer,
    label_chars,
    locate_first_error,
)
from tokencredit.rewards import extract_answer as reward_answer

P = "Compute 47 + 38 - 19 + 6."
REF = "47 + 38 = 85\n85 - 19 = 66\n66 + 6 = 72\nThe answer is \\boxed{72}."


def test_the_alphabet_spells_nothing_a_reward_reads() -> None:
    assert len(set(TAIL_ALPHABET)) == len(TAIL_ALPHABET) >= 4 and TAIL_ALPHABET.isalpha()
    assert TAIL_ALPHABET.islower()
    # no letter of the words extraction looks for, so none can be spelled, even across the tail's ends
    assert not set(TAIL_ALPHABET) & set("answerboxedfbox")


def test_tailed_solutions_keep_the_problems_and_end_in_m_letters() -> None:
    plain, tailed = ArithmeticTask(seed=4).sample(30), ArithmeticTask(seed=4, tail=32).sample(30)
    assert [p.problem for p in plain] == [p.problem for p in tailed]
    assert [p.answer for p in plain] == [p.answer for p in tailed]
    task = ArithmeticTask(seed=4, tail=32)
    rng = random.Random(0)
    seen: set[str] = set()
    for p, q in zip(plain, tailed):
        assert q.solution == p.solution + "\n" + TAIL_ALPHABET[0] * 32  # the canonical tail
        text = task.solution(q, rng=rng)
        body, tail = text.rsplit("\n", 1)
        assert body == p.solution and len(tail) == 32 and set(tail) <= set(TAIL_ALPHABET)
        seen |= set(tail)
        assert check(q, text) and locate_first_error(q, text).kind == "correct"
    assert seen == set(TAIL_ALPHABET)  # drawn from the whole alphabet
    # slips are drawn as without a tail (the tail's letters come after them from the same rng)
    noisy = [task.solution(p, forget_rate=0.7, rng=random.Random(5)) for p in tailed]
    plain_noisy = [ArithmeticTask(seed=4).solution(p, forget_rate=0.7, rng=random.Random(5)) for p in plain]
    assert [t.rsplit("\n", 1)[0] for t in noisy] == plain_noisy
    assert "tail=32" in repr(task)
    for bad in (-1, MAX_TAIL + 1, True, 2.0):
        with pytest.raises(ValueError, match="tail must be an int"):
            ArithmeticTask(tail=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="explicit rng"):
        task.solution(P)


def test_tail_letters_are_labelled_tail_and_nothing_else_is() -> None:
    text = REF + "\nqkcv"
    labels = label_chars(P, text)
    assert "tail" in LABELS
    assert labels[len(REF) :] == ["tail"] * 5 and "tail" not in labels[: len(REF)]
    assert labels[: len(REF)] == label_chars(P, REF)
    # letters outside the alphabet, or after something else, are not a tail
    for extra in ("\nhello", "\n7qk", "\n"):
        assert "tail" not in label_chars(P, REF + extra)
    # the run stops at the first character outside the alphabet
    labels = label_chars(P, REF + "\nqk7c")
    assert labels[len(REF) :] == ["tail", "tail", "tail", "computed", "format"]
    # after an answer line only: letters elsewhere are never a tail
    assert "tail" not in label_chars(P, "qkcv\n" + REF.replace("\n", "\nqq\n", 1))


def test_the_checker_accepts_a_tail_and_finds_what_follows() -> None:
    assert locate_first_error(P, REF + "\nqkcv").kind == "correct"
    assert locate_first_error(P, REF + "\nqkcv\n  ").kind == "correct"  # trailing whitespace after it
    loc = locate_first_error(P, REF + "\nqk7")
    assert (loc.kind, loc.start) == ("malformed", len(REF) + 3)
    loc = locate_first_error(P, REF + "\nhello")
    assert (loc.kind, loc.start) == ("malformed", len(REF) + 1)
    wrong = REF.replace("{72}", "{71}") + "\nqkcv"
    assert locate_first_error(P, wrong).kind == "wrong-final" and not check(P, wrong)


# Texts a policy may write before and after a tail: right, wrong, malformed and adversarial.
_PREFIXES = [
    REF,
    REF.replace("{72}", "{71}"),
    REF.replace("85\n85", "75\n75"),
    "The answer is \\boxed{72}.",
    "**The answer is \\boxed{72}.**\nThe answer is \\boxed{72}.",
    "<answer>72</answer>\nThe answer is \\boxed{7}.",
    "#### 72\nThe answer is \\boxed{72}.",
    "The answer is \\boxed{{72}.\nThe answer is \\boxed{72}.",
]
_SUFFIXES = [
    "",
    "\n",
    "\nThe answer is \\boxed{5}.",
    "\\boxed{72}",
    "er is 5",
    " answer: 9",
    "7",
    "}",
    "\n#### 3",
    "<answer>4</answer>",
    "**",
    "\\boxed 8",
    "$",
    "\\",
]


@settings(max_examples=150, deadline=None)
@given(
    prefix=st.sampled_from(_PREFIXES),
    suffix=st.sampled_from(_SUFFIXES),
    a=st.text(alphabet=TAIL_ALPHABET, max_size=40),
    b=st.text(alphabet=TAIL_ALPHABET, max_size=40),
)
def test_no_reward_reads_the_tail(prefix: str, suffix: str, a: str, b: str) -> None:
    """The answer every reward reads (math-verify's input, the checker's integer) is the same whatever the
    tail holds, whatever comes before and after it; with nothing after it, the same as with no tail."""
    ta, tb = prefix + "\n" + a + suffix, prefix + "\n" + b + suffix
    for last_number in (False, True):
        assert reward_answer(ta, allow_last_number=last_number) == reward_answer(
            tb, allow_last_number=last_number
        )
    assert extract_answer(ta) == extract_answer(tb) and check(P, ta) == check(P, tb)
    if not suffix:
        for last_number in (False, True):
            assert reward_answer(ta, allow_last_number=last_number) == reward_answer(
                prefix, allow_last_number=last_number
            )
        assert check(P, ta) == check(P, prefix)


def test_the_math_reward_is_the_same_for_any_tail() -> None:
    """End to end through math-verify's worker: the trainer's "math" reward of a tailed completion."""
    from tokencredit.rewards import MathVerifier

    rng = random.Random(1)
    texts, golds = [], []
    for prefix in _PREFIXES[:4]:
        for _ in range(3):
            tail = "".join(rng.choice(TAIL_ALPHABET) for _ in range(rng.randint(0, 64)))
            texts += [prefix, prefix + "\n" + tail]
            golds += ["72", "72"]
    with MathVerifier(num_workers=1) as v:
        scores = v.score(texts, golds)
    assert scores[0::2] == scores[1::2]
    assert sorted(set(scores)) == [0.0, 1.0]  # right and wrong answers both seen

"""Answer extraction of what instruct models write (issue 30): "The final answer is: 21", "Answer: 21",
"So, the answer is **21**." Step 4 of the order (docs/spec/evaluation.md#answer-extraction), after the
explicit delimiters (box, <answer>, ####) and before the last number. The outputs below are
SmolLM2-135M-Instruct's own (greedy, chat template) or written in its style.
"""

from __future__ import annotations

import time

import pytest

from tokencredit.rewards import extract_answer, last_answer_statement

# (completion, answer read without / with the last-number fallback)
SMOLLM2 = [
    ("12 + 9 + 5 = 27", None, "27"),
    ("The final answer is: 21.", "21", "21"),
    ("So, the answer is **21**.", "21", "21"),
    ("**Answer:** 21", "21", "21"),
    ("Answer: 21", "21", "21"),
    ("The answer is 1.", "1", "1"),
    ("The final answer to this arithmetic problem is 11.", "11", "11"),
    ("The answer to the given arithmetic problem is 6.", "6", "6"),
    ("To solve this arithmetic problem, we need to add 1 to 6. 6 + 1 = 7. So, the answer is 7.", "7", "7"),
    (
        "To solve this problem, we need to find the sum of 0 and 5.\n\nThe answer is 15.\n\nThe final answer is 15.",
        "15",
        "15",
    ),
    # an intermediate statement, then the final one: the last wins
    ("The answer is 3.\n\nLet me check: 4 - 1 = 3, then 3 + 2 = 5.\n\nThe final answer is 5", "5", "5"),
    ("First, the answer is 12.\nThen we add 9.\nAnswer: 21", "21", "21"),
    # a final statement cut off by the token limit: the one before it
    ("The answer is 3.\n\nThe final answer is ", "3", "3"),
    # the value on the next line, in display math
    ("The final answer is:\n\n$$21$$", "21", "21"),
    ("The answer is 9 - 3 = 4.", "4", "4"),  # "a = 21": the result
    ("The answer is 10, which is the sum of 3 and 7.", "10", "10"),
    ("The answer is 21 because 12 + 9 = 21.", "21", "21"),
    ("The answer would be -12", "-12", "-12"),
    ("the answer is $\\frac{1}{2}$.", "\\frac{1}{2}", "\\frac{1}{2}"),
    ("The answer is \\(21\\).", "21", "21"),
    ("The answer is (1, 2).", "(1, 2)", "(1, 2)"),
    ('Answer: "yes"', "yes", "yes"),
    ("answer: x <= 3", "x <= 3", "x <= 3"),
    # no statement: "which is the answer" comes after the value
    ("9 - 8 = 1, which is the answer.", None, "1"),
    # a statement without a digit on a numeric task (last number allowed) is not the answer
    ("The answer is to add them. 3 + 5 = 8", "to add them", "8"),
    ("The answer is yes.", "yes", "yes"),  # ... unless there is no number at all
    # an unclosed (truncated) box is not a statement
    ("The answer is \\boxed{72", None, "72"),
]


@pytest.mark.parametrize(
    "text, plain, lenient", SMOLLM2, ids=lambda x: repr(x)[:40] if isinstance(x, str) else None
)
def test_instruct_model_answers(text, plain, lenient):
    assert extract_answer(text) == plain
    assert extract_answer(text, allow_last_number=True) == lenient


def test_explicit_delimiters_win_over_statements():
    # a box, an <answer> tag or a #### line is the answer even when a statement says otherwise
    assert extract_answer("The final answer is: 21.\n\\boxed{22}") == "22"
    assert extract_answer("\\boxed{22}\nThe final answer is: 21.") == "22"
    assert extract_answer("Final Answer: The final answer is $\\boxed{21}$. I hope it is correct.") == "21"
    assert extract_answer("<answer>7</answer>\nSo the answer is 8.") == "7"
    assert extract_answer("The answer is 5.\n#### 6") == "6"
    assert extract_answer("The answer is **\\boxed{73}**") == "73"


def test_statement_words():
    assert last_answer_statement("The ANSWER: 4") == "4"
    assert last_answer_statement("The answer equals 4.") == "4"
    assert last_answer_statement("My answers are 4 and 5.") is None  # plural: not a statement
    assert last_answer_statement("I answered 4.") is None
    assert last_answer_statement("What is the answer? It is 4.") is None
    assert last_answer_statement("<answer>4</answer>") is None  # tags are step 2, not a statement
    assert last_answer_statement("The answer is:   ") is None
    assert last_answer_statement("answer: *21*") == "21"
    assert last_answer_statement("answer: `21`.") == "21"


@pytest.mark.parametrize(
    "text",
    [
        "answer is " * 100_000,
        "answer to " * 100_000,
        "The answer to" + " " * 500_000 + "is 5",
        "answer to " + "x" * 1_000_000,
        "answer: . " * 100_000,
        "answer:" + " " * 1_000_000,
        "answer is \n" * 100_000,
        "Answer:\n" * 100_000,
        "answer " * 150_000,
        "answeranswer" * 100_000,
        "the answer is **" * 50_000,
        "answer is $" * 100_000,
        "answer is " + "=" * 1_000_000,
        "answer is " + "1=" * 500_000,
    ],
    ids=lambda t: repr(t[:12]) + f"..x{len(t)}",
)
def test_statements_are_linear_on_adversarial_texts(text):
    t0 = time.perf_counter()
    for last_number in (False, True):
        a = extract_answer(text, allow_last_number=last_number)
        assert a is None or (a == a.strip() and a)
    assert time.perf_counter() - t0 < 1.5

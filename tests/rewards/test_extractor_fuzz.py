"""Verifier safety under fuzzing (issue 10): the answer extractor, the format reward and the full math
reward never raise on any text, answer within the per-answer limit, and never execute their input.

The extractor runs in the trainer's own process, outside the verifier's per-answer wall-clock
limit, so it must be linear in the text: the regexes it replaced were quadratic (a line of 20k
spaces after "####" took 5 s, 20k unclosed "<answer>" tags about a minute). The linear versions
are checked against those regexes (the specification) on short texts.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokencredit.rewards import (
    MathVerifier,
    Reward,
    extract_answer,
    format_reward,
    last_boxed,
    normalize_answer,
)
from tokencredit.rewards.extract import _GSM8K_RE, _clean, clean_for_verifier, last_answer_tag
from tokencredit.rewards.shaping import _think_answer_ok
from tokencredit.rewards.verifier import normalize_golds

TIMEOUT = 1.5  # the verifier's per-answer limit in these tests
# Pieces that stress the extractor: boxes (closed, open, spaced), braces (escaped or not), answer
# tags, GSM8K markers, blanks, huge and odd numbers, unicode digits / spaces / ligatures, NUL.
PIECES = [
    "\\boxed{",
    "\\boxed ",
    "\\fbox{",
    "{",
    "}",
    "\\{",
    "\\}",
    "\\",
    "$",
    "**",
    "####",
    "#### ",
    "\n",
    " ",
    "\t",
    "<answer>",
    "</answer>",
    "<think>",
    "</think>",
    "\\frac{1}{2}",
    "^{",
    "9^9^9^9",
    "\\sqrt{",
    "\\left(",
    "\\right)",
    "1e308",
    "-0",
    "0.50",
    "1,000",
    "9" * 300,
    "\\infty",
    "nan",
    "\\text{",
    "١٢٣",
    "²",
    "∞",
    "√",
    "\u3000",
    "\u00a0",
    "ﬀ",
    "\x00",
    "\u202e",
    "😀",
    "answer",
    "The final answer is: ",
    "Answer:",
    " is ",
    " to ",
    "=",
    ". ",
    ", which",
]
GOLDS = ["1", "0.5", "\\frac{1}{2}", "72", "(1,2)", "x^2+1", "10^{100}", "-3", "\\{1,2\\}"]


def payloads(marker: Path) -> list[str]:
    """Texts that would create `marker` if anything evaluated them as Python or as a shell command."""
    py = f"__import__('os').system('touch {marker}')"
    return [
        py,
        f"exec(\"open('{marker}', 'w').close()\")",
        f"eval(compile(\"__import__('pathlib').Path('{marker}').touch()\", 'x', 'exec'))",
        f"$(touch {marker})",
        f"`touch {marker}`",
        f"; touch {marker} #",
        f"\\boxed{{{py}}}",
        f"<answer>{py}</answer>",
        f"#### {py}",
        f"\\boxed{{\\text{{{py}}}}}",
        f"\\boxed{{().__class__.__mro__[1].__subclasses__() + [{py}]}}",
    ]


pieces = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=8)), max_size=40).map("".join)


def completions(marker: Path) -> st.SearchStrategy[str]:
    junk = st.one_of(st.text(max_size=300), pieces)
    box = st.tuples(junk, junk).map(lambda t: f"{t[0]}\\boxed{{{t[1]}}}")
    with_payload = st.tuples(junk, st.sampled_from(payloads(marker)), junk).map("".join)
    return st.one_of(junk, box, with_payload)


@pytest.fixture(scope="module")
def marker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    m = tmp_path_factory.mktemp("pwn") / "pwned"
    yield m
    assert not m.exists(), "some input was executed"


# ---- the pure extractor ----------------------------------------------------------------------


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_extractor_never_raises_and_is_fast(data, marker):
    text = data.draw(completions(marker))
    t0 = time.perf_counter()
    for last_number in (False, True):
        a = extract_answer(text, allow_last_number=last_number)
        assert a is None or (isinstance(a, str) and a == a.strip() and a)
        if a is not None:
            assert isinstance(normalize_answer(a), str) and isinstance(clean_for_verifier(a), str)
    boxed = last_boxed(text)
    assert boxed is None or boxed in text  # a substring of the text, never something built from it
    assert format_reward([text], "boxed")[0] in (0.0, 1.0)
    assert format_reward([text], "think-answer")[0] in (0.0, 1.0)
    assert time.perf_counter() - t0 < TIMEOUT
    assert not marker.exists()


@settings(max_examples=200, deadline=None)
@given(
    prefix=st.text(alphabet=st.characters(blacklist_characters="\\{}"), max_size=50),
    inner=st.recursive(
        st.text(alphabet="0123456789+-x^ ", max_size=5),
        lambda s: s.map(lambda x: "{" + x + "}"),
        max_leaves=10,
    ),
    suffix=st.text(alphabet=st.characters(blacklist_characters="\\{}"), max_size=50),
)
def test_last_closed_box_is_found_exactly(prefix, inner, suffix):
    # balanced braces without backslashes: the box content comes back verbatim, whatever surrounds it
    assert last_boxed(f"{prefix}\\boxed{{{inner}}}{suffix}") == inner


# The regexes the linear code replaced: the specification it must agree with.
OLD_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
OLD_GSM8K = re.compile(r"^[ \t]*####[ \t]*(.+?)[ \t]*$", re.MULTILINE)
OLD_THINK_ANSWER = re.compile(
    r"^\s*(?:<think>)?(?:(?!<think>).)*?</think>\s*<answer>(.+?)</answer>\s*$", re.DOTALL
)
SHORT = st.lists(
    st.sampled_from(
        [
            "<answer>",
            "</answer>",
            "<think>",
            "</think>",
            "####",
            "#",
            " ",
            "\t",
            "\n",
            "\r",
            "a",
            "7",
            "\u3000",
            "\x0b",
        ]
    ),
    max_size=14,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(SHORT)
def test_linear_rewrites_agree_with_the_regexes_they_replace(text):
    tags = OLD_ANSWER_TAG.findall(text)
    assert last_answer_tag(text) == (tags[-1] if tags else None)
    assert _think_answer_ok(text) == (OLD_THINK_ANSWER.match(text) is not None)
    # GSM8K lines: the same cleaned answers; a "####" line of blanks only no longer yields a blank one
    old = [_clean(x) for x in OLD_GSM8K.findall(text)]
    assert [_clean(x) for x in _GSM8K_RE.findall(text)] == [x for x in old if x is not None]


@pytest.mark.parametrize(
    "text",
    [
        "#### a" + " " * 200_000 + "b",
        "#### " + " \t" * 100_000,
        "<answer>" * 100_000,
        "<answer>x" * 50_000 + "</answer>",
        "\\boxed $" * 50_000,
        "\\boxed{" * 100_000,
        "{" * 200_000 + "\\boxed{1" + "}" * 200_000,
        "\\" * 200_000,
        "9" * 1_000_000,
        "1," * 200_000,
        "**a" * 100_000,
        " " * 200_000 + "x",
        "</think>\n<answer>a</answer>" * 20_000 + "x",
        "</think> <answer>" * 50_000,
        "The answer is " * 50_000,
        "The answer to " * 50_000 + "x",
        "Answer:\n\n" * 50_000,
        "answer is $" * 50_000,
    ],
    ids=lambda t: repr(t[:12]) + f"..x{len(t)}",
)
def test_adversarial_megabyte_texts_are_linear(text):
    t0 = time.perf_counter()
    for last_number in (False, True):
        a = extract_answer(text, allow_last_number=last_number)
        if a is not None:
            normalize_answer(a[:10_000])
    format_reward([text], "boxed")
    format_reward([text], "think-answer")
    assert time.perf_counter() - t0 < TIMEOUT


# ---- the full reward function (math-verify in worker processes) -----------------------------------


@pytest.fixture(scope="module")
def reward() -> Iterator[Reward]:
    # No length cap: every extracted answer really goes through math-verify in a worker.
    v = MathVerifier(timeout=TIMEOUT, num_workers=2, max_answer_chars=None).start(wait=True)
    r = Reward("math", verifier=v, format_weight=0.1)
    yield r
    v.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_math_reward_never_raises_and_respects_the_limit(data, reward, marker):
    text = data.draw(completions(marker))
    gold = data.draw(st.sampled_from(GOLDS))
    reward.verifier.start(wait=True)  # a worker replaced after a timeout is ready again (not timed)
    t0 = time.perf_counter()
    (score,) = reward([text], [gold])
    elapsed = time.perf_counter() - t0
    assert score in (0.0, 0.1, 1.0, 1.1)
    assert elapsed < TIMEOUT + 1.0, f"{elapsed:.2f} s for {text[:200]!r}"
    assert not marker.exists()


def test_payloads_reach_the_workers_and_execute_nothing(reward, marker):
    """Every payload, boxed and bare, goes through math-verify's parsers: still 0 and nothing created."""
    before = reward.verifier.stats["verified"]
    texts = [
        p if p.startswith(("\\boxed", "<answer>", "####")) else f"\\boxed{{{p}}}" for p in payloads(marker)
    ]
    # wrong answers; a boxed one gets the format bonus only
    assert reward(texts, ["1"] * len(texts)) == [
        0.0 if t.startswith(("<answer>", "####")) else 0.1 for t in texts
    ]
    assert reward.verifier.stats["verified"] > before
    assert not marker.exists()


def test_gold_normalisation_of_odd_golds():
    # golds are data, not model output, but a huge or odd gold still normalises without raising
    assert normalize_golds("9" * 10_000) == ("9" * 10_000,)
    assert normalize_golds(["١٢٣", "1e308", "∞"]) == ("123", "1e308", "∞")  # unicode digits are digits

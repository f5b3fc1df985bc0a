"""reasoning-gym's own checkers as the reward (issue 30): `ReasoningGymVerifier` in `_rg_worker.py`
processes, the reward names "reasoning-gym[?options]" and "auto", and the run config's resolution."""

from __future__ import annotations

import importlib.util
import os

import pytest

from tokencredit.data import reasoning_gym as rgd
from tokencredit.errors import ConfigError
from tokencredit.rewards import (
    AutoVerifier,
    GymAnswer,
    MathVerifier,
    ReasoningGymVerifier,
    Reward,
    resolve_reward_function,
)
from tokencredit.rewards import reasoning_gym as rgr


def needs_gym(test):
    """Needs tokencredit[reasoning-gym]: skipped without it, run by `pytest -m extras`."""
    skip = pytest.mark.skipif(
        importlib.util.find_spec("reasoning_gym") is None, reason="needs tokencredit[reasoning-gym]"
    )
    return pytest.mark.extras(skip(test))


TIMEOUT = 10.0
SPEC = "reasoning-gym:chain_sum?min_terms=2&max_terms=3&max_digits=1"


@pytest.fixture(scope="module")
def problems():
    return rgd.load(SPEC, size=6)


@pytest.fixture(scope="module")
def verifier():
    v = ReasoningGymVerifier(timeout=TIMEOUT, num_workers=1).start(wait=True)
    yield v
    v.close()


def said(answer: str) -> str:
    return f"To solve this arithmetic problem, we add the numbers.\n\nThe final answer is: {answer}."


@needs_gym
def test_the_checker_judges_the_extracted_answer(verifier, problems):
    golds = [p.answer for p in problems]
    right = [said(g) for g in golds]
    assert verifier.score(right, golds) == [1.0] * len(golds)
    wrong = [said(int(g) + 1) for g in golds]
    assert verifier.score(wrong, golds) == [0.0] * len(golds)
    # SmolLM2's own style: bold, a box, an equation, an intermediate statement before the final one
    g = golds[0]
    styles = [
        f"So, the answer is **{g}**.",
        f"\\boxed{{{g}}}",
        f"The answer is {int(g) + 3}.\nAfter checking, Answer: {g}",
    ]
    assert verifier.score(styles, [g] * 3) == [1.0, 1.0, 1.0]


@needs_gym
def test_no_answer_scores_zero_without_a_worker_and_the_cache(verifier, problems):
    g = problems[1].answer
    before = dict(verifier.stats)
    assert verifier.score(["I do not know", ""], [g, g]) == [0.0, 0.0]
    assert (
        verifier.stats["verified"] == before["verified"]
        and verifier.stats["no_answer"] == before["no_answer"] + 2
    )
    assert verifier.score([said(g)] * 8, [g] * 8) == [1.0] * 8
    assert (
        verifier.stats["verified"] <= before["verified"] + 1
    )  # one job for the 8 identical answers (or a cache hit)
    assert verifier.score([said(g)], [g]) == [1.0]
    assert verifier.stats["cache_hits"] > before["cache_hits"]


@needs_gym
def test_partial_credit_and_last_number(problems):
    g = problems[2].answer
    gold_len = len(str(g))
    with ReasoningGymVerifier(
        timeout=TIMEOUT, num_workers=1, partial_credit=True, allow_last_number=True
    ) as v:
        # chain_sum's checker: a wrong number that contains the gold gets len(gold) / len(answer)
        (s,) = v.score([said(f"9{g}")], [g])
        assert s == pytest.approx(gold_len / (gold_len + 1))
        assert v.score([f"12 + 9 = {g}"], [g]) == [1.0]  # the last number, allowed here
        assert v.checker_scores([str(g), None], [g, g]) == [1.0, 0.0]
    with ReasoningGymVerifier(timeout=TIMEOUT, num_workers=1) as v:
        assert v.score([said(f"9{g}"), f"12 + 9 = {g}"], [g, g]) == [
            0.0,
            0.0,
        ]  # full marks only; no last number


@needs_gym
def test_golds_must_be_reasoning_gym_answers(verifier):
    with pytest.raises(ValueError, match="gold 0 .* is not a reasoning-gym problem's answer"):
        verifier.score([said("3")], ["3"])
    with pytest.raises(ValueError, match="got 1 completions but 2"):
        verifier.score([said("3")], ["3", "4"])


@needs_gym
def test_an_entry_that_does_not_match_its_problem_is_an_error(verifier, problems):
    g = problems[3].answer
    forged = GymAnswer(str(g), **{**g.ref, "question_sha256": "0" * 64})
    with pytest.raises(RuntimeError, match="differs from the problem it was generated as"):
        verifier.score([said(g)], [forged])
    bad = GymAnswer(str(g), **{**g.ref, "dataset": "no_such_dataset"})
    with pytest.raises(RuntimeError, match="cannot rebuild 'no_such_dataset'"):
        verifier.score([said(g)], [bad])
    assert verifier.score([said(g)], [g]) == [1.0]  # the pool is still usable


@needs_gym
def test_reward_names_and_the_auto_reward(problems):
    gym = problems[4].answer
    with Reward("reasoning-gym", timeout=TIMEOUT, num_workers=1) as r:
        assert isinstance(r.verifier, ReasoningGymVerifier)
        assert r([said(gym), said("1000")], [gym, gym]) == [1.0, 0.0]
    with Reward("reasoning-gym?partial_credit=true&last_number=1", timeout=TIMEOUT, num_workers=1) as r:
        assert r.verifier.partial_credit and r.verifier.allow_last_number
    with Reward("auto", timeout=TIMEOUT, num_workers=1) as r:
        assert isinstance(r.verifier, AutoVerifier)
        # one batch: a reasoning-gym problem by its checker, a math problem by math-verify
        v = r.verify(
            [said(gym), "\\boxed{\\frac{1}{2}}", said("999"), "\\boxed{0.4}"], [gym, "0.5", gym, "0.5"]
        )
        assert v.scores == [1.0, 1.0, 0.0, 0.0] and v.timed_out == [False] * 4
        assert r.verifier.stats["answers"] == 4
    for bad, msg in [
        ("reasoning-gym?partial=true", "unknown option 'partial'.*partial_credit"),
        ("reasoning-gym?partial_credit=maybe", "expected true/false"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            Reward(bad)


def test_missing_package_names_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "reasoning_gym" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"pip install 'tokencredit\[reasoning-gym\]'"):
        Reward("reasoning-gym")


def test_resolve_reward_function():
    assert resolve_reward_function("auto", ["toy", "toy"]) == "math"
    assert resolve_reward_function("auto", ["gsm8k_train", "math500,aime24"]) == "math"
    assert resolve_reward_function("auto", [SPEC, SPEC]) == "reasoning-gym"
    assert resolve_reward_function("auto", [SPEC, f"{SPEC},math500"]) == "auto"
    assert resolve_reward_function("math", [SPEC, SPEC]) == "math"  # an explicit choice is kept
    assert resolve_reward_function("mod:fn", [SPEC, SPEC]) == "mod:fn"


def test_run_config_records_the_reward_it_uses():
    from tokencredit.train.config import dump_toml, load_config

    assert load_config().reward.function == "math"
    cfg = load_config(sets=[f"data.train={SPEC}", f"data.eval={SPEC}", "data.template=chat"])
    assert cfg.data.train == SPEC and cfg.reward.function == "reasoning-gym"
    assert 'function = "reasoning-gym"' in dump_toml(cfg)
    assert load_config(sets=[f"data.train={SPEC}", "data.eval=math500"]).reward.function == "auto"
    assert (
        load_config(sets=[f"data.train={SPEC}", f"data.eval={SPEC}", "reward.function=math"]).reward.function
        == "math"
    )


def test_worker_script_is_standalone():
    src = open(rgr._WORKER_SCRIPT).read()
    imports = [ln for ln in src.split('"""', 2)[2].splitlines() if ln.startswith(("import ", "from "))]
    assert not [ln for ln in imports if "torch" in ln or "tokencredit" in ln]
    assert os.path.exists(rgr._WORKER_SCRIPT)


def test_math_verifier_is_unchanged_by_a_gym_pool():
    # the generalised pool still speaks the math protocol (booleans, not scores)
    with MathVerifier(timeout=TIMEOUT, num_workers=1) as v:
        assert v.judge(["\\frac{2}{4}", "3"], ["0.5", "4"]) == [True, False]

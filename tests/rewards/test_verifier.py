import os
import threading
import time

import pytest

from tokencredit.rewards import MathVerifier, extract_answer, last_boxed, math_reward, normalize_answer
from tokencredit.rewards.verifier import normalize_golds

TIMEOUT = 2.5
# (gold, answer) pairs that must verify / must not; also judged on a loaded machine (test_verifier_timeouts.py).
EQUIVALENT = [
    ("\\frac12", "0.5"),
    ("\\frac12", "1/2"),
    ("0.5", "\\frac{1}{2}"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\pi/2)"),
    ("142.0", "142"),
    ("142", "142.0"),
    ("\\{1,2,3\\}", "\\{3,2,1\\}"),
    ("(-2,1)", "(-2, 1)"),
    ("1,2,3", "3,2,1"),
    ("10,\\!080", "10080"),
    ("\\frac{\\sqrt{3}}{2}", "\\sqrt{3}/2"),
    ("x^2+1", "1+x^2"),
    ("(x+1)^2", "x^2+2x+1"),  # issue 22: judged wrong once by a cold worker on a loaded machine
]
WRONG = [
    ("\\frac12", "0.51"),
    ("142.0", "143"),
    ("(3,\\pi/2)", "(\\pi/2,3)"),
    ("\\{1,2\\}", "\\{1,3\\}"),
    ("5", "-5"),
]


@pytest.fixture(scope="module")
def verifier():
    # One warm pool for the whole module keeps these tests fast.
    v = MathVerifier(timeout=TIMEOUT, num_workers=2).start()
    v.score(["\\boxed{1}"], ["2"])  # wait until the workers are up
    yield v
    v.close()


def boxed(x: str) -> str:
    return f"Some reasoning first.\nSo the final answer is $\\boxed{{{x}}}$."


# ---- extraction -----------------------------------------------------------------------------


def test_last_boxed_balanced_and_escaped_braces():
    assert last_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}} end") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{\\{1,2\\}}") == "\\{1,2\\}"
    # A truncated last box falls back to the last complete one.
    assert last_boxed("\\boxed{3} and later \\boxed{\\frac{1}{") == "3"
    assert last_boxed("\\boxed 5$") == "5"
    assert last_boxed("no box here") is None


def test_extraction_order():
    assert extract_answer("#### 7\n\\boxed{8}") == "8"
    assert extract_answer("<think>x</think> <answer>42</answer>") == "42"
    assert extract_answer("so\n#### 1,234") == "1,234"
    assert extract_answer("I think it is 17") is None
    assert (
        extract_answer("the answer is 17") == "17"
    )  # an answer statement (issue 30), before the last number
    assert extract_answer("the answer is 17\n\\boxed{18}") == "18"  # an explicit box wins
    assert extract_answer("the answer is 17.", allow_last_number=True) == "17"
    assert extract_answer("The answer is **\\boxed{73}**") == "73"
    assert extract_answer("\\boxed{**73**}") == "73"


def test_normalize_answer_is_conservative():
    assert normalize_answer("142.0") == normalize_answer("142") == "142"
    assert normalize_answer("10,\\!080") == "10080"
    assert normalize_answer("\\left( 3, \\frac{\\pi}{2} \\right)") == "(3,\\frac{\\pi}{2})"
    assert normalize_answer("\\dfrac{1}{2}") == normalize_answer("\\frac{1}{2}")
    # A command followed by a letter keeps its space.
    assert normalize_answer("2 \\pi r") != normalize_answer("2\\pir")
    assert normalize_answer("0.5") != normalize_answer("\\frac12")


def test_normalize_golds_forms_and_errors():
    assert normalize_golds("142.0") == ("142",)
    assert normalize_golds(142.0) == ("142",)
    assert normalize_golds(["0.01", "0.02", "0.01"]) == ("0.01", "0.02")
    with pytest.raises(ValueError, match="gold 3: empty gold answer"):
        normalize_golds(["", " "], where="gold 3")
    with pytest.raises(ValueError, match="expected a string or a list"):
        normalize_golds(None)


# ---- verdicts -------------------------------------------------------------------------------


@pytest.mark.parametrize("gold, pred", EQUIVALENT)
def test_equivalent_forms_are_correct(verifier, gold, pred):
    assert verifier.score([boxed(pred)], [gold]) == [1.0]


@pytest.mark.parametrize("gold, pred", WRONG)
def test_wrong_answers_are_rejected(verifier, gold, pred):
    assert verifier.score([boxed(pred)], [gold]) == [0.0]


def test_no_answer_scores_zero_without_a_worker(verifier):
    before = dict(verifier.stats)
    assert verifier.score(["I think it is 5", ""], ["5", "5"]) == [0.0, 0.0]
    assert verifier.stats["verified"] == before["verified"]
    assert verifier.stats["no_answer"] == before["no_answer"] + 2


def test_bold_answers(verifier):
    comps = ["\\boxed{**73**}", "Final:\n#### **73**", "**Answer:** $\\boxed{73}$"]
    assert verifier.score(comps, ["73"] * 3) == [1.0, 1.0, 1.0]
    lenient = MathVerifier(timeout=TIMEOUT, num_workers=1, allow_last_number=True)
    try:
        assert lenient.score(["The answer is **73**."], ["73"]) == [1.0]
        assert lenient.stats["fast_path"] == 1  # equal strings need no worker process
    finally:
        lenient.close()


def test_list_golds(verifier):
    golds = [["0.01", "0.02"], ["6630.65", "6630"], ["1", "2"]]
    assert verifier.score([boxed("0.02"), boxed("6630"), boxed("3")], golds) == [1.0, 1.0, 0.0]


def test_fast_path_and_cache(verifier):
    before = dict(verifier.stats)
    assert verifier.score([boxed("142")], ["142.0"]) == [1.0]
    assert verifier.stats["fast_path"] == before["fast_path"] + 1
    assert verifier.stats["verified"] == before["verified"]
    # Same (gold, answer) 8 times: one verification, then cache hits.
    comps = [boxed("\\frac{6}{8}")] * 8
    assert verifier.score(comps, ["0.75"] * 8) == [1.0] * 8
    assert verifier.stats["verified"] == before["verified"] + 1
    assert verifier.score(comps[:2], ["0.75"] * 2) == [1.0, 1.0]
    assert verifier.stats["cache_hits"] >= before["cache_hits"] + 2


def test_length_mismatch_is_an_error(verifier):
    with pytest.raises(ValueError, match="2 completions but 1 gold"):
        verifier.score(["a", "b"], ["1"])


# ---- adversarial ----------------------------------------------------------------------------


def test_adversarial_answers_score_zero_in_bounded_time(verifier, tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    payload = f"__import__('os').system('touch {marker}')"
    answers = {
        "power tower": "\\boxed{9^{9^{9^{9}}}}",
        "power tower plain": "#### 9^9^9^9",
        "10k digits": "\\boxed{" + "7" * 10_000 + "}",
        "nested braces": "\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}",
        "os.system boxed": "\\boxed{" + payload + "}",
        "os.system raw": payload,
        "os.system answer": "#### " + payload,
    }
    # No length cap, so every answer really goes through the worker pool.
    monkeypatch.setattr(verifier, "max_answer_chars", None)
    timeouts = verifier.pool.timeouts
    for name, text in answers.items():
        t0 = time.monotonic()
        assert verifier.score([text], ["1"], timeout=2.0) == [0.0], name
        # bounded by the timeout plus a worker's replacement: the margin allows a loaded 2-core CI machine
        # (4.9 s seen there, 8.1 s once beside the other xdist worker's trainer runs), and still fails a
        # verdict that waits for the answer itself (minutes)
        assert time.monotonic() - t0 < 2.0 + 28.0, name
    assert verifier.pool.timeouts > timeouts  # the power tower / braces really hung a worker
    # A replaced worker comes back: normal answers still verify.
    assert verifier.score([boxed("1/2")], ["0.5"]) == [1.0]
    # The verdict is cached: the hanging answer does not cost the timeout twice.
    t0 = time.monotonic()
    assert verifier.score([answers["power tower"]], ["1"]) == [0.0]
    assert time.monotonic() - t0 < 0.5
    assert not marker.exists()
    assert list(tmp_path.iterdir()) == []


def test_length_cap_rejects_huge_answers_without_parsing(verifier):
    before = dict(verifier.stats)
    assert verifier.score(["\\boxed{" + "7" * 10_000 + "}"], ["7"]) == [0.0]
    assert verifier.stats["verified"] == before["verified"]


# ---- threads, module function, lifecycle ------------------------------------------------------


def test_200_verifications_from_a_worker_thread(verifier):
    comps = [boxed(f"\\frac{{{i}}}{{4}}") for i in range(200)]
    golds = [str(i / 4) if i % 3 else str(i / 4 + 1) for i in range(200)]
    out: dict = {}

    def work():
        try:
            out["scores"] = verifier.score(comps, golds)
        except BaseException as e:  # noqa: BLE001 - reported below
            out["error"] = e

    th = threading.Thread(target=work)
    th.start()
    th.join(120)
    assert "error" not in out, out.get("error")
    expected = [1.0 if i % 3 else 0.0 for i in range(200)]
    assert out["scores"] == expected


def test_math_reward_from_threads():
    results: list = [None, None]

    def work(j):
        results[j] = math_reward([boxed("\\frac{1}{2}"), boxed("3")], ["0.5", ["2", "4"]], timeout=3.0)

    threads = [threading.Thread(target=work, args=(j,)) for j in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [[1.0, 0.0], [1.0, 0.0]]


def test_close_stops_workers_and_restarts_on_use():
    v = MathVerifier(timeout=TIMEOUT, num_workers=1)
    assert v.score([boxed("\\frac{2}{4}")], ["0.5"]) == [1.0]
    procs = [w.proc for w in v.pool._workers]
    v.close()
    assert all(p.poll() is not None for p in procs)
    assert v.score([boxed("\\frac{3}{4}")], ["0.75"]) == [1.0]
    # A worker that died while idle (killed from outside) is replaced transparently.
    v.pool._workers[0].proc.kill()
    v.pool._workers[0].proc.wait()
    assert v.score([boxed("\\frac{5}{4}")], ["1.25"]) == [1.0]
    v.close()


def test_worker_that_cannot_start_is_a_clear_error(tmp_path, monkeypatch):
    from tokencredit.rewards import pool as vmod

    broken = tmp_path / "broken_worker.py"
    broken.write_text("import sys\nsys.exit(3)\n")
    monkeypatch.setattr(vmod, "_WORKER_SCRIPT", str(broken))
    v = MathVerifier(timeout=TIMEOUT, num_workers=1)
    with pytest.raises(RuntimeError, match="exited during start-up \\(exit code 3\\)"):
        v.score([boxed("\\frac{1}{4}")], ["0.25"])
    v.close()


def test_rejects_bad_timeout():
    with pytest.raises(ValueError, match="timeout"):
        MathVerifier(timeout=0)


def test_worker_script_is_standalone():
    # The worker script itself must not import tokencredit or torch (fast restarts, small surface).
    from tokencredit.rewards import pool as vmod

    src = open(vmod._WORKER_SCRIPT).read()
    assert "import torch" not in src and "tokencredit" not in src.split('"""', 2)[2]
    assert os.path.exists(vmod._WORKER_SCRIPT)

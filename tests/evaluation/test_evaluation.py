import json
from math import comb

import numpy as np
import pytest
import torch

from conftest import BYTE_EOS, BYTE_PAD, byte_tokenizer, tiny_qwen3
from tokencredit.cli import main
from tokencredit.data import Problem
from tokencredit.evaluation import (
    EvalSettings,
    avg_at_k,
    evaluate,
    evaluate_benchmarks,
    greedy_accuracy,
    majority_vote,
    markdown_table,
    mean_maj_at_k,
    mean_pass_at_k,
    mean_response_length,
    pass_at_k,
    powers_of_two,
)
from tokencredit.rewards import MathVerifier, Verification
from tokencredit.rollout import Rollouts, SamplingSettings

# ---- metrics ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n, c, k",
    [
        (1, 0, 1),
        (1, 1, 1),
        (4, 2, 2),
        (10, 3, 1),
        (10, 3, 5),
        (10, 0, 4),
        (10, 10, 3),
        (5, 1, 5),
        (64, 7, 16),
    ],
)
def test_pass_at_k_matches_closed_form(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)


def test_pass_at_k_hand_values_and_vector_form():
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)  # 1 - C(2,2)/C(4,2) = 1 - 1/6
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(3, 0, 2) == 0.0
    # Large n where the binomials themselves overflow float64: the product form stays exact.
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5)
    out = pass_at_k(np.array([4, 4, 4]), np.array([0, 1, 4]), 2)
    np.testing.assert_allclose(out, [0.0, 0.5, 1.0])
    correct = [[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]]
    assert mean_pass_at_k(correct, 2) == pytest.approx((5 / 6 + 0 + 0.5) / 3)
    assert mean_pass_at_k(correct, 1) == pytest.approx(avg_at_k(correct)) == pytest.approx(3 / 12)
    with pytest.raises(ValueError, match="at least 5 samples"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(4, 5, 1)


def test_maj_at_k_votes_and_ties():
    # Correct answers form one group even when written differently (verifier-equivalent).
    assert majority_vote(["\\frac12", "0.5", "3"], [True, True, False], 3) == 1.0
    # Wrong answers group by normalised string: "142" and "142.0" are one group of 2.
    assert majority_vote(["142.0", "142", "7"], [False, False, True], 3) == 0.0
    # Ties: expected accuracy of a uniform pick among the tied groups.
    assert majority_vote(["1", "2"], [True, False], 2) == 0.5
    assert majority_vote(["1", "2", "3"], [True, False, False], 3) == pytest.approx(1 / 3)
    assert majority_vote(["1", "1", "2", "2"], [True, True, False, False], 4) == 0.5
    assert majority_vote(["2", "2", "3", "3", "1"], [False, False, False, False, True], 5) == 0.0
    # Samples without an answer do not vote; no votes at all is 0.
    assert majority_vote([None, None, "5"], [False, False, True], 3) == 1.0
    assert majority_vote([None, None], [False, False], 2) == 0.0
    # Only the first k samples vote.
    assert majority_vote(["1", "2", "2"], [True, False, False], 1) == 1.0
    assert mean_maj_at_k([["1", "2"], ["3", "3"]], [[True, False], [True, True]], 2) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="maj@3"):
        majority_vote(["1"], [True], 3)


def test_small_metrics():
    assert greedy_accuracy([True, False, True, True]) == 0.75
    assert mean_response_length([3, 5]) == 4.0
    assert powers_of_two(1) == [1] and powers_of_two(8) == [1, 2, 4, 8] and powers_of_two(6) == [1, 2, 4, 6]
    with pytest.raises(ValueError):
        greedy_accuracy([])
    table = markdown_table(
        {
            "math500": {
                "metrics": {
                    "num_problems": 5.0,
                    "pass@2": 0.5,
                    "greedy_acc": 0.2,
                    "pass@1": 0.25,
                    "avg@2": 0.25,
                },
                "std": {"pass@2": 0.1},
            }
        }
    )
    lines = table.splitlines()
    assert lines[0] == "| benchmark | n | greedy | avg@2 | pass@1 | pass@2 |"
    assert lines[2] == "| math500 | 5 | 20.0 | 25.0 | 25.0 | 50.0 ± 10.0 |"


# ---- evaluate (scripted generations, real verifier) --------------------------------------------


def scripted_generate(scripts):
    """A stand-in for rollout.generate that returns fixed texts per prompt and sample."""

    def fake(model, tokenizer, prompts, num_samples=1, *, sampling, **kw):
        max_new_tokens = sampling.max_new_tokens
        texts = []
        for p in prompts:
            key = "greedy" if sampling.temperature == 0 else "sampled"
            texts += scripts[key][p][:num_samples]
        n = len(texts)
        lengths = torch.tensor([len(t) for t in texts])
        T = int(lengths.max())
        mask = torch.arange(T)[None, :] < lengths[:, None]
        return Rollouts(
            prompt_ids=torch.zeros(n, 1, dtype=torch.long),
            prompt_mask=torch.ones(n, 1, dtype=torch.bool),
            response_ids=torch.zeros(n, T, dtype=torch.long),
            response_mask=mask,
            truncated=lengths >= max_new_tokens,
            texts=texts,
            prompt_index=torch.arange(len(prompts)).repeat_interleave(num_samples),
            pad_token_id=0,
            eos_token_ids=(1,),
        )

    return fake


@pytest.fixture(scope="module")
def verifier():
    with MathVerifier(timeout=3.0, num_workers=1) as v:
        yield v


def test_evaluate_metrics_plumbing(monkeypatch, verifier):
    import tokencredit.rollout as rollout

    problems = [Problem("a", "P-A", "0.5"), Problem("b", "P-B", ["7", "8"])]
    scripts = {
        "greedy": {"P-A": ["\\boxed{1/2}"], "P-B": ["\\boxed{9}"]},
        "sampled": {
            "P-A": ["\\boxed{\\frac{1}{2}}", "\\boxed{3}", "\\boxed{3}", "\\boxed{0.5}"],
            "P-B": ["no answer", "\\boxed{8}", "\\boxed{6}", "\\boxed{6}"],
        },
    }
    monkeypatch.setattr(rollout, "generate", scripted_generate(scripts))
    sampling = SamplingSettings(temperature=1.0, top_p=1.0, max_new_tokens=100, batch_size=3)
    m = evaluate(
        None,
        None,
        problems,
        EvalSettings(samples=4, sampling=sampling, template="{problem}", seed=0),
        verifier=verifier,
        progress=False,
    )
    assert m["num_problems"] == 2 and m["greedy_acc"] == 0.5
    assert m["avg@4"] == pytest.approx(3 / 8)
    assert m["pass@1"] == pytest.approx(3 / 8)
    assert m["pass@2"] == pytest.approx(((1 - 1 / 6) + 0.5) / 2)  # c=2 and c=1 of n=4
    assert m["pass@4"] == 1.0
    # maj@4: A ties {1/2 x2} vs {3 x2} -> 0.5; B: {6 x2} beats {8} -> 0.
    assert m["maj@4"] == pytest.approx(0.25)
    assert m["maj@1"] == pytest.approx(0.5)
    lengths = [len(t) for p in ("P-A", "P-B") for t in scripts["sampled"][p]]
    assert m["mean_response_length"] == pytest.approx(np.mean(lengths))
    assert m["truncated_rate"] == 0.0


def test_evaluate_greedy_temperature_zero_repeats_the_greedy_answer(monkeypatch, verifier):
    import tokencredit.rollout as rollout

    scripts = {"greedy": {"Q": ["\\boxed{2}"]}, "sampled": {}}
    monkeypatch.setattr(rollout, "generate", scripted_generate(scripts))
    greedy = SamplingSettings(temperature=0.0, top_p=0.95, max_new_tokens=1024, batch_size=64)
    m = evaluate(
        None,
        None,
        [Problem("q", "Q", "2")],
        EvalSettings(samples=2, sampling=greedy, template="{problem}"),
        verifier=verifier,
    )
    assert m["greedy_acc"] == m["avg@2"] == m["pass@2"] == m["maj@2"] == 1.0


def test_timed_out_verifications_are_counted_not_averaged(monkeypatch):
    """Issue 22: answers the verifier could not judge in time are counted per benchmark (summed over
    the greedy pass, the samples and the seeds), apart from the accuracy columns."""
    import tokencredit.rollout as rollout

    class FirstAnswerTimesOut:
        def verify(self, texts, golds):
            return Verification([0.0] + [1.0] * (len(texts) - 1), [True] + [False] * (len(texts) - 1))

        def extract(self, text):
            return text

    scripts = {"greedy": {"Q": ["\\boxed{2}"]}, "sampled": {"Q": ["\\boxed{2}", "\\boxed{2}"]}}
    monkeypatch.setattr(rollout, "generate", scripted_generate(scripts))
    sampling = SamplingSettings(temperature=1.0, top_p=0.95, max_new_tokens=1024, batch_size=64)
    res = evaluate_benchmarks(
        None,
        None,
        {"b": [Problem("q", "Q", "2")]},
        [0, 1],
        EvalSettings(samples=2, sampling=sampling, template="{problem}"),
        verifier=FirstAnswerTimesOut(),
        progress=False,
    )
    # seed 0: greedy (1 answer, timed out) + samples (first timed out); seed 1: samples only
    assert [m["verify_timeouts"] for m in res["b"]["per_seed"]] == [2.0, 1.0]
    assert res["b"]["verify_timeouts"] == 3
    assert "verify_timeouts" not in res["b"]["metrics"] and "verify_timeouts" not in res["b"]["std"]
    assert res["b"]["metrics"]["avg@2"] == 0.5  # a timed-out answer counts as wrong
    assert "verify_timeouts" not in markdown_table(res)


def test_greedy_only_with_several_seeds_runs_once(monkeypatch):
    """`eval --samples 0 --seed 0,1`: the greedy answer does not depend on the seed, so it is evaluated once
    (this used to fail on the second seed, which had nothing left to evaluate)."""
    import tokencredit.rollout as rollout

    calls = []
    scripted = scripted_generate({"greedy": {"Q": ["\\boxed{2}"]}})

    def counting(*args, **kwargs):
        calls.append(1)
        return scripted(*args, **kwargs)

    monkeypatch.setattr(rollout, "generate", counting)
    res = evaluate_benchmarks(
        None,
        None,
        {"b": [Problem("q", "Q", "2")]},
        [0, 1],
        EvalSettings(samples=0, template="{problem}"),
        verifier=MathVerifier(),
        progress=False,
    )
    assert len(calls) == 1 and len(res["b"]["per_seed"]) == 1 and "std" not in res["b"]
    assert res["b"]["metrics"]["greedy_acc"] == 1.0


# ---- end to end: tokencredit eval on a tiny random model ---------------------------------------


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    tok = byte_tokenizer()
    cfg = {
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
        "eos_token_id": BYTE_EOS,
        "pad_token_id": BYTE_PAD,
    }
    model = tiny_qwen3(len(tok), **cfg)
    d = tmp_path_factory.mktemp("tiny_model")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def test_cli_eval_end_to_end(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "res" / "eval.json"
    argv = ["eval", "--model", str(tiny_model_dir), "--bench", "math500", "--limit", "5", "--samples", "2"]
    rc = main(argv + ["--max-new-tokens", "4", "--seed", "3", "--out", str(out), "--device", "cpu"])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["settings"]["template"] == "qwen-math" and res["settings"]["max_new_tokens"] == 4
    assert res["settings"]["timeout"] == 5.0 and res["settings"]["retry_timeouts"] is True
    assert res["results"]["math500"]["verify_timeouts"] == 0
    metrics = res["results"]["math500"]["metrics"]
    assert metrics["num_problems"] == 5
    for key in (
        "greedy_acc",
        "avg@2",
        "pass@1",
        "pass@2",
        "maj@1",
        "maj@2",
        "mean_response_length",
        "truncated_rate",
    ):
        assert 0.0 <= metrics[key] <= (4 if key == "mean_response_length" else 1), key
    assert 1 <= metrics["mean_response_length"] <= 4
    printed = capsys.readouterr().out
    assert "math500" in printed and "pass@2" in printed and "temperature=0.6" in printed
    assert (
        "verifier timeouts (limit 5 s, retried with 20 s; a timed-out answer counts as wrong): math500 0"
        in printed
    )


def test_cli_eval_errors(capsys):
    assert main(["eval", "--model", "toy", "--bench", "math5000"]) == 2
    assert "unknown benchmark 'math5000'" in capsys.readouterr().err
    assert main(["eval", "--model", "x", "--seed", "a,b"]) == 2


def test_eval_settings_are_checked(capsys):
    from tokencredit.errors import ConfigError

    s = EvalSettings()
    assert (s.samples, s.template, s.seed, s.greedy) == (4, "qwen-math", 0, True)
    assert s.sampling == SamplingSettings(temperature=0.6, top_p=0.95, max_new_tokens=1024, batch_size=64)
    with pytest.raises(ValueError, match="samples must be >= 0"):
        EvalSettings(samples=-1)
    with pytest.raises(ValueError, match="nothing to evaluate"):
        EvalSettings(samples=0, greedy=False)
    with pytest.raises(ConfigError, match="unknown prompt template"):
        EvalSettings(template="nope")
    with pytest.raises(ValueError, match="no problems"):
        evaluate(None, None, [], s)
    # the command names the option
    assert main(["eval", "--model", "x", "--top-p", "1.5"]) == 2
    assert "--top-p must be in (0, 1], got 1.5" in capsys.readouterr().err
    assert main(["eval", "--model", "x", "--batch-size", "0"]) == 2
    assert "--batch-size must be >= 1, got 0" in capsys.readouterr().err


def test_cli_eval_toy_model(tmp_path):
    models = pytest.importorskip("tokencredit.models")
    if not (models.TOY_ASSET_DIR / "model.safetensors").is_file():
        pytest.skip("the toy model asset is not built in this checkout")
    out = tmp_path / "toy.json"
    argv = [
        "eval",
        "--model",
        "toy",
        "--bench",
        "math500",
        "--limit",
        "2",
        "--samples",
        "2",
        "--max-new-tokens",
        "4",
    ]
    assert main(argv + ["--out", str(out), "--no-progress"]) == 0
    assert json.loads(out.read_text())["results"]["math500"]["metrics"]["num_problems"] == 2

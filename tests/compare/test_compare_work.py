"""compare's work column: the whole compute of a run in forward-token equivalents, the critic's share counted."""

from __future__ import annotations

import json

import pytest
from test_compare import fake_run

from tokencredit.compare import aggregate, markdown, read_run
from tokencredit.compare.aggregate import work_tokens


def _with_passes(d, steps):
    """Rewrite a fake run's step records with the trainer's pass counts."""
    lines = (d / "metrics.jsonl").read_text().splitlines()
    out = []
    i = 0
    for line in lines:
        rec = json.loads(line)
        if rec.get("type") != "eval" and i < len(steps):
            rec |= steps[i]
            i += 1
        out.append(json.dumps(rec))
    (d / "metrics.jsonl").write_text("\n".join(out) + "\n")
    return d


def test_work_counts_generation_policy_and_critic_passes(tmp_path):
    steps = [
        {"generated_tokens": 100, "policy/forward_tokens": 300, "policy/backward_tokens": 150},
        {
            "generated_tokens": 50,
            "policy/forward_tokens": 200,
            "policy/backward_tokens": 100,
            "critic/forward_tokens": 400,
            "critic/backward_tokens": 300,
        },
    ]
    d = _with_passes(fake_run(tmp_path, "grpo", 0, [(20, 0.5)]), steps)
    total, critic = work_tokens(read_run(d))
    assert critic == 400 + 2 * 300
    assert total == 100 + 300 + 2 * 150 + 50 + 200 + 2 * 100 + critic


def test_old_runs_have_no_work_figure(tmp_path):
    d = fake_run(tmp_path, "grpo", 0, [(20, 0.5)])
    assert work_tokens(read_run(d)) == (None, 0)
    res = aggregate([read_run(d)])
    assert res["recipes"][0]["work_tokens"]["mean"] is None
    assert "| n/a |" in markdown(res, "x")


def test_the_table_shows_the_critics_share(tmp_path):
    dirs = []
    for seed in (0, 1):
        dirs.append(
            _with_passes(
                fake_run(tmp_path / "g", "grpo", seed, [(20, 0.5)]),
                [{"generated_tokens": 100, "policy/forward_tokens": 100, "policy/backward_tokens": 100}] * 2,
            )
        )
        dirs.append(
            _with_passes(
                fake_run(tmp_path / "p", "ppo", seed, [(20, 0.5)]),
                [
                    {
                        "generated_tokens": 100,
                        "policy/forward_tokens": 100,
                        "policy/backward_tokens": 100,
                        "critic/forward_tokens": 200,
                        "critic/backward_tokens": 100,
                    }
                ]
                * 2,
            )
        )
    res = aggregate([read_run(d) for d in dirs], baseline="grpo")
    by = {g["label"]: g for g in res["recipes"]}
    assert by["grpo"]["work_tokens"]["mean"] == pytest.approx(2 * 400)
    assert by["ppo"]["work_tokens"]["mean"] == pytest.approx(2 * 800)
    assert by["ppo"]["critic_work_tokens"]["mean"] == pytest.approx(2 * 400)
    page = markdown(res, "x")
    assert "1600 ± 0 (critic 50%)" in page and "| 800 ± 0 |" in page

"""examples/custom_reward.py, the worked example of docs/inputs.md: its rewards, and a training step
that scores its rollouts with it through `reward.function = "custom_reward:boxed_match"` (in the
reward's worker process)."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest

from conftest import _train_with_recording_example
from tokencredit.rewards import Reward

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SPEC = "custom_reward:boxed_match"


@pytest.fixture
def example_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))  # what PYTHONPATH=examples does for the command line


def test_the_example_rewards(example_on_path):
    completions = ["so \\boxed{72}", "\\boxed{1,234}", "\\boxed{7}", "72", "\\boxed{x^2}"]
    golds = ["72", 1234, ["70", "71"], "72", ["2x", "x^2"]]
    with Reward(SPEC) as reward:
        assert reward(completions, golds) == [1.0, 1.0, 0.1, 0.0, 1.0]


# `custom_reward` as the trainer's worker process imports it: the example itself, each call recorded
RECORDING_EXAMPLE = """
import importlib.util, json, os

_spec = importlib.util.spec_from_file_location("_the_example", os.environ["EXAMPLE_FILE"])
_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_example)


def boxed_match(completions, golds, **kwargs):
    rewards = _example.boxed_match(completions, golds, **kwargs)
    with open(os.environ["CALLS_LOG"], "a") as f:
        f.write(json.dumps([completions, golds, kwargs, rewards, os.getpid()]) + "\\n")
    return rewards
"""


def test_a_training_step_scores_its_rollouts_with_the_example(
    example_on_path, tiny_model_dir, tmp_path, monkeypatch
):
    # The function runs in a worker process (with this process's sys.path), so it is recorded there: a
    # module of the same name ahead of examples/ on the path wraps the example and logs each call.
    calls = _train_with_recording_example(tmp_path, monkeypatch, RECORDING_EXAMPLE, SPEC, tiny_model_dir)
    # prompts_per_step x group_size completions (not the start-up check's 2)
    rollouts = [c for c in calls if len(c[0]) == 2 * 4]
    assert len(rollouts) == 1, f"the trainer called the reward on {[len(c[0]) for c in calls]} completions"
    completions, golds, kwargs, rewards, pid = rollouts[0]
    assert len(golds) == len(completions) and kwargs == {}
    assert all(isinstance(c, str) for c in completions) and all(isinstance(g, str) for g in golds)
    assert pid != os.getpid() and len({c[4] for c in calls}) == 1  # one worker, the function loaded once
    saved = tomllib.loads((tmp_path / "run" / "config.toml").read_text())
    assert saved["reward"]["function"] == SPEC
    step = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert step["step"] == 1 and step["reward"] == pytest.approx(sum(rewards) / len(rewards))
    assert step["verify_timeouts"] == 0

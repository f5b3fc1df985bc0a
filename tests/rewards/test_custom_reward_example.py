"""examples/custom_reward.py, the worked example of docs/inputs.md: its rewards, and a training step
that scores its rollouts with it through `reward.function = "custom_reward:boxed_match"`."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from conftest import _micro_sets
from tokencredit.rewards import Reward
from tokencredit.train.config import load_config
from tokencredit.train.trainer import Trainer

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


def test_a_training_step_scores_its_rollouts_with_the_example(example_on_path, tiny_model_dir, tmp_path, monkeypatch):
    import custom_reward

    calls, example = [], custom_reward.boxed_match

    def recorded(completions, golds, **kwargs):
        rewards = example(completions, golds, **kwargs)
        calls.append((list(completions), list(golds), kwargs, rewards))
        return rewards

    monkeypatch.setattr(custom_reward, "boxed_match", recorded)  # the trainer looks it up by name
    cfg = load_config(sets=_micro_sets(tiny_model_dir, steps=1) + [f"reward.function={SPEC}"], recipe="grpo")
    Trainer(cfg, tmp_path / "run").fit()
    rollouts = [c for c in calls if len(c[0]) == 2 * 4]  # prompts_per_step x group_size (not a start-up check)
    assert len(rollouts) == 1, f"the trainer called the custom reward on {[len(c[0]) for c in calls]} completions"
    completions, golds, kwargs, rewards = rollouts[0]
    assert len(golds) == len(completions) and kwargs == {}
    assert all(isinstance(c, str) for c in completions) and all(isinstance(g, str) for g in golds)
    saved = tomllib.loads((tmp_path / "run" / "config.toml").read_text())
    assert saved["reward"]["function"] == SPEC
    step = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert step["step"] == 1 and step["reward"] == pytest.approx(sum(rewards) / len(rewards))

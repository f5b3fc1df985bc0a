"""`tokencredit train`'s set-up: --resume on a directory that is not a run, and the start-up checks made
before the first evaluation (a user reward function's output, a model without a chat template)."""

from __future__ import annotations

import json
import shutil

import pytest

from tokencredit import cli
from tokencredit.train.config import dump_toml, load_config
from tokencredit.train.trainer import Trainer

BAD_REWARDS = """
def returns_float(completions, golds, **kw):
    return 1.0
"""


def _run_dir(path):
    path.mkdir(parents=True)
    (path / "config.toml").write_text(dump_toml(load_config()))
    return path


def test_resume_a_missing_directory_says_so_and_names_the_closest_run(tmp_path, capsys):
    runs = tmp_path / "runs"
    _run_dir(runs / "grpo-s0")
    (runs / "notes").mkdir()  # not a run: never suggested
    assert cli.main(["train", "--resume", str(runs / "grpo-s1")]) == 2
    err = capsys.readouterr().err
    assert (
        f"--resume {runs / 'grpo-s1'}: the directory does not exist; did you mean {runs / 'grpo-s0'}?" in err
    )
    assert "config.toml" not in err
    assert cli.main(["train", "--resume", str(runs / "zzzzzz")]) == 2
    assert (
        capsys.readouterr().err.rstrip().endswith(f"--resume {runs / 'zzzzzz'}: the directory does not exist")
    )
    assert cli.main(["train", "--resume", str(tmp_path / "nowhere" / "run")]) == 2
    assert "the directory does not exist" in capsys.readouterr().err
    assert cli.main(["train", "--resume", str(runs / "notesx")]) == 2  # only "notes" is close: not a run
    assert "did you mean" not in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli.main(["train", "--resume", str(tmp_path / "empty" / "x")]) == 2
    assert f"({tmp_path / 'empty'} holds no run directory)" in capsys.readouterr().err
    # an existing directory that is not a run, and a file
    assert cli.main(["train", "--resume", str(runs / "notes")]) == 2
    assert "no config.toml there (not a tokencredit run directory)" in capsys.readouterr().err
    (runs / "f.txt").write_text("x")
    assert cli.main(["train", "--resume", str(runs / "f.txt")]) == 2
    assert "not a directory" in capsys.readouterr().err


@pytest.fixture
def fit_calls(monkeypatch, capsys):
    """Replace `Trainer.fit` by a stub: the list of what had been printed (stdout and stderr, white space
    collapsed) each time it was called; training and every evaluation start inside fit."""
    calls: list[str] = []

    def printed_so_far(self):
        out = capsys.readouterr()
        calls.append(" ".join((out.out + out.err).split()))
        return {}

    monkeypatch.setattr(Trainer, "fit", printed_so_far)
    monkeypatch.setenv("COLUMNS", "400")  # rich folds a word longer than the width: a long tmp path, mid-name
    return calls


def test_a_wrong_reward_function_stops_before_any_evaluation(
    tiny_model_dir, micro_sets, tmp_path, monkeypatch, capsys, fit_calls
):
    (tmp_path / "bad_rewards_mod.py").write_text(BAD_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    sets = micro_sets(
        tiny_model_dir, **{"eval.at_start": "true", "reward.function": "bad_rewards_mod:returns_float"}
    )
    argv = ["train", "--recipe", "grpo", "--out", str(tmp_path / "run")] + [
        x for s in sets for x in ("--set", s)
    ]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "reward.function = 'bad_rewards_mod:returns_float' failed its start-up check" in err
    assert "returned 1.0 (float), expected a list of 2 floats" in err
    assert fit_calls == []  # stopped before fit(): no start-of-run evaluation, no step
    metrics = tmp_path / "run" / "metrics.jsonl"
    assert not metrics.exists() or '"type": "eval"' not in metrics.read_text()


def test_a_model_without_a_chat_template_is_warned_about_before_training(
    tiny_model_dir, micro_sets, tmp_path, fit_calls
):
    plain = tmp_path / "plain-model"
    shutil.copytree(tiny_model_dir, plain)
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    for model, warned in ((tiny_model_dir, False), (str(plain), True)):
        sets = micro_sets(model, **{"data.template": "qwen-math"})
        argv = ["train", "--recipe", "grpo", "--out", str(tmp_path / f"run-{warned}")] + [
            x for s in sets for x in ("--set", s)
        ]
        assert cli.main(argv) == 0
        printed = fit_calls[-1]  # up to the moment training would start
        assert ("has no chat template, so data.template='qwen-math' falls back" in printed) is warned
        if warned:
            assert (
                "warning: model" in printed
                and "plain-model" in printed
                and "use data.template=r1-zero" in printed
            )

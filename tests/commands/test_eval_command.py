"""`tokencredit eval` on the embedded toy tasks (--bench toy / toy-hard) and on a run directory: by default
the run's final model on the run's own evaluation data, with the numbers its trainer recorded."""

from __future__ import annotations

import json
import shutil

import pytest

from tokencredit import cli, models
from tokencredit.errors import ConfigError
from tokencredit.evaluation import load_benchmark
from tokencredit.tasks import load_problems_for
from tokencredit.train.config import DataConfig, load_config
from tokencredit.train.trainer import Trainer

pytestmark = pytest.mark.skipif(
    not (models.TOY_ASSET_DIR / "model.safetensors").is_file(),
    reason="the toy model asset is not built in this checkout",
)


def test_toy_benchmarks_are_the_trainers_heldout_problems(tmp_path, capsys):
    # the problems of data.eval = "toy" / "toy-hard" at the trainer's defaults, the first --limit of them
    assert load_benchmark("toy", 5, DataConfig()) == load_problems_for("toy", DataConfig(), "heldout")[:5]
    assert load_benchmark("toy-hard", None, DataConfig()) == load_problems_for(
        "toy-hard", DataConfig(), "heldout"
    )
    assert len(load_benchmark("toy", None, DataConfig())) == DataConfig().eval_size
    with pytest.raises(ConfigError, match="embedded task's settings"):
        load_benchmark("toy", 5)
    harder = DataConfig(difficulty=5, digits=3)
    assert load_benchmark("toy", 3, harder) == load_problems_for("toy", harder, "heldout")[:3]

    out = tmp_path / "toy.json"
    argv = [
        "eval",
        "--model",
        "toy",
        "--bench",
        "toy,toy-hard",
        "--limit",
        "8",
        "--samples",
        "0",
        "--no-progress",
    ]
    assert cli.main(argv + ["--max-new-tokens", "100", "--out", str(out)]) == 0
    res = json.loads(out.read_text())["results"]
    assert [res[b]["metrics"]["num_problems"] for b in ("toy", "toy-hard")] == [8, 8]
    assert res["toy"]["metrics"]["greedy_acc"] > 0  # the warm start solves some of its own task's problems
    assert "has no chat template" not in capsys.readouterr().err  # the toy tokenizer has one

    assert cli.main(["eval", "--model", "toy", "--bench", "toyy"]) == 2
    err = capsys.readouterr().err
    assert (
        "unknown benchmark 'toyy'; available: toy, toy-hard, toy-free, toy-tail-32, toy-tail-128, math500"
        in err
        and "(closest: toy, toy-hard" in err
    )


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """A finished one-step run of the toy model whose only evaluation is the final one (greedy and 2
    samples on 12 held-out problems)."""
    run = tmp_path_factory.mktemp("runs") / "toy-run"
    sets = [
        "run.steps=1",
        "run.progress=false",
        "rollout.prompts_per_step=2",
        "rollout.group_size=4",
        "data.train_size=20",
        "data.eval_size=12",
        "eval.samples=2",
        "eval.at_start=false",
        "eval.every=0",
        "checkpoint.every=0",
        "eval.save_groups=1",
    ]
    Trainer(load_config(sets=sets, recipe="grpo"), run).fit()
    return run


def test_a_run_directory_is_scored_on_its_own_data_as_its_trainer_scored_it(toy_run, tmp_path, capsys):
    last = [json.loads(x) for x in (toy_run / "metrics.jsonl").read_text().splitlines() if '"eval"' in x][-1]
    out = tmp_path / "run.json"
    assert cli.main(["eval", "--model", str(toy_run), "--no-progress", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert list(res["results"]) == ["toy"] and res["settings"]["run"] == str(toy_run)
    got = res["results"]["toy"]["metrics"]
    assert got["num_problems"] == 12
    # The same final model, problems, template, token limit, batch size, dtype and evaluation seed as the
    # trainer's evaluation: the greedy accuracy, and the sampled metrics too, are the same numbers.
    assert got["greedy_acc"] == last["eval_greedy_accuracy"]
    assert got["avg@2"] == last["eval_avg_at_k"] and got["mean_response_length"] == last["eval_mean_length"]
    # one metrics.jsonl key (one tracker tag) per quantity
    assert not {"eval_greedy_acc", "eval_avg@2", "eval_mean_response_length"} & set(last)
    for key in ("pass@2", "maj@2", "truncated_rate"):
        assert got[key] == last[f"eval_{key}"], key
    s = res["settings"]
    assert (s["template"], s["max_new_tokens"], s["samples"], s["temperature"]) == ("qwen-math", 80, 2, 1.0)
    printed = " ".join(capsys.readouterr().out.split())
    assert f"run {toy_run}: its final model" in printed

    # an explicit --bench overrides the run's data (the toy task at the run's difficulty and digits)
    assert (
        cli.main(
            [
                "eval",
                "--model",
                str(toy_run),
                "--bench",
                "toy",
                "--limit",
                "3",
                "--samples",
                "0",
                "--no-progress",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert json.loads(out.read_text())["results"]["toy"]["metrics"]["num_problems"] == 3


def test_an_unfinished_run_directory_is_named(toy_run, tmp_path, capsys):
    run = tmp_path / "unfinished"
    shutil.copytree(toy_run, run, ignore=shutil.ignore_patterns("final"))
    assert cli.main(["eval", "--model", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"the run has no final model ({run / 'final'} is missing" in err
    assert f"tokencredit train --resume {run}" in err

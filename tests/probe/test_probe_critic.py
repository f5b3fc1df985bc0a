"""`tokencredit probe --critic RUN`: a ppo run's trained critic fills `values` on the probe's rollouts, so the
ppo column is scored against the checker and A* like every other column; without it the column is n/a saying
why; a probed model of another tokenizer is refused in one line."""

from __future__ import annotations

import json

import pytest

from conftest import TOY_REWARDS_DIR, _micro_sets, byte_tokenizer, tiny_qwen3
from tokencredit import cli
from tokencredit.train.config import load_config
from tokencredit.train.trainer import Trainer

TOY_SMALL = ["--model", "toy", "--groups", "3", "--group-size", "4", "--random-draws", "2", "--threads", "1"]


@pytest.fixture(scope="module")
def ppo_run(tiny_model_dir, tmp_path_factory):
    """A micro run trained 2 steps with ppo on the tiny model (the toy tokenizer, which the toy warm start shares)."""
    run = tmp_path_factory.mktemp("ppo") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(TOY_REWARDS_DIR))
        Trainer(load_config(sets=_micro_sets(tiny_model_dir, 2), recipe="ppo"), run).fit()
    return run


def _probe(tmp_path, name, args):
    out = tmp_path / f"{name}.json"
    assert cli.main(["probe", "--out", str(out)] + args) == 0
    return json.loads(out.read_text()), out.with_suffix(".md").read_text()


def test_probe_scores_the_critics_column(ppo_run, tmp_path):
    data, md = _probe(
        tmp_path, "c", TOY_SMALL + ["--methods", "grpo,ppo", "--critic", str(ppo_run), "--oracle", "2"]
    )
    assert f"--critic {ppo_run}" in data["command"]
    pt = data["points"][0]
    assert pt["methods"]["ppo"]["status"] == "ok" and pt["methods"]["ppo"]["blame_rollouts"] > 0
    sec = pt["oracle"]
    assert sec["status"] == "ok", sec
    row = sec["methods"]["ppo"]
    assert row["status"] == "ok" and -1 <= row["spearman"] <= 1  # token fidelity against A*
    assert "grad_cos_oracle" in row  # the gradient fidelity
    assert "signal_share" in sec["gradients"]["expected"]["credits"]["ppo"]  # the signal share
    assert "| ppo |" in md


def test_probe_without_a_critic_is_na_with_the_reason(tmp_path):
    data, md = _probe(tmp_path, "n", TOY_SMALL + ["--methods", "grpo,bpco"])
    row = data["points"][0]["methods"]["bpco"]
    assert (
        row["status"] == "n/a" and "needs a trained critic" in row["reason"] and "--critic" in row["reason"]
    )


def test_probe_refuses_a_critic_of_another_tokenizer(ppo_run, tmp_path, capsys):
    other = tmp_path / "bytes"
    tok = byte_tokenizer()
    tiny_qwen3(len(tok)).save_pretrained(other)
    tok.save_pretrained(other)
    args = [
        "probe",
        "--model",
        str(other),
        "--methods",
        "ppo",
        "--critic",
        str(ppo_run),
        "--out",
        str(tmp_path / "x.json"),
    ]
    assert cli.main(args + TOY_SMALL[2:]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "another tokenizer than the probed model" in err[-1]
    grpo_run = tmp_path / "nocritic"
    assert cli.main(["probe", "--model", "toy", "--critic", str(grpo_run)] + TOY_SMALL[2:]) == 2
    assert "not a tokencredit run directory" in capsys.readouterr().err

"""`tokencredit compare` for a fair shoot-out (issue 32): the validation split (`data.eval_split`), extra
rows with their own overrides (`--arm`), and a learning rate per row chosen on the validation split
(`--tune-lr`): the split's problems, the flags' errors, the choice as a pure function, and tiny
end-to-end comparisons on the tiny random model."""

from __future__ import annotations

import argparse
import json
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from tokencredit import cli
from tokencredit.commands import compare as compare_cmd
from tokencredit.compare import plan_runs
from tokencredit.compare.plan import parse_arm
from tokencredit.compare.tune import TuneScore, choose_lrs, parse_lrs, tune_result, tune_seeds
from tokencredit.data.synthetic import ArithmeticTask
from tokencredit.errors import ConfigError, TrainingError
from tokencredit.tasks import load_problems_for
from tokencredit.train.config import DataConfig, TrainConfig, load_config, validate_config

REWARDS_DIR = Path(__file__).resolve().parent  # `_compare_rewards` (imported by the trainer by name)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    compare_cmd.add_arguments(p)
    return p.parse_args(argv)


def micro_argv(model_dir: str, out: Path, *extra: str, recipes: str = "grpo", seeds: str = "0") -> list[str]:
    """A comparison of one-step runs on the tiny model, evaluated at the start and the end."""
    sets = [
        f"model.name={model_dir}",
        "run.steps=1",
        "run.progress=false",
        "run.threads=1",
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=8",
        "data.train_size=20",
        "data.eval_size=3",
        "data.difficulty=1",
        "eval.every=0",
        "eval.samples=0",
        "eval.save_groups=0",
        "checkpoint.every=1",
        "reward.function=_compare_rewards:has_digit_seven",
        "optim.warmup_steps=0",
    ]
    argv = ["--recipes", recipes, "--seeds", seeds, "--target", "0.0", "--out", str(out)]
    for s in sets:
        argv += ["--set", s]
    return argv + list(extra)


# ------------------------------------------------------------------------------------------ validation split
@pytest.mark.parametrize("spec", ["toy", "toy-hard"])
def test_validation_problems_are_disjoint_and_deterministic(spec):
    data = DataConfig(train_size=60, eval_size=25, difficulty=2)
    train = load_problems_for(spec, data, "train")
    held = load_problems_for(spec, data, "heldout")
    val = load_problems_for(spec, data, "validation")
    assert len(train) == 60 and len(val) == 25
    texts = {p.problem for p in val}
    assert len(texts) == 25
    assert not texts & {p.problem for p in train} and not texts & {p.problem for p in held}
    assert val == load_problems_for(spec, data, "validation")  # deterministic
    if spec == "toy":  # the training split's problems after the run's first train_size
        assert val == ArithmeticTask(difficulty=2, digits=2).sample(85, "train")[60:]
    # more training problems: the validation problems move on, still after the trained ones
    bigger = load_problems_for(spec, replace(data, train_size=70), "validation")
    assert not {p.problem for p in bigger} & {
        p.problem for p in load_problems_for(spec, replace(data, train_size=70), "train")
    }


def test_reasoning_gym_validation_is_a_third_seed_range():
    pytest.importorskip("reasoning_gym")
    from tokencredit.data import reasoning_gym as rgd

    spec = "reasoning-gym:chain_sum?min_terms=2&max_terms=3&max_digits=1"
    data = DataConfig(train_size=30, eval_size=30)
    seeds = {
        split: {p.answer.config["seed"] + p.answer.index for p in load_problems_for(spec, data, split)}
        for split in ("train", "heldout", "validation")
    }
    assert min(seeds["validation"]) == rgd.VALIDATION_SEED_OFFSET
    assert not seeds["validation"] & seeds["train"] and not seeds["validation"] & seeds["heldout"]
    with pytest.raises(ConfigError, match="unknown split 'dev'"):
        rgd.load(spec, split="dev", size=3)


def test_eval_split_errors_name_the_field(tmp_path):
    f = tmp_path / "val.jsonl"
    f.write_text('{"problem": "1 + 1?", "answer": 2}\n')
    data = DataConfig(eval=str(f), eval_split="validation")
    with pytest.raises(
        ConfigError, match=r'data.eval_split = "validation" needs a toy task or reasoning-gym .*data.eval'
    ):
        load_problems_for(str(f), data, "validation")
    with pytest.raises(ConfigError, match="needs a toy task"):
        load_problems_for("math500", data, "validation")
    assert len(load_problems_for(str(f), data, "heldout")) == 1  # a file is fine as the held-out split
    cfg = TrainConfig()
    cfg.data.eval_split = "validaton"
    with pytest.raises(
        ConfigError, match=r"data.eval_split must be heldout or validation.*closest: validation"
    ):
        validate_config(cfg)
    assert load_config(sets=["data.eval_split=validation"]).data.eval_split == "validation"
    small = DataConfig(difficulty=1, digits=1, train_size=50, eval_size=60)  # 72 one-digit training problems
    with pytest.raises(ConfigError, match="lower data.train_size or data.eval_size"):
        load_problems_for("toy", small, "validation")


def test_a_validation_run_evaluates_the_validation_problems(tiny_model_dir, tmp_path, monkeypatch):
    from tokencredit.train.trainer import Trainer

    monkeypatch.syspath_prepend(str(REWARDS_DIR))
    sets = [
        f"model.name={tiny_model_dir}",
        "data.train_size=20",
        "data.eval_size=3",
        "data.difficulty=1",
        "reward.function=_compare_rewards:has_digit_seven",
        "algo.recipe=grpo",
    ]
    cfg = load_config(sets=[*sets, "data.eval_split=validation"])
    trainer = Trainer(cfg, tmp_path / "run")
    assert trainer.eval_problems == load_problems_for("toy", cfg.data, "validation")
    trainer.reward_fn.close()


# ------------------------------------------------------------------------------------------ --arm
def test_arm_parsing_and_errors():
    arm = parse_arm("grpo-matched=grpo:rollout.group_size=96")
    assert (arm.label, arm.recipe, arm.sets) == ("grpo-matched", "grpo", ("rollout.group_size=96",))
    # a recipe name with ':' and a list value with commas stay whole
    arm = parse_arm("lo=recipe:grpo:model.lora_targets=q_proj,v_proj,optim.lr=3e-4")
    assert arm.recipe == "recipe:grpo" and arm.sets == ("model.lora_targets=q_proj,v_proj", "optim.lr=3e-4")
    for bad, msg in [
        ("grpo", "expected NAME=RECIPE:KEY=VALUE"),
        ("x=grpo", "expected NAME=RECIPE:KEY=VALUE"),
        ("x=rollout.group_size=96", "expected NAME=RECIPE:KEY=VALUE"),
        ("a/b=grpo:optim.lr=1", "must be letters"),
        ("x=grpoo:optim.lr=1", "--arm x: unknown recipe .*closest: grpo"),
        ("x=grpo:run.seed=3", "use --seeds"),
        ("x=grpo:algo.recipe=dapo", "use --recipes or --arm"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            parse_arm(bad)


def test_arm_names_must_be_new_and_keys_known(tmp_path):
    base = ["--recipes", "grpo,recipe:dapo", "--seeds", "0", "--out", str(tmp_path)]
    with pytest.raises(ConfigError, match=r"--arm grpo: the name is already a row \(--recipes\)"):
        plan_runs(parse([*base, "--arm", "grpo=dapo:optim.lr=1e-3"]))
    with pytest.raises(
        ConfigError, match="--arm dapo: the name is already a row"
    ):  # recipe:dapo's row is dapo
        plan_runs(parse([*base, "--arm", "dapo=grpo:optim.lr=1e-3"]))
    with pytest.raises(ConfigError, match=r"--arm big: the name is already a row \(another --arm\)"):
        plan_runs(parse([*base, "--arm", "big=grpo:optim.lr=1e-3", "--arm", "big=dapo:optim.lr=1e-3"]))
    with pytest.raises(ConfigError, match="unknown key rollout.group_sise.*closest: group_size"):
        plan_runs(parse([*base, "--arm", "big=grpo:rollout.group_sise=9"]))
    plans = plan_runs(
        parse([*base, "--set", "rollout.group_size=4", "--arm", "big=grpo:rollout.group_size=8"])
    )
    big = [p for p in plans if p.label == "big"]
    assert [p.run_dir.name for p in big] == ["big-s0"] and big[0].cfg.rollout.group_size == 8
    assert big[0].cfg.run.label == "big" and plans[0].cfg.run.label == ""  # recipe rows stay as before
    assert (
        compare_cmd.command_line(parse([*base, "--arm", "big=grpo:rollout.group_size=8"])).count("--arm big=")
        == 1
    )


def test_compare_with_an_arm_trains_collects_and_resumes(tiny_model_dir, tmp_path, monkeypatch):
    from tokencredit.train.trainer import Trainer

    monkeypatch.syspath_prepend(str(REWARDS_DIR))
    out = tmp_path / "cmp"
    argv = micro_argv(tiny_model_dir, out, "--arm", "grpo-big=grpo:rollout.group_size=4", seeds="0,1")
    assert compare_cmd.run(parse(argv)) == 0
    assert sorted(p.name for p in (out / "runs").iterdir()) == [
        "grpo-big-s0",
        "grpo-big-s1",
        "grpo-s0",
        "grpo-s1",
    ]
    res = json.loads((out / "compare.json").read_text())
    assert [g["label"] for g in res["recipes"]] == ["grpo", "grpo-big"]
    big = res["recipes"][1]
    assert big["recipe"] == "grpo" and big["seeds"] == [0, 1] and big["vs_baseline"]["n"] == 2
    cfg = tomllib.loads((out / "runs" / "grpo-big-s0" / "config.toml").read_text())
    assert cfg["run"]["label"] == "grpo-big" and cfg["rollout"]["group_size"] == 4
    assert "rollout.group_size" in res["differing_settings"] and "run.label" not in res["differing_settings"]
    md = (out / "compare.md").read_text()
    assert "| grpo-big | - | 2 |" in md and "--arm grpo-big=grpo:rollout.group_size=4" in md

    # --collect groups by the stored label: the same rows
    again = tmp_path / "again"
    assert cli.main(["compare", "--collect", str(out / "runs"), "--out", str(again)]) == 0
    collected = json.loads((again / "compare.json").read_text())["recipes"]
    assert [(g["label"], g["seeds"]) for g in collected] == [("grpo", [0, 1]), ("grpo-big", [0, 1])]

    calls = []
    monkeypatch.setattr(Trainer, "fit", lambda self: calls.append(self.run_dir.name))
    assert compare_cmd.run(parse(argv)) == 0 and calls == []  # finished: nothing trains again


# ------------------------------------------------------------------------------------------ --tune-lr
def test_choose_lrs_means_over_seeds_and_breaks_ties():
    s = TuneScore
    scores = [
        # a: 1e-3 has the highest mean (0.6) though not the best single seed
        s("a", 1e-4, 0, 0.2),
        s("a", 1e-4, 1, 0.9),
        s("a", 1e-3, 0, 0.6),
        s("a", 1e-3, 1, 0.6),
        # b: equal means; the higher AUC wins
        s("b", 1e-4, 0, 0.5, 0.30),
        s("b", 1e-3, 0, 0.5, 0.40),
        # c: equal means and AUCs: the smaller rate
        s("c", 2e-4, 0, 0.5, 0.3),
        s("c", 1e-4, 0, 0.5, 0.3),
        # d: the best rate failed in one seed: not a candidate
        s("d", 1e-4, 0, 0.1),
        s("d", 1e-3, 0, 0.9),
        s("d", 1e-3, 1, None),
        # e: every rate had a failed run
        s("e", 1e-4, 0, None),
    ]
    rows = {r["label"]: r for r in choose_lrs(scores)}
    assert [r for r in rows] == ["a", "b", "c", "d", "e"]
    assert {k: r["chosen"] for k, r in rows.items()} == {
        "a": 1e-3,
        "b": 1e-3,
        "c": 1e-4,
        "d": 1e-4,
        "e": None,
    }
    a = rows["a"]["lrs"]
    assert [e["lr"] for e in a] == [1e-4, 1e-3]  # ascending
    assert a[0]["final_accuracy"]["mean"] == pytest.approx(0.55) and a[0]["seeds"] == [0, 1]
    assert rows["d"]["lrs"][1]["failed_seeds"] == [1] and rows["d"]["lrs"][1]["seeds"] == [0]
    with pytest.raises(TrainingError, match="no learning rate of 'e' finished all its tune runs"):
        tune_result(scores, {}, metric="greedy", seeds=[0, 1])
    ok = tune_result(scores[:8], {}, metric="greedy", seeds=[0, 1])
    assert ok["chosen"] == {"a": 1e-3, "b": 1e-3, "c": 1e-4} and ok["lrs"] == [1e-4, 2e-4, 1e-3]


def test_tune_flags_and_their_errors(tmp_path):
    assert parse_lrs("5e-5, 1e-4,2e-4") == [5e-5, 1e-4, 2e-4]
    for bad, msg in [("", "empty"), ("1e-4,x", "comma-separated"), ("0", "> 0"), ("1e-4,0.0001", "twice")]:
        with pytest.raises(ConfigError, match=msg):
            parse_lrs(bad)
    assert tune_seeds(None, [0, 1, 2]) == [1000, 1001]
    assert tune_seeds(None, [1000, 1002]) == [1001, 1003]
    assert tune_seeds("7,8", [0]) == [7, 8]
    with pytest.raises(ConfigError, match="seed 1 is also in --seeds"):
        tune_seeds("1,9", [0, 1])
    base = ["--recipes", "grpo", "--seeds", "0", "--out", str(tmp_path / "o")]
    for argv, msg in [
        (
            [*base, "--tune-lr", "1e-4,2e-4", "--set", "optim.lr=1e-3"],
            "--set optim.lr=1e-3: --tune-lr sets optim.lr",
        ),
        ([*base, "--tune-lr", "1e-4", "--arm", "x=grpo:optim.lr=1"], "--arm x: --tune-lr sets optim.lr"),
        ([*base, "--tune-lr", "1e-4", "--set", "data.eval_split=heldout"], "--tune-lr sets data.eval_split"),
        ([*base, "--tune-seeds", "5"], "--tune-seeds applies only with --tune-lr"),
        ([*base, "--tune-lr", "1e-4", "--set", f"data.eval={tmp_path / 'v.jsonl'}"], "needs a toy task"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            compare_cmd.run(parse(argv))
    for flag in (["--tune-lr", "1e-4"], ["--arm", "x=grpo:optim.lr=1"]):
        assert cli.main(["compare", "--collect", str(tmp_path), *flag]) == 2
    line = compare_cmd.command_line(parse([*base, "--tune-lr", "1e-4,2e-4"]))
    assert "--tune-lr 1e-4,2e-4 --tune-seeds 1000,1001" in line


def test_compare_tune_lr_end_to_end(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from tokencredit.train.trainer import Trainer

    monkeypatch.syspath_prepend(str(REWARDS_DIR))
    out = tmp_path / "cmp"
    argv = micro_argv(tiny_model_dir, out, "--tune-lr", "1e-3,1e-2", "--tune-seeds", "5")
    assert compare_cmd.run(parse(argv)) == 0
    tune_runs = sorted(p.name for p in (out / "tune" / "runs").iterdir())
    assert tune_runs == ["grpo-lr0.001-s5", "grpo-lr0.01-s5"]
    for name in tune_runs:
        cfg = tomllib.loads((out / "tune" / "runs" / name / "config.toml").read_text())
        assert cfg["data"]["eval_split"] == "validation" and cfg["run"]["seed"] == 5
        assert (
            json.loads((out / "tune" / "runs" / name / "summary.json").read_text())["eval_split"]
            == "validation"
        )
    res = json.loads((out / "compare.json").read_text())
    chosen = res["tune"]["chosen"]["grpo"]
    assert chosen in (1e-3, 1e-2) and res["tune"]["seeds"] == [5]
    # the choice is the pure function's on the tune runs' final validation accuracies
    finals = {e["lr"]: e["final_accuracy"]["mean"] for e in res["tune"]["rows"][0]["lrs"]}
    assert finals[chosen] == max(finals.values())
    main = tomllib.loads((out / "runs" / "grpo-s0" / "config.toml").read_text())
    assert main["optim"]["lr"] == chosen and main["data"]["eval_split"] == "heldout"
    md = (out / "compare.md").read_text()
    assert "## Learning rate chosen on the validation split" in md and "✓" in md
    assert "| grpo | " in md and f"| {chosen:g} |" in md
    assert "--tune-lr 1e-3,1e-2 --tune-seeds 5" in md
    printed = " ".join(capsys.readouterr().out.split())
    assert f"learning rate chosen on the validation split (tune seeds 5): grpo {chosen:g}" in printed

    calls = []
    monkeypatch.setattr(Trainer, "fit", lambda self: calls.append(self.run_dir.name))
    assert compare_cmd.run(parse(argv)) == 0 and calls == []  # both phases resume: nothing trains again
    assert json.loads((out / "compare.json").read_text())["tune"] == res["tune"]

"""`compare --placebo`: rows that keep a token-credit recipe's update size but not its placement."""

from __future__ import annotations

import json

import pytest
from test_compare import fake_run, parse

from tokencredit.commands import compare as compare_cmd
from tokencredit.compare import aggregate, markdown, read_run
from tokencredit.compare.plan import plan_arms, plan_runs
from tokencredit.compare.stats import holm, paired_t_test
from tokencredit.compare.tune import plan_tune
from tokencredit.errors import ConfigError
from tokencredit.recipes import get_recipe


def test_placebo_rows_follow_each_recipe_that_places_credit(tmp_path):
    args = parse(
        ["--recipes", "grpo,delta,strace,dapo", "--placebo", "--seeds", "0,1", "--out", str(tmp_path)]
    )
    arms = plan_arms(args)
    assert [a.label for a in arms] == [
        "grpo",
        "delta",
        "strace",
        "dapo",
        "delta.permute",
        "delta.uniform-rms",
        "delta.uniform-mean",
        "strace.permute",
        "strace.uniform-rms",
        "strace.uniform-mean",
    ]
    plans = plan_runs(args)
    by_name = {p.cfg.run.name: p.cfg for p in plans}
    cfg = by_name["strace.uniform-rms-s1"]
    assert cfg.algo.recipe == "strace" and cfg.algo.overrides == {"placebo": "uniform-rms"}
    assert cfg.run.label == "strace.uniform-rms" and cfg.run.seed == 1
    assert by_name["strace-s1"].algo.overrides == {}
    # one placebo only
    args = parse(["--recipes", "delta", "--placebo", "permute", "--seeds", "0", "--out", str(tmp_path)])
    assert [a.label for a in plan_arms(args)] == ["delta", "delta.permute"]


def test_placebo_rows_take_their_recipes_tuned_learning_rate_and_are_not_tuned(tmp_path):
    args = parse(
        ["--recipes", "grpo,delta", "--placebo", "permute", "--seeds", "0", "--tune-lr", "1e-4,2e-4"]
        + ["--out", str(tmp_path)]
    )
    tune = plan_tune(args, [1e-4, 2e-4], [100])
    assert sorted({p.label for p in tune}) == ["delta", "grpo"]
    plans = plan_runs(args, {"grpo": 1e-4, "delta": 2e-4})
    assert {p.cfg.run.name: p.cfg.optim.lr for p in plans} == {
        "grpo-s0": 1e-4,
        "delta-s0": 2e-4,
        "delta.permute-s0": 2e-4,
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--recipes", "delta", "--placebo", "permut"], "unknown placebo 'permut' (closest: permute)"),
        (["--recipes", "grpo,dapo", "--placebo"], "none of --recipes places credit"),
        (["--recipes", "delta", "--set", "algo.placebo=permute"], "compare sets it per run; use --placebo"),
        (
            ["--recipes", "delta", "--placebo", "--arm", "delta.permute=delta:optim.lr=1e-4"],
            "the name is a --placebo row",
        ),
    ],
)
def test_bad_placebo_options_get_one_line(tmp_path, argv, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_arms(parse([*argv, "--seeds", "0", "--out", str(tmp_path)]))


def test_command_line_keeps_placebo(tmp_path):
    args = parse(["--recipes", "delta", "--placebo", "--seeds", "0", "--out", str(tmp_path)])
    assert "--placebo permute,uniform-rms,uniform-mean" in compare_cmd.command_line(args)
    args = parse(["--collect", str(tmp_path), "--placebo"])
    with pytest.raises(ConfigError, match="--placebo does not apply"):
        compare_cmd._check(args)


def _placebo_run(root, recipe, placebo, seed, final):
    d = fake_run(
        root / placebo,
        recipe,
        seed,
        [(0, 0.3), (10, (0.3 + final) / 2), (20, final)],
        extra_sets=[f"run.label={recipe}.{placebo}", f"algo.placebo={placebo}"],
    )
    (d / "recipe.json").write_text(json.dumps({**get_recipe(recipe).to_dict(), "placebo": placebo}))
    return d


def test_each_recipe_is_tested_against_its_placebos_with_holm(tmp_path):
    finals = {
        ("delta", "none"): [0.60, 0.62, 0.64, 0.58],
        ("delta", "permute"): [0.55, 0.60, 0.58, 0.57],
        ("delta", "uniform-rms"): [0.61, 0.60, 0.66, 0.59],
        ("strace", "none"): [0.50, 0.55, 0.52, 0.49],
        ("strace", "permute"): [0.52, 0.50, 0.50, 0.47],
    }
    dirs = []
    for (recipe, placebo), values in finals.items():
        for seed, final in enumerate(values):
            if placebo == "none":
                dirs.append(
                    fake_run(tmp_path / "r", recipe, seed, [(0, 0.3), (10, (0.3 + final) / 2), (20, final)])
                )
            else:
                dirs.append(_placebo_run(tmp_path / "p", recipe, placebo, seed, final))
    res = aggregate([read_run(d) for d in dirs], baseline="delta")
    rows = {r["label"]: r for r in res["placebo"]}
    assert sorted(rows) == ["delta.permute", "delta.uniform-rms", "strace.permute"]
    assert rows["strace.permute"]["recipe"] == "strace" and rows["strace.permute"]["placebo"] == "permute"
    p = {}
    for label, r in rows.items():
        recipe, placebo = label.split(".")
        want = paired_t_test(finals[(recipe, "none")], finals[(recipe, placebo)])
        assert r["final"]["mean_diff"] == pytest.approx(want.mean_diff)
        assert r["final"]["p"] == pytest.approx(want.p)
        p[label] = want.p
    for label, adjusted in holm(p).items():
        assert rows[label]["final"]["p_holm"] == pytest.approx(adjusted)
    assert rows["delta.permute"]["final"]["mean_diff"] == pytest.approx(0.035)
    page = markdown(res, "tokencredit compare ...")
    assert "## Placebo controls" in page and "| delta | permute | +0.035 [" in page


def test_no_placebo_rows_no_section(tmp_path):
    dirs = [fake_run(tmp_path, "grpo", s, [(20, 0.5)]) for s in (0, 1)]
    res = aggregate([read_run(d) for d in dirs])
    assert res["placebo"] == [] and "Placebo controls" not in markdown(res, "x")

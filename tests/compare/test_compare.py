"""`tokencredit compare`: statistics against scipy, aggregation of hand-written run directories with
known numbers, and a small end-to-end comparison on a tiny random model that resumes instead of rerunning."""

from __future__ import annotations

import argparse
import json
import math
import random

import pytest

from tokencredit import cli, compare
from tokencredit.commands import compare as compare_cmd
from tokencredit.compare import (
    aggregate,
    markdown,
    mean_std,
    paired_t_test,
    read_run,
    steps_to_target,
    t_two_sided_p,
)
from tokencredit.errors import ConfigError
from tokencredit.recipes import get_recipe
from tokencredit.train.config import dump_toml, load_config


def parse(argv):
    p = argparse.ArgumentParser()
    compare_cmd.add_arguments(p)
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------ statistics
def test_t_p_value_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in [*range(1, 31), 57, 100, 501]:
        for t in (0.0, 0.05, 0.5, 1.0, 1.7320508, 2.5, -3.0, 7.0, 40.0):
            want = 2 * stats.t.sf(abs(t), df)
            assert t_two_sided_p(t, df) == pytest.approx(want, rel=1e-9, abs=1e-13), (t, df)
    assert t_two_sided_p(math.inf, 3) == 0.0
    with pytest.raises(ValueError, match="df"):
        t_two_sided_p(1.0, 0)


def test_paired_t_test_matches_scipy_ttest_rel():
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(3)
    for n in (2, 3, 5, 10):
        for _ in range(5):
            x = [rng.random() for _ in range(n)]
            y = [v + rng.gauss(0.05, 0.1) for v in x]
            got = paired_t_test(x, y)
            want = stats.ttest_rel(x, y)
            assert got.t == pytest.approx(float(want.statistic), rel=1e-9)
            assert got.p == pytest.approx(float(want.pvalue), rel=1e-8)
            assert got.mean_diff == pytest.approx(sum(a - b for a, b in zip(x, y)) / n)


def test_paired_t_test_known_numbers_and_edges():
    r = paired_t_test([0.5, 0.7, 0.6], [0.4, 0.5, 0.6])  # d = 0.1, 0.2, 0.0: mean 0.1, sd 0.1
    assert r.n == 3 and r.mean_diff == pytest.approx(0.1)
    assert r.t == pytest.approx(math.sqrt(3))
    assert r.p == pytest.approx(1 - math.sqrt(3 / 5))  # df = 2: P(|T| < t) = t / sqrt(t^2 + 2)
    one = paired_t_test([0.5], [0.4])
    assert one.n == 1 and one.t is None and one.p is None
    assert paired_t_test([], []).mean_diff is None
    assert paired_t_test([0.5, 0.6], [0.5, 0.6]).p == 1.0  # no difference at all
    shift = paired_t_test([0.6, 0.7], [0.5, 0.6])
    assert shift.t == math.inf and shift.p == 0.0
    with pytest.raises(ValueError, match="equal lengths"):
        paired_t_test([1.0], [1.0, 2.0])


def test_mean_std_and_steps_to_target():
    s = mean_std([0.4, 0.5, 0.6])
    assert s["mean"] == pytest.approx(0.5) and s["std"] == pytest.approx(0.1)  # sample std (n - 1)
    assert mean_std([0.3])["std"] is None and mean_std([])["mean"] is None
    evals = [{"step": 20, "acc": 0.6}, {"step": 0, "acc": 0.2}, {"step": 10, "acc": 0.5}]
    assert steps_to_target(evals, "acc", 0.5) == 10
    assert steps_to_target(evals, "acc", 0.1) == 0
    assert steps_to_target(evals, "acc", 0.7) is None


# ------------------------------------------------------------------------------------------ fabricated runs
def fake_run(
    root,
    recipe,
    seed,
    curve,
    *,
    lora=0,
    steps=20,
    gini=0.0,
    lengths=(10.0, 20.0),
    tps=100.0,
    rounds=(1, 1),
    extra_sets=(),
):
    """A run directory as the trainer writes it: `curve` = [(step, greedy accuracy)], the last is the final."""
    d = root / f"{recipe}-s{seed}-lora{lora}"
    d.mkdir(parents=True)
    cfg = load_config(
        sets=[f"run.seed={seed}", f"run.steps={steps}", f"model.lora_rank={lora}", *extra_sets], recipe=recipe
    )
    (d / "config.toml").write_text(dump_toml(cfg))
    (d / "recipe.json").write_text(json.dumps(get_recipe(recipe).to_dict()))
    recs = [{"step": s, "type": "eval", "eval_greedy_accuracy": a, "eval_avg_at_k": a / 2} for s, a in curve]
    for i, (length, g) in enumerate(zip(lengths, (gini, gini + 0.2))):
        recs.append(
            {
                "step": i + 1,
                "response_length": length,
                "tokens_per_s": tps,
                "credit_gini": g,
                "credit_eff_ratio": 1 - g,
                "gen_rounds": rounds[i],
                "reward": 0.5,
            }
        )
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    final = recs[len(curve) - 1]
    summary = {
        "recipe": recipe,
        "steps": steps,
        "seconds": 120.0,
        "base": recs[0],
        "final": final,
        "tokens_per_s": tps,
        "mean_response_length": lengths[-1],
    }
    (d / "summary.json").write_text(json.dumps(summary))
    return d


@pytest.fixture
def fabricated(tmp_path):
    root = tmp_path / "runs"
    dirs = []
    for seed, final in enumerate((0.4, 0.5, 0.6)):
        dirs.append(fake_run(root, "grpo", seed, [(0, 0.3), (10, 0.45), (20, final)]))
    for seed, (mid, final) in enumerate(((0.5, 0.5), (0.3, 0.7), (0.6, 0.6))):
        dirs.append(
            fake_run(
                root,
                "delta",
                seed,
                [(0, 0.3), (10, mid), (20, final)],
                gini=0.3,
                lengths=(30.0, 50.0),
                tps=200.0,
                rounds=(1, 3),
            )
        )
    return root, dirs


def test_aggregate_known_numbers(fabricated):
    root, dirs = fabricated
    res = aggregate([read_run(d) for d in dirs], baseline="grpo", target=0.5)
    grpo, delta = res["recipes"]
    assert [g["label"] for g in res["recipes"]] == ["grpo", "delta"] and res["baseline"] == "grpo"
    assert grpo["final_accuracy"]["mean"] == pytest.approx(0.5)
    assert grpo["final_accuracy"]["std"] == pytest.approx(0.1)
    assert delta["final_accuracy"]["mean"] == pytest.approx(0.6)
    assert grpo["vs_baseline"] is None
    t = delta["vs_baseline"]
    assert t["n"] == 3 and t["seeds"] == [0, 1, 2] and t["mean_diff"] == pytest.approx(0.1)
    assert t["t"] == pytest.approx(math.sqrt(3)) and t["p"] == pytest.approx(1 - math.sqrt(0.6))
    # steps to 0.5: grpo seed 0 never (0.4 final), seeds 1, 2 at step 20; delta 10, 20, 10
    assert grpo["steps_to_target"]["reached"] == 2 and grpo["steps_to_target"]["mean"] == 20
    assert [r["steps_to_target"] for r in delta["runs"]] == [10, 20, 10]
    assert delta["steps_to_target"]["mean"] == pytest.approx(40 / 3)
    assert delta["response_length"]["mean"] == pytest.approx(40.0) and delta["response_length"]["std"] == 0
    assert delta["credit_gini"]["mean"] == pytest.approx(0.4)  # steps 0.3 and 0.5
    assert delta["gen_rounds"]["mean"] == pytest.approx(2.0)
    assert delta["tokens_per_s"]["mean"] == pytest.approx(200.0)
    assert delta["curves"]["accuracy"]["step"] == [0, 10, 20]
    assert delta["curves"]["accuracy"]["mean"] == pytest.approx([0.3, 1.4 / 3, 0.6])
    assert delta["curves"]["accuracy"]["min"] == [0.3, 0.3, 0.5]
    assert grpo["curves"]["credit_gini"]["mean"] == pytest.approx([0.0, 0.2])
    assert "run.steps" in res["settings"] and not res["differing_settings"]
    # avg@k as the metric: halves every number, so the p-value stays the same
    avg = aggregate([read_run(d) for d in dirs], metric="avg")["recipes"][1]
    assert avg["final_accuracy"]["mean"] == pytest.approx(0.3)
    assert avg["vs_baseline"]["p"] == pytest.approx(t["p"])

    cols, rows = compare.table_rows(res)
    md = markdown(res, "tokencredit compare --collect x")
    assert "| grpo | - | 3 | 0.500 ± 0.100 | baseline |  | 20 ± 0 (2/3 seeds) | 15.0 ± 0.0 |" in md
    assert "| delta | - | 3 | 0.600 ± 0.100 | +0.100 | 0.225 | 13 ± 6 |" in md
    assert "tokencredit compare --collect x" in md and "accuracy.png" in md


def test_intervals_holm_effect_size_and_curve_area(fabricated):
    from scipy import stats as st

    from tokencredit.compare.stats import curve_area, holm, mean_ci, paired_effect, t_quantile

    for df in (1, 2, 5, 9, 30):
        assert t_quantile(0.95, df) == pytest.approx(st.t.ppf(0.975, df), rel=1e-9)
    ci = mean_ci([0.4, 0.5, 0.6])
    half = st.t.ppf(0.975, 2) * 0.1 / math.sqrt(3)
    assert (ci["lo"], ci["hi"]) == pytest.approx((0.5 - half, 0.5 + half))
    assert mean_ci([0.5])["lo"] is None
    # Holm: sorted p (0.01, 0.03, 0.04) x (3, 2, 1), made monotone; None stays out of the family
    assert holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": None}) == pytest.approx(
        {"a": 0.03, "b": 0.06, "c": 0.06, "d": None}
    )
    assert holm({"a": 0.5, "b": 0.9}) == {"a": 1.0, "b": 1.0}
    eff = paired_effect([0.5, 0.7, 0.6], [0.4, 0.5, 0.6])
    assert eff["mean"] == pytest.approx(0.1) and eff["d_z"] == pytest.approx(0.1 / 0.1)
    # trapezoids over steps 0..20, divided by 20
    evals = [{"step": 0, "a": 0.3}, {"step": 10, "a": 0.5}, {"step": 20, "a": 0.5}]
    assert curve_area(evals, "a", 20) == pytest.approx((10 * 0.4 + 10 * 0.5) / 20)
    assert curve_area(evals[1:], "a", 20) is None  # no evaluation at step 0: no area

    root, dirs = fabricated
    res = aggregate([read_run(d) for d in dirs], baseline="grpo", target=0.5)
    grpo, delta = res["recipes"]
    t = delta["vs_baseline"]
    assert t["p_holm"] == pytest.approx(t["p"])  # one recipe against the baseline: Holm changes nothing
    assert t["difference"]["mean"] == pytest.approx(0.1) and t["difference"]["d_z"] == pytest.approx(1.0)
    want = st.ttest_rel([r["accuracy_auc"] for r in delta["runs"]], [r["accuracy_auc"] for r in grpo["runs"]])
    assert delta["auc_vs_baseline"]["p"] == pytest.approx(want.pvalue)
    assert grpo["final_accuracy"]["lo"] == pytest.approx(0.5 - half)
    md = markdown(res, "cmd")
    assert "p (Holm)" in md and "acc. AUC" in md and "[0.252, 0.748]" in md


def test_accuracy_intervals_stay_in_range_and_few_seeds_warn(tmp_path, capsys):
    from tokencredit.compare.stats import mean_ci, paired_effect

    # the 2 seeds: the raw t-interval [-0.107, 1.037] leaves [0, 1]; cut, it is [0, 1] and says so
    raw = mean_ci([0.42, 0.51])
    assert (raw["lo"], raw["hi"]) == pytest.approx((-0.107, 1.037), abs=5e-4)
    cut = mean_ci([0.42, 0.51], bounds=(0.0, 1.0))
    assert (cut["lo"], cut["hi"], cut["clipped"]) == (0.0, 1.0, True)
    assert cut["mean"] == raw["mean"] and cut["std"] == raw["std"]
    # the cut is the intersection with the bounds: an interval inside them is unchanged
    rng = random.Random(5)
    for _ in range(50):
        vals = [rng.random() for _ in range(rng.randint(2, 6))]
        a, b = mean_ci(vals), mean_ci(vals, bounds=(0.0, 1.0))
        assert (b["lo"], b["hi"]) == (max(a["lo"], 0.0), min(a["hi"], 1.0))
        assert b["clipped"] == (a["lo"] < 0.0 or a["hi"] > 1.0)
    diff = paired_effect([0.9, 0.1], [0.1, 0.2], bounds=(-1.0, 1.0))
    assert -1.0 <= diff["lo"] < diff["hi"] <= 1.0

    root = tmp_path / "r"
    for recipe, finals in (("grpo", (0.42, 0.51)), ("delta", (0.9, 0.1))):
        for seed, final in enumerate(finals):
            fake_run(root, recipe, seed, [(0, 0.3), (20, final)])
    out = tmp_path / "cmp"
    assert cli.main(["compare", "--collect", str(root), "--out", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())  # rich wraps lines at the console's width
    res = json.loads((out / "compare.json").read_text())
    for g in res["recipes"]:
        ci = g["final_accuracy"]
        assert 0.0 <= ci["lo"] <= ci["mean"] <= ci["hi"] <= 1.0, g["label"]
        assert 0.0 <= g["accuracy_auc"]["lo"] <= g["accuracy_auc"]["hi"] <= 1.0
        d = (g["vs_baseline"] or {}).get("difference")
        assert d is None or -1.0 <= d["lo"] <= d["hi"] <= 1.0
    assert "[-0.107" not in printed and "1.037]" not in printed
    assert "warning: fewer than 3 seeds for grpo (2), delta (2): the 95% intervals are unreliable" in printed
    assert (
        "t-interval of the mean over seeds, cut to [0, 1]" in printed
    )  # the table's note says which interval
    md = (out / "compare.md").read_text()
    assert "**Warning:** fewer than 3 seeds for grpo (2), delta (2)" in md and "[0.000, 1.000]" in md
    assert "cut to [0, 1]" in res["interval"]


def test_three_seeds_do_not_warn(fabricated):
    root, dirs = fabricated
    res = aggregate([read_run(d) for d in dirs], baseline="grpo")
    assert compare.few_seeds_warning(res) is None and "Warning" not in markdown(res, "cmd")
    assert compare.few_seeds_warning(aggregate([read_run(d) for d in dirs[:2] + dirs[3:]])) is not None


def test_unmatched_seeds_lora_groups_and_differing_settings(tmp_path):
    root = tmp_path / "r"
    dirs = [
        fake_run(root, "grpo", 0, [(20, 0.5)]),
        fake_run(root, "grpo", 1, [(20, 0.6)]),
        fake_run(root, "arca", 1, [(20, 0.7)], lora=8),
        fake_run(root, "arca", 2, [(20, 0.8)], lora=8),
        fake_run(root, "grpo", 0, [(20, 0.55)], lora=8),
        fake_run(root, "grpo", 1, [(20, 0.65)], lora=8, extra_sets=["optim.lr=0.01"]),
    ]
    res = aggregate([read_run(d) for d in dirs], baseline="grpo [full]", target=0.9)
    labels = [g["label"] for g in res["recipes"]]
    assert labels == ["grpo [full]", "arca", "grpo [LoRA r=8]"]
    arca = res["recipes"][1]
    assert arca["vs_baseline"]["n"] == 1 and arca["vs_baseline"]["p"] is None  # only seed 1 in common
    assert res["recipes"][2]["vs_baseline"]["n"] == 2
    assert res["differing_settings"]["optim.lr"][str(dirs[-1])] == 0.01
    _, rows = compare.table_rows(res)
    assert rows[1][:6] == ["arca", "r=8", "2", "0.750 ± 0.071", "+0.100", "n/a (1 matched seed)"]
    assert rows[0][6] == "not reached"
    md = markdown(res, "cmd")
    assert "Settings that differ between runs" in md and "`optim.lr`" in md
    line = next(x for x in md.splitlines() if x.startswith("- `optim.lr`"))
    # One entry per value, its runs folded per recipe and seed range.
    assert line.count(" in 5 runs (") == 1 and line.endswith(f"0.01 in 1 run ({dirs[-1].name})")
    assert "`arca` (r=8)" in md
    with pytest.raises(ConfigError, match="baseline 'dapo' is not among"):
        aggregate([read_run(d) for d in dirs], baseline="dapo")
    with pytest.raises(ConfigError, match="seed 0 twice"):
        aggregate([read_run(dirs[0]), read_run(dirs[0])])


def test_runs_group_by_their_label(tmp_path):
    # `compare --arm grpo-big=grpo:...` stores its row in run.label: same recipe, its own row
    root = tmp_path / "r"
    dirs = [fake_run(root, "grpo", s, [(20, 0.5 + 0.1 * s)]) for s in (0, 1)]
    dirs += [
        fake_run(root / "arm", "grpo", s, [(20, 0.7)], extra_sets=["run.label=grpo-big"]) for s in (0, 1)
    ]
    res = aggregate([read_run(d) for d in dirs], baseline="grpo")
    assert [(g["label"], g["recipe"], g["seeds"]) for g in res["recipes"]] == [
        ("grpo", "grpo", [0, 1]),
        ("grpo-big", "grpo", [0, 1]),
    ]
    assert res["recipes"][1]["vs_baseline"]["mean_diff"] == pytest.approx(0.15)
    assert "run.label" not in res["differing_settings"]


def test_read_errors_name_the_file_and_line(tmp_path, fabricated):
    root, dirs = fabricated
    m = dirs[0] / "metrics.jsonl"
    lines = m.read_text().splitlines()
    m.write_text("\n".join(lines) + '\n{"step": 3, "tor')  # a crash mid-line: dropped, and said
    run = read_run(dirs[0])
    assert len(run.evals) + len(run.steps) == len(lines)
    assert run.damaged == [
        f"{m}:{len(lines) + 1}: cut-off last line skipped (not JSON: Unterminated string starting at, column 13); "
        f"the rest is used ({len(lines)} lines; repair or delete that line, or copy the file again, to silence this)"
    ]
    m.write_text(lines[0] + "\nnot json\n" + lines[1] + "\n")  # a damaged line in the middle: skipped
    assert [d.split(": ")[0] for d in read_run(dirs[0]).damaged] == [f"{m}:2"]
    with pytest.raises(ConfigError, match="no config.toml"):
        read_run(tmp_path)
    (dirs[1] / "summary.json").write_text("{")
    with pytest.raises(ConfigError, match=r"summary.json:1: damaged, not JSON .*tokencredit train --resume"):
        read_run(dirs[1])


def test_collect_cli_writes_table_json_and_plots(fabricated, tmp_path, capsys):
    root, dirs = fabricated
    (dirs[2] / "summary.json").unlink()  # unfinished: left out, with a note
    out = tmp_path / "cmp"
    assert cli.main(["compare", "--collect", str(root), "--out", str(out), "--band", "minmax"]) == 0
    res = json.loads((out / "compare.json").read_text())
    grpo = res["recipes"][0]
    assert grpo["seeds"] == [0, 1] and res["left_out"][0]["run_dir"] == str(dirs[2])
    assert res["recipes"][1]["vs_baseline"]["seeds"] == [0, 1]
    md = (out / "compare.md").read_text()
    assert f"tokencredit compare --collect {root} --target 0.5 --band minmax --out {out}" in md
    assert "**Left out:**" in md
    for png in ("accuracy.png", "concentration.png", "differences.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (out / png).stat().st_size > 10_000
    assert "![paired differences from the baseline](differences.png)" in md
    assert "tokencredit compare" in capsys.readouterr().out
    assert cli.main(["compare", "--collect", str(root), "--out", str(out), "--baseline", "grpoo"]) == 2
    assert "closest: grpo" in capsys.readouterr().err
    assert cli.main(["compare", "--collect", str(root), "--set", "run.steps=3"]) == 2


# ------------------------------------------------------------------------------------------ end to end
def micro_sets(model_dir, steps=2):
    return [
        f"model.name={model_dir}",
        f"run.steps={steps}",
        "run.progress=false",
        "run.threads=1",
        "rollout.prompts_per_step=2",
        "rollout.group_size=4",
        "rollout.max_new_tokens=12",
        "data.train_size=40",
        "data.eval_size=3",
        "data.difficulty=1",
        "eval.every=0",
        "eval.samples=0",
        "eval.save_groups=1",
        "checkpoint.every=1",
        "reward.function=_compare_rewards:has_digit_seven",
        "optim.lr=1e-2",
        "optim.warmup_steps=0",
    ]


def compare_argv(model_dir, out, *extra, steps=2):
    argv = [
        "--recipes",
        "grpo,arca",
        "--seeds",
        "0,1",
        "--lora-only-rank",
        "4",
        "--target",
        "0.0",
        "--out",
        str(out),
    ]
    for s in micro_sets(model_dir, steps):
        argv += ["--set", s]
    return argv + list(extra)


def test_end_to_end_and_resume(tiny_model_dir, tmp_path, monkeypatch):
    from tokencredit.train.trainer import Trainer

    out = tmp_path / "cmp"
    assert compare_cmd.run(parse(compare_argv(tiny_model_dir, out))) == 0
    runs = out / "runs"
    assert sorted(p.name for p in runs.iterdir()) == ["arca-s0", "arca-s1", "grpo-s0", "grpo-s1"]
    res = json.loads((out / "compare.json").read_text())
    grpo, arca = res["recipes"]
    assert (grpo["lora_rank"], arca["lora_rank"]) == (0, 4)
    for g in (grpo, arca):
        for r in g["runs"]:
            summary = json.loads((runs / f"{g['recipe']}-s{r['seed']}" / "summary.json").read_text())
            assert r["final_accuracy"] == summary["final"]["eval_greedy_accuracy"] and r["steps"] == 2
            assert r["steps_to_target"] == 0  # target 0: reached by the starting model
        assert g["curves"]["accuracy"]["step"] == [0, 2] and g["curves"]["accuracy"]["n"] == [2, 2]
        assert len(g["curves"]["credit_gini"]["step"]) == 2
    # identical data order and evaluation: the same seed saw the same problems under both recipes
    for s in (0, 1):
        a, b = ((runs / f"{r}-s{s}" / "rollouts" / "step_000002.jsonl").read_text() for r in ("grpo", "arca"))
        assert json.loads(a)["problem"] == json.loads(b)["problem"]
    assert grpo["credit_gini"]["mean"] == pytest.approx(0.0, abs=1e-6)  # uniform credit
    md = (out / "compare.md").read_text()
    assert "| arca | r=4 | 2 |" in md and "`arca` (r=4)" in md and "--lora-only-rank 4" in md
    assert (out / "accuracy.png").stat().st_size > 10_000 and (
        out / "concentration.png"
    ).stat().st_size > 10_000

    # a second invocation trains nothing and writes the same table
    calls = []
    real_init = Trainer.__init__

    def spy_init(self, cfg, run_dir, *, resume=False, console=None):
        calls.append((run_dir.name, resume))
        real_init(self, cfg, run_dir, resume=resume, console=console)

    monkeypatch.setattr(Trainer, "__init__", spy_init)
    assert compare_cmd.run(parse(compare_argv(tiny_model_dir, out))) == 0
    assert calls == []
    assert json.loads((out / "compare.json").read_text())["recipes"] == res["recipes"]

    # an unfinished run (no summary.json) resumes from its checkpoint
    (runs / "grpo-s1" / "summary.json").unlink()
    assert compare_cmd.run(parse(compare_argv(tiny_model_dir, out))) == 0
    assert calls == [("grpo-s1", True)]
    again = json.loads((out / "compare.json").read_text())["recipes"]
    assert again[0]["final_accuracy"] == res["recipes"][0]["final_accuracy"]

    # more steps than a finished run has: it is extended from its last checkpoint; fewer: an error
    more = {
        p.run_dir.name: compare.plan_state(p)
        for p in compare.plan_runs(parse(compare_argv(tiny_model_dir, out, steps=3)))
    }
    assert more == {"grpo-s0": "resume", "grpo-s1": "resume", "arca-s0": "resume", "arca-s1": "resume"}
    with pytest.raises(ConfigError, match="planned for run.steps=2, more than 1"):
        compare.plan_state(compare.plan_runs(parse(compare_argv(tiny_model_dir, out, steps=1)))[0])

    # a run that fails is reported and left out; the others are still compared
    from tokencredit.train.trainer import TrainingError

    def crash(self):
        raise TrainingError("step 1: non-finite loss (nan)")

    monkeypatch.setattr(Trainer, "fit", crash)
    (runs / "grpo-s0" / "summary.json").unlink()
    assert compare_cmd.run(parse(compare_argv(tiny_model_dir, out))) == 1
    failed = json.loads((out / "compare.json").read_text())
    assert failed["failed"] == [
        {"run_dir": str(runs / "grpo-s0"), "reason": "TrainingError: step 1: non-finite loss (nan)"}
    ]
    assert failed["recipes"][0]["seeds"] == [1]
    assert "**Failed runs:**" in (out / "compare.md").read_text()

    with pytest.raises(ConfigError, match=r"grpo-s0 was made with other settings \(optim.lr"):
        compare_cmd.run(parse(compare_argv(tiny_model_dir, out, "--set", "optim.lr=0.5")))
    with pytest.raises(ConfigError, match="use --seeds"):
        compare_cmd.run(parse(compare_argv(tiny_model_dir, tmp_path / "o2", "--set", "run.seed=3")))
    with pytest.raises(ConfigError, match="unknown recipe or credit method 'grpoo'"):
        compare_cmd.run(parse(["--recipes", "grpoo", "--out", str(tmp_path / "o3")]))


@pytest.mark.slow
def test_parallel_jobs_in_subprocesses(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "par"
    argv = compare_argv(tiny_model_dir, out, "--jobs", "2", "--set", "eval.at_start=false", steps=1)
    argv[argv.index("grpo,arca")] = "grpo"
    assert compare_cmd.run(parse(argv)) == 0
    printed = capsys.readouterr().out
    # both runs start at once (2 jobs), and the progress line counts the planned steps with an ETA
    assert printed.index("[2/2] started") < printed.index("finished grpo")
    assert "progress: 2/2 steps, 0 running" in printed and "ETA" in printed
    for s in (0, 1):
        d = out / "runs" / f"grpo-s{s}"
        assert (d / "summary.json").is_file() and "curves:" in (d / "train.log").read_text()
    res = json.loads((out / "compare.json").read_text())
    assert res["recipes"][0]["seeds"] == [0, 1] and not res["failed"]


def test_terminal_table_fits_the_console_width(tmp_path):
    from rich.console import Console

    from tokencredit.compare import render
    from tokencredit.compare.render import rich_table

    root = tmp_path / "r"
    runs = [
        fake_run(root, r, s, [(10, 0.4 + 0.01 * s), (20, 0.5 + 0.02 * s)])
        for r in ("grpo", "dapo")
        for s in (0, 1, 2)
    ]
    res = aggregate([read_run(d) for d in runs], baseline="grpo", target=0.5)
    # no width: every column, and the caption says only which interval the table shows
    assert len(rich_table(res).columns) == 21 and rich_table(res).caption == render.INTERVAL_NOTE
    narrow = rich_table(res, width=80)
    kept = [c.header for c in narrow.columns]
    assert {"recipe", "final acc.", "Δ", "p Holm", "AUC", "p AUC"} <= set(kept) and len(kept) < 21
    assert "tok/s" in narrow.caption and "compare.md" in narrow.caption
    console = Console(width=80, record=True)
    console.print(narrow)
    assert max(len(x) for x in console.export_text().splitlines()) <= 80


def test_difference_plot_marks_significant_recipes(tmp_path, monkeypatch):
    from tokencredit.compare import render

    root = tmp_path / "r"
    # "gcpo" is 0.1 below grpo in every seed (significant); "dapo" differs by seed noise only.
    runs = [fake_run(root, "grpo", s, [(0, 0.4), (10, 0.5), (20, 0.6 + 0.01 * s)]) for s in range(5)]
    runs += [
        fake_run(root, "gcpo", s, [(0, 0.4), (10, 0.4), (20, 0.5 + 0.01 * s + 0.002 * (s % 2))])
        for s in range(5)
    ]
    runs += [
        fake_run(root, "dapo", s, [(0, 0.4), (10, 0.5), (20, 0.6 + 0.01 * ((s * 3) % 5))]) for s in range(5)
    ]
    res = aggregate([read_run(d) for d in runs], baseline="grpo", target=0.5)
    drawn = []
    real = render._pyplot

    def spying_pyplot():
        plt = real()
        orig = plt.subplots

        def subplots(*a, **k):
            fig, axes = orig(*a, **k)
            for ax in axes:
                eb = ax.errorbar

                def spy(x, y, *ea, _eb=eb, **ek):
                    drawn.append((y, x, ek.get("color")))
                    return _eb(x, y, *ea, **ek)

                ax.errorbar = spy
            return fig, axes

        monkeypatch.setattr(plt, "subplots", subplots)
        return plt

    monkeypatch.setattr(render, "_pyplot", spying_pyplot)
    path = render.plot_differences(res, tmp_path / "d.png")
    assert path.stat().st_size > 5_000
    assert len(drawn) == 4  # two recipes x (final accuracy, AUC)
    final = drawn[:2]  # left panel: final accuracy, rows sorted by the difference
    assert [round(x, 2) for _, x, _ in final] == [-0.1, 0.0]
    assert final[0][2] == "C3" and final[1][2] == "C0"  # significant after Holm vs not
    assert drawn[2][0] == 0 and drawn[2][1] < 0  # AUC panel, same row order

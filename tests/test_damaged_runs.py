"""Damaged run directories given to the reports (issue 22): `tokencredit explain RUN_DIR`, `tokencredit
probe --model RUN_DIR` and `tokencredit compare --collect RUN_DIR...` read what is readable, and say each
part they skipped in one line naming the file, the line and what to do (on stderr / the console, and in
the report's notes for explain and compare). The cases: saved rollouts cut off, a checkpoint that is gone
(its .pt deleted, its digest deleted, its bytes corrupted), a metrics.jsonl line cut in half in the middle
of the file, a config.toml key and a recipe.json field from a newer version, a summary.json cut off. The
trainer's own reading stays strict: `tokencredit train --resume` of a run with an unknown key stops before
it starts. Real runs of the micro configuration on the tiny model, trained once per module."""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import TOY_REWARDS_DIR, _micro_sets
from tokencredit import cli
from tokencredit.errors import ConfigError
from tokencredit.recipes import from_dict, get_recipe
from tokencredit.train.config import load_config
from tokencredit.train.rundir import RunDir

PROGRESS_BAR = re.compile(r"\d+%\|")
STEPS = 4


@pytest.fixture(scope="module")
def trained(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """{seed: run directory} of two finished micro runs (seeds 0 and 1), a checkpoint of every step kept,
    two groups saved at the last step."""
    root = tmp_path_factory.mktemp("damaged")
    extra = {"checkpoint.keep": 0, "eval.save_groups": 2}
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(TOY_REWARDS_DIR))
        for seed in (0, 1):
            sets = _micro_sets(tiny_model_dir, steps=STEPS, **{"run.seed": seed, **extra})
            argv = ["train", "--recipe", "strace", "--out", str(root / f"s{seed}")]
            assert cli.main(argv + [a for s in sets for a in ("--set", s)]) == 0
    return {0: root / "s0", 1: root / "s1"}


@pytest.fixture
def run(trained: dict[int, Path], tmp_path: Path) -> Path:
    """A fresh copy of the seed-0 run, to damage."""
    return Path(shutil.copytree(trained[0], tmp_path / "run"))


def stderr_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """This command's stderr lines (transformers' loading progress bars left out)."""
    return [x for x in capsys.readouterr().err.splitlines() if x.strip() and not PROGRESS_BAR.search(x)]


def cut_line(path: Path, index: int) -> int:
    """Cut line `index` (0-based, -1 = the last) of a JSONL file in half; returns its 1-based number."""
    lines = path.read_text().splitlines()
    index %= len(lines)
    lines[index] = lines[index][: len(lines[index]) // 2]
    path.write_text("".join(x + "\n" for x in lines))
    return index + 1


def add_unknown_key(run: Path) -> int:
    """A config key from a newer version under [rollout]; returns its line number in config.toml."""
    cfg = run / "config.toml"
    lines = cfg.read_text().splitlines()
    at = lines.index("[rollout]") + 2
    lines.insert(at - 1, "speculative_decoding = true")
    cfg.write_text("\n".join(lines) + "\n")
    return at


def add_unknown_field(run: Path) -> int:
    """A recipe field from a newer version; returns its line number in recipe.json."""
    data = json.loads((run / "recipe.json").read_text())
    data["token_budget"] = 512
    text = json.dumps(data, indent=2)
    (run / "recipe.json").write_text(text)
    return next(i for i, x in enumerate(text.splitlines(), 1) if '"token_budget"' in x)


# ---- the reading policy, one place: RunDir -------------------------------------------------------


def test_lenient_reads_say_file_line_and_what_to_do(run):
    rd = RunDir(run)
    n = len(rd.metrics.read())
    bad = cut_line(rd.metrics.path, 1)  # a line in the middle, not the last
    key_line, field_line = add_unknown_key(run), add_unknown_field(run)
    skipped: list[str] = []
    cfg, recipe, records = rd.read_config(skipped), rd.read_recipe(None, skipped), rd.metrics.read(skipped)
    assert len(records) == n - 1 and cfg.rollout.group_size == 4 and recipe.name == "strace"
    assert skipped[:2] == [
        f"{rd.config_path}:{key_line}: unknown key rollout.speculative_decoding ignored (written by a newer "
        "tokencredit?); the run's other settings are used (upgrade tokencredit to read it)",
        f"{rd.recipe_path}:{field_line}: unknown recipe field 'token_budget' ignored (written by a newer "
        "tokencredit?); the recipe's other fields are used (upgrade tokencredit to read it)",
    ]
    assert re.fullmatch(
        rf"{re.escape(str(rd.metrics.path))}:{bad}: damaged line skipped \(not JSON: [^()]+, column \d+\); the rest is used "
        rf"\({n - 1} lines; repair or delete that line, or copy the file again, to silence this\)",
        skipped[2],
    ), skipped[2]
    assert len(skipped) == 3
    # strict, as `tokencredit train --resume` and `--config` read: the unknown names are errors
    with pytest.raises(ConfigError, match=r"unknown key rollout.speculative_decoding"):
        rd.read_config()
    with pytest.raises(ConfigError, match=r"unknown recipe field 'token_budget'"):
        rd.read_recipe()
    with pytest.raises(ConfigError, match=r"unknown key rollout.speculative_decoding"):
        load_config(rd.config_path)
    unknown: list[str] = []
    assert from_dict({**get_recipe("grpo").to_dict(), "x": 1}, "r", unknown).name == "grpo" and unknown == [
        "x"
    ]
    # an unknown section: skipped with the line of its header
    rd.config_path.write_text(rd.config_path.read_text() + "\n[speculation]\ndraft = 'x'\n")
    skipped = []
    rd.read_config(skipped)
    header = rd.config_path.read_text().splitlines().index("[speculation]") + 1
    assert skipped[1].startswith(f"{rd.config_path}:{header}: unknown section speculation ignored")


def test_resume_stays_strict_about_an_unknown_key(run, capsys):
    add_unknown_key(run)
    before = (run / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(run)]) == 2
    (err,) = stderr_lines(capsys)
    assert err.startswith(
        f"tokencredit train: configuration error: {run}/config.toml: unknown key rollout.speculative_decoding"
    ), err
    assert (run / "metrics.jsonl").read_text() == before  # stopped before it started


# ---- explain ------------------------------------------------------------------------------------------


def explain(run: Path, out: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[str, list[str]]:
    """`tokencredit explain RUN` in this process: (the page, its stderr lines); it must succeed."""
    capsys.readouterr()
    assert cli.main(["explain", str(run), "--methods", "uniform,ktae", "--out", str(out), *extra]) == 0
    return out.read_text(), stderr_lines(capsys)


def test_explain_uses_the_groups_a_damaged_rollouts_file_still_has(run, trained, tmp_path, capsys):
    saved = RunDir(run).rollout_path(STEPS)
    problems = [html.escape(json.loads(x)["problem"]) for x in saved.read_text().splitlines()]
    assert len(problems) == 2 and problems[0] != problems[1]
    # the last line cut off
    line = cut_line(saved, -1)
    page, err = explain(run, tmp_path / "last.html", capsys)
    assert len(err) == 1, err
    assert err[0].startswith(
        f"tokencredit explain: {saved}:{line}: cut-off last line skipped (not JSON: "
    ) and err[0].endswith(
        "; the rest is used (1 group; repair or delete that line, or copy the file again, to silence this)"
    ), err[0]
    assert html.escape(err[0].removeprefix("tokencredit explain: ")) in page  # also in the page's notes
    assert problems[0] in page and problems[1] not in page
    # the first line cut in half (a line in the middle of the file): the second group is shown
    shutil.copy(RunDir(trained[0]).rollout_path(STEPS), saved)
    cut_line(saved, 0)
    page, err = explain(run, tmp_path / "first.html", capsys)
    assert len(err) == 1 and err[0].startswith(f"tokencredit explain: {saved}:1: damaged group skipped"), err
    assert problems[1] in page and problems[0] not in page
    # nothing left to show: one line naming the file
    saved.write_text("{\n")
    capsys.readouterr()
    assert cli.main(["explain", str(run), "--methods", "uniform", "--out", str(tmp_path / "none.html")]) == 2
    assert stderr_lines(capsys) == [
        f"tokencredit explain: configuration error: {saved}: no readable group in the file (1 damaged line(s)); "
        "explain another saved step (--step) or copy the file again"
    ]


def test_explain_of_a_run_from_a_newer_version(run, tmp_path, capsys):
    key_line, field_line = add_unknown_key(run), add_unknown_field(run)
    page, err = explain(run, tmp_path / "e.html", capsys)
    assert [x.split(" ignored")[0] for x in err] == [
        f"tokencredit explain: {run}/config.toml:{key_line}: unknown key rollout.speculative_decoding",
        f"tokencredit explain: {run}/recipe.json:{field_line}: unknown recipe field 'token_budget'",
    ]
    assert all(html.escape(x.removeprefix("tokencredit explain: ")) in page for x in err)
    assert "strace" in page  # the recipe was still read


def test_explain_of_a_lora_run_whose_newest_checkpoint_is_corrupt(
    tiny_model_dir, tmp_path, toy_rewards, capsys
):
    """ARCA reads the LoRA adapter, restored from the newest checkpoint: a corrupt one is said, and the
    previous one is used."""
    run = tmp_path / "lora"
    sets = _micro_sets(tiny_model_dir, steps=2, **{"model.lora_rank": 4, "checkpoint.keep": 0})
    assert (
        cli.main(["train", "--recipe", "arca", "--out", str(run), *[a for s in sets for a in ("--set", s)]])
        == 0
    )
    newest = RunDir(run).checkpoint_path(2)
    newest.write_bytes(newest.read_bytes()[:-10])
    page, err = explain(run, tmp_path / "e.html", capsys, "--methods", "arca")
    assert err == [
        f"tokencredit explain: checkpoint {newest} is unusable (digest mismatch (corrupt or truncated)); "
        "trying the previous one"
    ]
    assert html.escape(err[0].removeprefix("tokencredit explain: ")) in page
    assert "checkpoint step 1" in page  # the adapter of step 1 gave ARCA's signals


# ---- compare --collect ----------------------------------------------------------------------------------


def test_compare_collect_uses_what_is_readable(trained, tmp_path, capsys):
    root = tmp_path / "runs"
    a, b = (Path(shutil.copytree(trained[s], root / f"strace-s{s}")) for s in (0, 1))
    metrics = RunDir(a).metrics.path
    bad = cut_line(metrics, 1)  # a metrics line cut in half, in the middle of the file
    key_line, field_line = add_unknown_key(a), add_unknown_field(a)
    out = tmp_path / "cmp"
    capsys.readouterr()
    assert cli.main(["compare", "--collect", str(root), "--out", str(out)]) == 0
    res = json.loads((out / "compare.json").read_text())
    assert res["recipes"][0]["seeds"] == [0, 1] and res["left_out"] == []
    assert [d["run_dir"] for d in res["damaged"]] == [str(a)] * 3
    assert [d["reason"].split(": ")[0] for d in res["damaged"]] == [
        f"{a}/config.toml:{key_line}",
        f"{a}/recipe.json:{field_line}",
        f"{metrics}:{bad}",
    ]
    printed, md = capsys.readouterr().out, (out / "compare.md").read_text()
    assert "**Damaged parts skipped (the rest of each run is used):**" in md
    assert all(d["reason"] in md and d["reason"] in printed for d in res["damaged"])
    # the other steps of the damaged run are used: one step record fewer, the final accuracy from its summary
    run_a = next(r for r in res["recipes"][0]["runs"] if r["seed"] == 0)
    summary = json.loads((a / "summary.json").read_text())
    assert run_a["final_accuracy"] == summary["final"]["eval_greedy_accuracy"]


def test_compare_collect_leaves_out_a_run_whose_summary_is_cut_off(trained, tmp_path, toy_rewards, capsys):
    root = tmp_path / "runs"
    a, b = (Path(shutil.copytree(trained[s], root / f"strace-s{s}")) for s in (0, 1))
    summary = b / "summary.json"
    text = summary.read_text()
    summary.write_text(text[: len(text) // 2])
    out = tmp_path / "cmp"
    assert cli.main(["compare", "--collect", str(root), "--out", str(out)]) == 0
    res = json.loads((out / "compare.json").read_text())
    assert res["recipes"][0]["seeds"] == [0]
    ((left,),) = [res["left_out"]]
    assert left["run_dir"] == str(b) and left["reason"].startswith(f"{summary}:")
    assert left["reason"].endswith(f"; `tokencredit train --resume {b}` writes it again")
    # ... and it does: the finished run is summarised again, and compared
    assert cli.main(["train", "--resume", str(b)]) == 0
    again, before = json.loads(summary.read_text()), json.loads(text)
    assert (again["steps"], again["final"]) == (before["steps"], before["final"])
    assert cli.main(["compare", "--collect", str(root), "--out", str(out)]) == 0
    assert json.loads((out / "compare.json").read_text())["recipes"][0]["seeds"] == [0, 1]


# ---- probe --------------------------------------------------------------------------------------------

PROBE = [
    "--methods",
    "grpo",
    "--groups",
    "2",
    "--group-size",
    "2",
    "--max-new-tokens",
    "8",
    "--random-draws",
    "2",
]


def test_probe_all_checkpoints_skips_the_ones_gone_or_corrupt(run, tmp_path, capsys):
    rd = RunDir(run)
    assert rd.checkpoint_steps() == [1, 2, 3, 4]
    rd.checkpoint_path(1).unlink()  # the .pt is gone, its digest is left
    rd.checkpoint_path(2).with_suffix(".json").unlink()  # the .pt without its digest
    data = bytearray(rd.checkpoint_path(3).read_bytes())
    data[len(data) // 2] ^= 0xFF
    rd.checkpoint_path(3).write_bytes(bytes(data))  # one byte flipped
    key_line = add_unknown_key(run)
    out = tmp_path / "probe.json"
    capsys.readouterr()
    assert cli.main(["probe", "--model", str(run), "--all-checkpoints", *PROBE, "--out", str(out)]) == 0
    said = [x for x in stderr_lines(capsys) if str(run) in x and "loading" not in x]
    assert said == [
        f"[probe] {run}/config.toml:{key_line}: unknown key rollout.speculative_decoding ignored (written by a "
        "newer tokencredit?); the run's other settings are used (upgrade tokencredit to read it)",
        f"[probe] {rd.checkpoints_dir}/step_000001.json: checkpoint step 1 is gone (no step_000001.pt); skipped, "
        "the other 1 checkpoint(s) are probed (restore it from a copy to probe it)",
        f"[probe] {rd.checkpoints_dir}/step_000002.pt: checkpoint step 2 is unusable (no digest file (partial "
        "write)); skipped, the other 1 checkpoint(s) are probed (restore it from a copy to probe it)",
        f"[probe] {rd.checkpoints_dir}/step_000003.pt: checkpoint step 3 is unusable (digest mismatch (corrupt or "
        "truncated)); skipped, the other 1 checkpoint(s) are probed (restore it from a copy to probe it)",
    ]
    assert [p["label"] for p in json.loads(out.read_text())["points"]] == ["step 0 (start)", "step 4"]


@pytest.mark.parametrize(
    "step, expected",
    [
        (
            1,
            "step_000001.pt: no checkpoint at step 1; probe a saved one with --checkpoint step_N (saved: step_2, "
            "step_3, step_4)",
        ),
        (
            3,
            "step_000003.pt: checkpoint step 3 is unusable (digest mismatch (corrupt or truncated)); probe another "
            "with --checkpoint step_N (saved: step_2, step_3, step_4) or --all-checkpoints, which skips unusable "
            "ones",
        ),
    ],
)
def test_probe_of_a_checkpoint_gone_or_corrupt_says_which_there_are(step, expected, run, capsys):
    rd = RunDir(run)
    rd.checkpoint_path(1).unlink()
    rd.checkpoint_path(3).write_bytes(rd.checkpoint_path(3).read_bytes()[:-10])  # cut short
    capsys.readouterr()
    assert cli.main(["probe", "--model", str(run), "--checkpoint", f"step_{step}", *PROBE]) == 2
    assert stderr_lines(capsys) == [
        f"tokencredit probe: configuration error: {rd.checkpoints_dir}/{expected}"
    ]

"""The bad-input corpus of `tokencredit train`'s configuration (issue 39, item 5): each case runs the real
CLI entry point and must end with exit code 2 and one line on stderr naming the key, the file or the
option, with no traceback and no run directory left behind. The run-directory cases (`--out`,
`--overwrite`, `--resume`, the lock) are in tests/train/test_run_directory.py; data, model, reward and
explain inputs in the other tests/commands/test_corpus_*.py files."""

from __future__ import annotations

import time

import pytest

from bad_input import one_line_error
from tokencredit import cli
from tokencredit.train.config import TrainConfig, apply_set, load_config


def _args(sets: list[str]) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


SET_CASES = [
    # (--set assignment, what the line must name)
    (
        "algo.overrides={eps_high=0.3",
        "algo.overrides: expected a table such as {eps_high = 0.3}, got '{eps_high=0.3'",
    ),
    ("algo.overrides=[1, 2]", "algo.overrides: expected a table"),
    (
        "algo.overrides=" + "[" * 5000,
        "algo.overrides: expected a table",
    ),  # nested too deeply to parse: a string
    ("data.digits=0", "data.digits must be in 1..4"),
    ("data.digits=-3", "data.digits must be in 1..4"),
    ("data.difficulty=0", "data.difficulty must be in 1..32"),
    ("data.template=Solve this:", "data.template: unknown prompt template 'Solve this:'"),
    ("run.steps=true", "run.steps: expected an integer, got True"),
    ("run.steps=10**12", "run.steps: expected an integer, got '10**12'"),
    ("run.steps=99999999999999999999999", "run.steps: 99999999999999999999999 is out of range"),
    ("run.steps=2.5", "run.steps: expected an integer, got 2.5"),
    ("optim.lr=false", "optim.lr: expected a number, got False"),
    ("optim.lr=nan", "optim.lr must be a finite number > 0"),
    ("rollout.temperature=0", "rollout.temperature must be > 0"),
    ("run.progress=maybe", "run.progress: expected true/false, got 'maybe'"),
    ("run.name=/tmp/x", "run.name must be a directory name inside run.out_dir"),
    ("steps=3", "--set 'steps=3': expected section.key=value"),
    ("run.stpes=3", "unknown key run.stpes (closest: steps"),
]


@pytest.mark.parametrize("assignment, expected", SET_CASES, ids=[c[0][:40] for c in SET_CASES])
def test_bad_set_values(assignment, expected, tiny_model_dir, micro_sets, tmp_path, capsys):
    out = tmp_path / "run"
    t0 = time.perf_counter()
    one_line_error(
        ["train", "--out", str(out), *_args(micro_sets(tiny_model_dir)), "--set", assignment],
        capsys,
        names=[expected],
    )
    assert (
        time.perf_counter() - t0 < 30 and not out.exists()
    )  # stopped before the model loaded, nothing written


TOML_CASES = [
    # (the config file's bytes, what the line must name after the file's path)
    (b"[run]\nsteps = true\n", ": run.steps: expected an integer, got True"),
    (b"[optim]\nlr = true\n", ": optim.lr: expected a number, got True"),
    (b"[run]\nsteps = 3\n\x00\x9f\x92\x96\xff", ":3: not a UTF-8 text file (byte 17)"),
    (b'[run]\nname = "caf\xe9"\n', ":2: not a UTF-8 text file (byte 17)"),  # Latin-1
    (b"[run\nsteps = 3\n", ": invalid TOML: "),
    (b"x = " + b"[" * 20000 + b"]" * 20000 + b"\n", ": invalid TOML: "),
    (b'[algo]\noverrides = "eps_high=0.3"\n', ": algo.overrides: expected a table"),
    (b"[run]\nsteps = 3\n[runn]\n", ": unknown section [runn] (closest: run)"),
]


@pytest.mark.parametrize("content, expected", TOML_CASES, ids=[str(i) for i in range(len(TOML_CASES))])
def test_bad_config_files(content, expected, tiny_model_dir, micro_sets, tmp_path, capsys):
    cfg = tmp_path / "my.toml"
    cfg.write_bytes(content)
    out = tmp_path / "run"
    one_line_error(
        ["train", "--config", str(cfg), "--out", str(out), *_args(micro_sets(tiny_model_dir))],
        capsys,
        names=[f"{cfg}{expected}"],
    )
    assert not out.exists()


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--config", "{tmp}"], "is a directory, not a TOML file"),
        (["--config", "{tmp}/missing.toml"], "config file not found: {tmp}/missing.toml (shipped configs: "),
        (
            ["--resume", "{tmp}/run", "--out", "{tmp}/other"],
            "--resume continues the run in its own directory",
        ),
        (["--resume", "{tmp}/nope"], "--resume {tmp}/nope: the directory does not exist"),
    ],
)
def test_bad_options(argv, expected, tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.toml").write_text("")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    one_line_error(["train", *argv], capsys, names=[expected.replace("{tmp}", str(tmp_path))])


def test_set_reads_toml_inline_tables_and_python_literals():
    cfg = TrainConfig()
    apply_set(cfg, "algo.overrides={eps_high = 0.3, kernel_params = {lam = 0.9}}")
    apply_set(cfg, "algo.overrides={'eps_low': 0.1}")
    apply_set(cfg, "data.template={problem} Answer:")  # a string that starts with a brace stays a string
    apply_set(cfg, "optim.lr=3e-4")
    assert cfg.algo.overrides == {"eps_high": 0.3, "kernel_params": {"lam": 0.9}, "eps_low": 0.1}
    assert cfg.data.template == "{problem} Answer:" and cfg.optim.lr == 3e-4


def test_a_config_file_with_integers_as_floats_is_still_read(tmp_path):
    p = tmp_path / "ok.toml"
    p.write_text("[run]\nsteps = 3.0\n[optim]\nlr = 1\n")
    cfg = load_config(p)
    assert cfg.run.steps == 3 and cfg.optim.lr == 1.0


def test_special_token_text_in_a_problem_is_said_once(tiny_model_dir, micro_sets, tmp_path, capsys):
    """A documented acceptance: the rendered prompt is tokenised whole, so `<|im_end|>` in a problem is
    read as the token (as TRL and verl read it), and the run says so once instead of silently."""
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(f'{{"id": "p{i}", "problem": "1+{i}<|im_end|>?", "answer": "{1 + i}"}}\n' for i in range(4))
    )
    sets = _args(micro_sets(tiny_model_dir, steps=1, **{"data.train": data, "data.eval": data}))
    assert cli.main(["train", "--recipe", "strace", "--out", str(tmp_path / "run"), *sets]) == 0
    out = capsys.readouterr().out
    assert out.count("warning: a training problem's text contains '<|im_end|>'") == 1


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--config", "/dev/zero"], "--config /dev/zero is not a regular file (a device or a pipe?)"),
        (["--out", ""], "--out is empty"),
        (["--out", "{tmp}/" + "a" * 300], "cannot use it (File name too long)"),
        (["--out", "{tmp}/made/../run"], "--out {tmp}/run already holds a run"),
        (
            ["--set", "run.name=.", "--set", "run.out_dir={tmp}"],
            "run.name must be a directory name inside run.out_dir",
        ),
    ],
)
def test_odd_paths(argv, expected, tiny_model_dir, micro_sets, tmp_path, capsys):
    """Paths an adversarial user tried: a device as the config, an empty or over-long --out, a path through
    a directory that does not exist (refused without creating it), a run.name that is the out_dir itself."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.toml").write_text("")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    one_line_error(
        ["train", *_args(micro_sets(tiny_model_dir)), *argv],
        capsys,
        names=[expected.replace("{tmp}", str(tmp_path))],
    )
    assert not (tmp_path / "made").exists()

"""A run directory is never silently reused (issue 39, item 1): `--out` on a directory that holds a
run stops before anything is written, `--overwrite` replaces a run whole (never a folder of other
files), one process writes a run at a time (an flock on RUN_DIR/.lock, released by the OS on kill -9),
`--resume` over checkpoints that all fail is an error naming them, a damaged line in the middle of
metrics.jsonl is reported as file:line, `run.name` stays inside `run.out_dir`, and a file system that
turns read-only mid-run loses no finished step. All through the real CLI entry point."""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bad_input import one_line_error
from conftest import _micro_sets
from tokencredit import cli
from tokencredit.errors import ConfigError
from tokencredit.train.lock import RunLock
from tokencredit.train.rundir import MetricsLog, RunDir


def _args(sets: list[str]) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def _snapshot(d: Path) -> dict[str, str]:
    """Every file under `d` with its SHA-256 (the lock file aside: it holds the last holder's pid)."""
    return {
        str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(d.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def _steps(run: Path) -> list[int]:
    return [r["step"] for r in MetricsLog(run / "metrics.jsonl").read() if r.get("type") != "eval"]


@pytest.fixture
def finished(tiny_model_dir, micro_sets, tmp_path):
    """(a finished 2-step micro run, its --set arguments)."""
    sets = _args(micro_sets(tiny_model_dir, steps=2))
    run = tmp_path / "run"
    assert cli.main(["train", "--recipe", "strace", "--out", str(run), *sets]) == 0
    return run, sets


def test_out_on_a_run_stops_before_anything_is_written(finished, capsys):
    run, sets = finished
    before = _snapshot(run)
    line = one_line_error(["train", "--recipe", "grpo", "--out", str(run), *sets], capsys)
    assert (
        f"--out {run} already holds a run (2 steps logged, checkpoints up to step 2, a final model)" in line
    )
    assert f"tokencredit train --resume {run}" in line and "--overwrite" in line
    assert _snapshot(run) == before  # nothing truncated, nothing rewritten


def test_overwrite_replaces_the_old_run_whole(finished, tmp_path):
    run, sets = finished
    assert RunDir(run).checkpoint_steps() == [1, 2]
    assert (
        cli.main(
            ["train", "--recipe", "strace", "--out", str(run), "--overwrite", *sets, "--set", "run.steps=1"]
        )
        == 0
    )
    assert RunDir(run).checkpoint_steps() == [1] and _steps(run) == [1]  # no checkpoint of the old run stays
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # the old copy is gone too
    assert (
        cli.main(["train", "--resume", str(run), "--set", "run.steps=2"]) == 0
    )  # and the new one resumes as itself
    assert _steps(run) == [1, 2]


def test_overwrite_never_removes_a_folder_of_other_files(tmp_path, tiny_model_dir, micro_sets, capsys):
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "chapter1.tex").write_text("precious")
    (mine / "config.toml").write_text("")
    line = one_line_error(
        ["train", "--out", str(mine), "--overwrite", *_args(micro_sets(tiny_model_dir))],
        capsys,
        names=[str(mine)],
    )
    assert "replaces only a tokencredit run directory, and this one holds chapter1.tex" in line
    assert (mine / "chapter1.tex").read_text() == "precious"


def test_out_on_a_folder_that_is_not_a_run(tmp_path, tiny_model_dir, micro_sets, capsys):
    d = tmp_path / "notes"
    d.mkdir()
    (d / "a.txt").write_text("x")
    line = one_line_error(["train", "--out", str(d), *_args(micro_sets(tiny_model_dir))], capsys)
    assert f"--out {d} is not empty (1 entries: a.txt) and is not a tokencredit run directory" in line


@pytest.mark.parametrize("where", ["file", "under a file"])
def test_out_that_is_a_file_or_cannot_be_made(where, tmp_path, tiny_model_dir, micro_sets, capsys):
    f = tmp_path / "notes.txt"
    f.write_text("x")
    out = f if where == "file" else f / "run"
    expected = "is a file, not a directory" if where == "file" else f"cannot create it, {f} is a file"
    one_line_error(
        ["train", "--out", str(out), *_args(micro_sets(tiny_model_dir))], capsys, names=[str(out), expected]
    )
    assert f.read_text() == "x"


@pytest.mark.parametrize("name", ["/tmp/elsewhere", "../sibling", "a/../../b"])
def test_run_name_stays_inside_out_dir(name, tmp_path, tiny_model_dir, micro_sets, capsys):
    sets = _args(micro_sets(tiny_model_dir, **{"run.out_dir": tmp_path / "runs", "run.name": name}))
    one_line_error(
        ["train", *sets], capsys, names=["run.name must be a directory name inside run.out_dir", name]
    )
    assert not (tmp_path / "runs").exists() and not (tmp_path / "sibling").exists()


def test_a_second_writer_stops_naming_the_holder(finished, capsys):
    """The lock is held by another process (here a child that sleeps): --resume stops at once naming its
    pid; once the holder is killed with SIGKILL the OS has released the lock and the resume goes on."""
    run, _ = finished
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from tokencredit.train.lock import RunLock; "
            f"lock = RunLock({str(run)!r}); print('locked', flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = _snapshot(run)
        line = one_line_error(["train", "--resume", str(run), "--set", "run.steps=3"], capsys)
        assert f"{run} is in use by another tokencredit process (pid {holder.pid})" in line
        assert _snapshot(run) == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert cli.main(["train", "--resume", str(run), "--set", "run.steps=3"]) == 0 and _steps(run) == [1, 2, 3]


def test_the_lock_is_exclusive_within_one_process_too(tmp_path, capsys):
    first = RunLock(tmp_path)
    with pytest.raises(ConfigError, match=rf"in use by another tokencredit process \(pid {os.getpid()}\)"):
        RunLock(tmp_path)
    first.release()
    RunLock(tmp_path).release()  # free again


@pytest.mark.slow
def test_two_trainers_on_one_out_one_trains(tiny_model_dir, toy_rewards, tmp_path):
    """Two `tokencredit train` processes started together on one --out: one trains, the other stops with
    one line (the lock's holder, or the run the first one wrote), and the metrics are one run's."""
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([toy_rewards, os.environ.get("PYTHONPATH", "")])}
    env.pop("TOKENCREDIT_DEBUG", None)
    argv = [sys.executable, "-m", "tokencredit.cli", "train", "--recipe", "strace", "--out", str(run)]
    argv += _args(_micro_sets(tiny_model_dir, steps=2))
    procs = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in "ab"
    ]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 2], results
    err = next(e for rc, e in results if rc == 2)
    lines = [x for x in err.splitlines() if x.strip() and "%|" not in x]
    assert len(lines) == 1 and (
        "in use by another tokencredit process (pid " in lines[0] or "already holds a run" in lines[0]
    )
    assert _steps(run) == [1, 2]  # one run's lines, not two interleaved


def test_resume_when_every_checkpoint_fails_names_them(finished, capsys):
    run, _ = finished
    for p in (run / "checkpoints").glob("*.pt"):
        p.write_bytes(b"damaged")
    before = _snapshot(run)
    line = one_line_error(["train", "--resume", str(run)], capsys)
    assert f"--resume {run}: no checkpoint is usable (2 failed their digest or could not be read: " in line
    assert "step_000001.pt, step_000002.pt" in line
    assert _snapshot(run) == before  # metrics not truncated to step 0


def test_resume_reports_a_damaged_line_in_the_middle_of_the_metrics(finished, capsys):
    run, _ = finished
    path = run / "metrics.jsonl"
    lines = path.read_text().splitlines()
    lines[0] = lines[0][:-5]
    path.write_text("\n".join(lines) + "\n")
    line = one_line_error(["train", "--resume", str(run), "--set", "run.steps=3"], capsys)
    assert f"{path}:1: damaged line in the middle of the run's metrics (not JSON" in line


def test_a_file_system_turned_read_only_keeps_the_finished_steps(
    tiny_model_dir, micro_sets, tmp_path, full_disk, monkeypatch, capsys
):
    """EROFS on step 3's metrics line (as on a remount read-only): one line like the full disk's, every
    finished step kept, and --resume finishes the run once the directory is writable again."""
    sets = _args(micro_sets(tiny_model_dir, steps=3))
    run = tmp_path / "run"
    disk = full_disk(run, "metrics.jsonl", after=2, partial=0, err=errno.EROFS)
    line = one_line_error(["train", "--recipe", "strace", "--out", str(run), *sets], capsys, code=1)
    assert f"cannot write {run}/metrics.jsonl (Read-only file system); that write was undone" in line
    assert (
        f"last good checkpoint: step 2 in {run} (make the directory writable again, then continue with --resume)"
        in line
    )
    assert _steps(run) == [1, 2]
    disk.undo()  # writable again
    assert cli.main(["train", "--resume", str(run)]) == 0 and _steps(run) == [1, 2, 3]


def test_the_lock_is_released_when_a_run_ends(finished):
    run, _ = finished
    lock = RunLock(run)  # the trainer of `finished` no longer holds it
    lock.release()
    assert (run / ".lock").read_text().strip() == str(os.getpid())


def test_saved_rollouts_that_are_not_utf8_are_named_not_guessed(tmp_path):
    run = RunDir(tmp_path)
    run.rollouts_dir.mkdir()
    path = run.rollout_path(3)
    path.write_bytes(
        b'{"problem": "caf\xe9"}\n{"problem": "ok \xe2\x80\xa8 sep"}\n'
    )  # U+2028 inside a string is JSON
    skipped: list[str] = []
    assert run.read_rollouts(3, skipped) == [(2, {"problem": "ok \u2028 sep"})]
    assert skipped == [
        f"{path}:1: damaged group skipped (not UTF-8 text: byte 0xe9 at byte 17 of the line); "
        "the rest is used (1 group; repair or delete that line, or copy the file again, to silence this)"
    ]
    with pytest.raises(ConfigError, match=rf"{path}:1: damaged saved rollouts \(not UTF-8 text"):
        run.read_rollouts(3)

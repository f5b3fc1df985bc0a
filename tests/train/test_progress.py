"""The training progress bar keeps step/total and the ETA on an 80-column terminal (issue 31)."""

from __future__ import annotations

import io
import re

from rich.console import Console

from tokencredit.train.progress import StepProgress

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
REC = {
    "step": 3,
    "reward": 0.5,
    "accuracy": 0.375,
    "response_length": 61.2,
    "entropy": 0.31,
    "clip_frac": 0.012,
    "credit_gini": 0.204,
    "verify_timeouts": 2,
    "mc_continuations": 96,
    "mc_generated_tokens": 4100,
    "mc_seconds": 75.0,
}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _last_frame(text: str) -> list[str]:
    """The lines of the live display's last frame, without escape codes."""
    frame = ANSI.sub("", text.rsplit("\r", 1)[-1])
    return [line for line in frame.splitlines() if line.strip()]


def test_the_bar_shows_step_total_and_eta_at_80_columns():
    clock, out = Clock(), io.StringIO()
    console = Console(width=80, file=out, force_terminal=True, get_time=clock)
    with StepProgress(10, 2, console=console) as bar:  # resumed at step 2
        clock.now += 60.0  # a step longer than rich's 30 s speed window, as on any real model
        bar.update(REC)
        bar.progress.refresh()
    lines = _last_frame(out.getvalue())
    assert " 3/10 " in lines[0] and "0:01:00" in lines[0], lines  # step/total and elapsed
    assert "ETA 0:07:00" in lines[0], lines  # 7 steps left at 60 s each
    assert all(len(line) <= 80 for line in lines), lines
    below = " ".join(" ".join(lines[1:]).split())  # the metrics, wrapped on their own lines, none cut
    for part in ("reward 0.500", "acc 0.375", "gini 0.204", "verifier timeouts 2", "75s"):
        assert part in below, below


def test_the_eta_is_blank_before_the_first_step():
    out = io.StringIO()
    console = Console(width=80, file=out, force_terminal=True, get_time=Clock())
    with StepProgress(10, 0, console=console) as bar:
        bar.progress.refresh()
    assert "0/10" in _last_frame(out.getvalue())[0] and "ETA -:--:--" in _last_frame(out.getvalue())[0]


def test_plain_lines_carry_step_total_and_eta():
    clock, out = Clock(), io.StringIO()
    console = Console(width=80, file=out, get_time=clock)
    with StepProgress(10, 2, enabled=False, console=console) as bar:
        clock.now += 10.0
        bar.update(REC)
        clock.now += 10.0
        bar.update({"step": 4, "skipped": "every group's rewards are equal"})
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("step 3/10 (ETA 0:01:10): reward 0.500  acc 0.375"), lines
    assert lines[0].endswith("75s"), lines  # one line in a log file, not wrapped at the console's width
    assert lines[1] == "step 4/10 (ETA 0:01:00): skipped (every group's rewards are equal)", lines


class _FlushCounter(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.flushed_at: list[int] = []

    def flush(self) -> None:
        self.flushed_at.append(len(self.getvalue()))


def test_a_redirected_console_gets_one_flushed_line_per_step():
    """Output to a file or a pipe (nohup, Slurm, CI): a live bar would write nothing until the run ends,
    so the plain line of each step is written, and flushed, as the step ends."""
    clock, out = Clock(), _FlushCounter()
    console = Console(width=80, file=out, get_time=clock)  # not a terminal
    with StepProgress(10, 0, console=console) as bar:  # the bar asked for, as by default
        clock.now += 5.0
        bar.update(REC)
        first = out.getvalue()
        assert first.startswith("step 3/10 (ETA 0:00:45): reward 0.500") and first.count("\n") == 1, first
        assert out.flushed_at and out.flushed_at[-1] == len(first)  # on its way to the file already
        bar.update({**REC, "step": 4})
    assert out.getvalue().splitlines()[1].startswith("step 4/10"), out.getvalue()
    assert "━" not in out.getvalue()  # no bar drawn into the file

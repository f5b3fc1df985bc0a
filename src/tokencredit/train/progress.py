"""The per-step progress bar: reward, accuracy, response length, entropy, clip fraction, credit Gini.

The bar's line holds only what must always be seen (step/total, elapsed time, ETA: under 60 columns);
the step's metrics go on the line below, wrapped rather than cut, so an 80-column terminal keeps both.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text


def step_line(rec: dict[str, Any]) -> str:
    # Timed-out verifications scored 0 without being wrong answers: shown whenever there are any.
    n = rec.get("verify_timeouts", 0)
    timeouts = f"  verifier timeouts {n} (scored 0)" if n else ""
    if "skipped" in rec:
        return f"step {rec['step']}: skipped ({rec['skipped']}){timeouts}"
    # The Monte-Carlo recipes (oracle, vineppo) are expensive: their cost is on every line.
    mc = (
        f"  MC: {rec['mc_continuations']} continuations, {rec['mc_generated_tokens']} tokens, {rec['mc_seconds']:.0f}s"
        if "mc_continuations" in rec
        else ""
    )
    return (
        f"reward {rec['reward']:.3f}  acc {rec['accuracy']:.3f}  len {rec['response_length']:.1f}  "
        f"ent {rec['entropy']:.3f}  clip {rec.get('clip_frac', 0.0):.3f}  gini {rec['credit_gini']:.3f}{timeouts}{mc}"
    )


def eval_line(rec: dict[str, Any]) -> str:
    parts = [f"eval @ step {rec['step']}:"]
    for key in ("eval_greedy_accuracy", "eval_avg_at_k", "eval_mean_length"):
        if key in rec:
            parts.append(f"{key[5:]} {rec[key]:.3f}")
    if rec.get("eval_verify_timeouts"):
        parts.append(f"verifier timeouts {int(rec['eval_verify_timeouts'])} (scored 0)")
    return "  ".join(parts)


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "-:--:--"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def time_remaining(task: Task) -> float | None:
    """Seconds left at this session's mean time per step (None before its first step).

    Not rich's own estimate: that one keeps 30 s of samples, so steps longer than 30 s (any real
    model) never give it two samples and the ETA would stay blank for the whole run.
    """
    done = task.completed - task.fields.get("resumed_at", 0)
    if task.total is None or done <= 0 or not task.elapsed:
        return None
    return max(task.total - task.completed, 0) * task.elapsed / done


class EtaColumn(ProgressColumn):
    """'ETA 0:01:23' from `time_remaining`."""

    def render(self, task: Task) -> Text:
        return Text(f"ETA {_clock(time_remaining(task))}", style="progress.remaining")


class _TwoLineProgress(Progress):
    """The bar's columns on one line, the task description (the step's metrics) below it."""

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        for task in self.tasks:
            if task.description:
                yield Text(task.description, overflow="fold")


class StepProgress:
    """A rich progress bar with the latest step's metrics under it; plain lines, one per step and
    flushed, when disabled or when the console is not a terminal (output redirected to a file, a
    pipe, nohup, Slurm, CI: a live bar there writes nothing until it stops).

    Both forms always show step/total and the ETA. `console` (its `get_time` is the bar's clock)
    defaults to a new one.
    """

    def __init__(self, total: int, done: int, enabled: bool = True, console: Console | None = None) -> None:
        self.console = console or Console()
        self.enabled = enabled and self.console.is_terminal
        self.total = total
        self.progress = _TwoLineProgress(
            TextColumn("[bold]train"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            EtaColumn(),
            console=self.console,
            disable=not self.enabled,
        )
        self.task = self.progress.add_task("", total=total, completed=done, resumed_at=done)

    def __enter__(self) -> StepProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def update(self, rec: dict[str, Any]) -> None:
        line = step_line(rec)
        self.progress.update(self.task, advance=1, description=line)
        if not self.enabled:
            task = next(t for t in self.progress.tasks if t.id == self.task)
            what = line.removeprefix(f"step {rec['step']}: ")  # a skipped step's line names it already
            # soft_wrap: one line per step in a log file, whatever the console's width
            self.console.print(
                f"step {rec['step']}/{self.total} (ETA {_clock(time_remaining(task))}): {what}",
                soft_wrap=True,
            )

    def note(self, rec: dict[str, Any]) -> None:
        self.console.print(eval_line(rec))

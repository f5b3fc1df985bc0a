"""The per-step progress bar: reward, accuracy, response length, entropy, clip fraction, credit Gini."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


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


class StepProgress:
    """A rich progress bar whose description is the latest step's metrics (plain lines when disabled)."""

    def __init__(self, total: int, done: int, enabled: bool = True, console: Console | None = None) -> None:
        self.console = console or Console()
        self.enabled = enabled
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.description}"),
            console=self.console,
            disable=not enabled,
        )
        self.task = self.progress.add_task("", total=total, completed=done)

    def __enter__(self) -> StepProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def update(self, rec: dict[str, Any]) -> None:
        line = step_line(rec)
        self.progress.update(self.task, advance=1, description=line)
        if not self.enabled:
            self.console.print(f"step {rec['step']}: {line}")

    def note(self, rec: dict[str, Any]) -> None:
        self.console.print(eval_line(rec))

"""What a run reports: each step's metrics record, the end-of-run summary, its table and `curves.png`."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
from rich.table import Table

from tokencredit import diagnostics
from tokencredit.atomic import atomic_write_bytes
from tokencredit.batch import RolloutBatch
from tokencredit.recipes import TokenCredit
from tokencredit.train.sampling import StepRollouts
from tokencredit.train.update import UpdateStats

__all__ = ["plot_curves", "run_summary", "step_record", "summary_table"]


def step_record(
    step: int,
    ro: StepRollouts,
    batch: RolloutBatch,
    credit: TokenCredit,
    upd: UpdateStats,
    times: dict[str, float],
    lr: float,
) -> dict[str, Any]:
    """The metrics.jsonl line of a trained step: rollouts, timing, the objective's metrics and the
    credit diagnostics of the effective credit each token got (`TokenCredit.effective`)."""
    mask = batch.mask
    lengths = mask.sum(-1).float()
    n_tokens = int(lengths.sum())
    ent = batch.entropy[mask].mean() if batch.entropy is not None and bool(mask.any()) else torch.tensor(0.0)
    busy = times["generate"] + times["signals"] + times["update"]
    return {
        "step": step,
        "rollouts": len(ro),
        "gen_rounds": ro.rounds,
        "reward": float(ro.scores.mean()),
        "accuracy": float(ro.correct.float().mean()),
        "verify_timeouts": ro.verify_timeouts,
        "generated_tokens": ro.generated_tokens,
        **ro.mc_cost,
        "response_length": float(lengths.mean()),
        "truncated": float(ro.truncated.float().mean()),
        "entropy": float(ent),
        "lr": lr,
        "grad_norm": upd.grad_norm,
        "time_generate": times["generate"],
        "time_signals": times["signals"],
        "time_update": times["update"],
        "tokens": n_tokens,
        "tokens_per_s": n_tokens / max(1e-9, busy),
        **upd.metrics,
        **diagnostics.summary(credit.effective(), mask, credit.seq_advantages, batch.entropy),
    }


def run_summary(
    history: list[dict[str, Any]],
    *,
    run_dir: Path,
    recipe: str,
    steps_done: int,
    seconds: float,
    final_model: Path,
    eval_split: str = "heldout",
) -> dict[str, Any]:
    """summary.json: the first and last evaluation (of `eval_split`, data.eval_split: heldout or
    validation), wall time, throughput, the exported model."""
    evals = [h for h in history if h.get("type") == "eval"]
    steps = [h for h in history if h.get("type") != "eval" and "reward" in h]
    busy = sum(s["time_generate"] + s["time_signals"] + s["time_update"] for s in steps)
    return {
        "run_dir": str(run_dir),
        "recipe": recipe,
        "steps": steps_done,
        "eval_split": eval_split,
        "seconds": seconds,
        "base": evals[0] if evals else None,
        "final": evals[-1] if evals else None,
        "tokens_per_s": sum(s["tokens"] for s in steps) / max(1e-9, busy) if steps else 0.0,
        "mean_response_length": steps[-1]["response_length"] if steps else 0.0,
        "final_model": str(final_model),
    }


def plot_curves(history: list[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Four panels: held-out accuracy, training reward/accuracy, response length, credit Gini + entropy."""
    import matplotlib  # optional dependency of the figure only: imported when a figure is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h for h in history if h.get("type") != "eval" and "reward" in h]
    evals = [h for h in history if h.get("type") == "eval"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    ax = axes[0, 0]
    for key, label in (("eval_greedy_accuracy", "greedy"), ("eval_avg_at_k", "avg@k")):
        pts = [(e["step"], e[key]) for e in evals if key in e]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=label)
    ax.set_title("held-out accuracy")
    ax.set_xlabel("step")
    ax.set_ylim(0, 1)
    ax.legend()
    ax = axes[0, 1]
    x = [s["step"] for s in steps]
    ax.plot(x, [s["reward"] for s in steps], label="reward", alpha=0.8)
    ax.plot(x, [s["accuracy"] for s in steps], label="accuracy", alpha=0.8)
    ax.set_title("training rollouts")
    ax.set_xlabel("step")
    ax.legend()
    ax = axes[1, 0]
    ax.plot(x, [s["response_length"] for s in steps], color="tab:purple")
    ax.set_title("mean response length (tokens)")
    ax.set_xlabel("step")
    ax = axes[1, 1]
    ax.plot(x, [s["credit_gini"] for s in steps], label="credit Gini (|Â|)", color="tab:red")
    ax.plot(x, [s["entropy"] for s in steps], label="entropy (nats)", color="tab:green")
    ax.set_title("credit concentration and entropy")
    ax.set_xlabel("step")
    ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    buf = io.BytesIO()
    fig.savefig(buf, dpi=110, format="png")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())  # a full disk leaves no torn image
    return path


def summary_table(summary: dict[str, Any], steps: list[dict[str, Any]]) -> Table:
    """Base vs final held-out (or validation: summary["eval_split"]) accuracy, response length, time, tokens/s."""
    t = Table(title=f"tokencredit train: {summary['recipe']}, {summary['steps']} steps")
    t.add_column("")
    t.add_column("start", justify="right")
    t.add_column("final", justify="right")
    t.add_column("change", justify="right")
    base, final = summary.get("base") or {}, summary.get("final") or {}
    split = "validation" if summary.get("eval_split") == "validation" else "held-out"
    for key, label in (
        ("eval_greedy_accuracy", f"{split} greedy accuracy"),
        ("eval_avg_at_k", f"{split} avg@k"),
        ("eval_mean_length", f"{split} response length"),
    ):
        if key in base and key in final:
            t.add_row(label, f"{base[key]:.3f}", f"{final[key]:.3f}", f"{final[key] - base[key]:+.3f}")
    t.add_row("wall-clock", "", f"{summary['seconds']:.0f} s", "")
    t.add_row("tokens/s (rollout + update)", "", f"{summary['tokens_per_s']:.0f}", "")
    return t

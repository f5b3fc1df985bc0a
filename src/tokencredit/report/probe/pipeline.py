"""The probe of one model, and of each probed point: sample -> ground truth -> scores.

The three stages stay separate (`sample`, `truth`, `score`) so that another ground truth (e.g. a
Monte-Carlo estimate of each token's advantage on a data set with a verifier) can be scored on
the same sampled batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tokencredit.models import special_token_ids
from tokencredit.report.methods import MethodSpec, needed_signals
from tokencredit.report.probe.config import ProbeConfig
from tokencredit.report.probe.points import ProbePoint
from tokencredit.report.probe.sample import (
    heldout_problems,
    rollout_batch,
    rollout_signals,
    sample_rollouts,
)
from tokencredit.report.probe.score import probe_batch, score_baselines
from tokencredit.report.probe.truth import build_truth, rollout_summary
from tokencredit.signals import has_lora_adapter

__all__ = ["probe_model", "probe_points"]


def probe_model(
    model: Any,
    tokenizer: Any,
    specs: Sequence[MethodSpec],
    cfg: ProbeConfig,
    *,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Sample `cfg.groups` x `cfg.group_size` rollouts of held-out synthetic problems with `model`,
    compute every method's credit on them (signals in one pass) and score it; returns the point's
    result: {"rollouts": summary, "methods": {...}, "baselines": {...}}."""
    say = log or (lambda _msg: None)
    lora = has_lora_adapter(model)
    needs = needed_signals(specs, lora=lora)
    problems = heldout_problems(cfg)
    say(f"sampling {cfg.groups} x {cfg.group_size} rollouts ...")
    ro = sample_rollouts(model, tokenizer, problems, cfg)
    rows = [problems[int(i)] for i in ro.prompt_index]
    signals = rollout_signals(model, tokenizer, ro, rows, needs, cfg, log=say)
    truth, truths = build_truth(rows, ro.response_ids, ro.response_mask, ro.prompt_index, tokenizer)
    batch = rollout_batch(ro, truth.correct.float(), signals)
    say("scoring credit ...")
    return {
        "rollouts": rollout_summary(truth, truths),
        "methods": probe_batch(
            batch, truth, specs, ks=cfg.ks, lora=lora, special_ids=special_token_ids(tokenizer)
        ),
        "baselines": score_baselines(truth, cfg.ks, draws=cfg.random_draws, seed=cfg.seed),
    }


def probe_points(
    points: Sequence[ProbePoint],
    specs: Sequence[MethodSpec],
    cfg: ProbeConfig,
    *,
    log: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """`probe_model`'s result for every point, with its label, source and step; one model in memory at a time."""
    say = log or (lambda _msg: None)
    out: list[dict[str, Any]] = []
    for p in points:
        say(f"{p.label}: loading {p.source}")
        model, tokenizer = p.load()
        res = probe_model(model, tokenizer, specs, cfg, log=lambda m, lab=p.label: say(f"{lab}: {m}"))
        out.append({"label": p.label, "source": p.source, "step": p.step, **res})
        del model
    return out

"""Sampling for the probe: held-out problems (of the synthetic task or a data set), groups of
rollouts and their per-token signals.

Nothing here knows the ground truth or the metrics: a rollout batch is sampled and its signals
(one no-grad pass, only those the methods need) are computed; `tokencredit.probe.pipeline`
puts truth and scores on top.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from tokencredit.batch import MC_SIGNALS
from tokencredit.builder import ScoredRollouts
from tokencredit.data.synthetic import ArithmeticTask
from tokencredit.data.templates import render
from tokencredit.errors import ConfigError
from tokencredit.evaluation import load_benchmark
from tokencredit.oracle import MCSettings, mc_signals
from tokencredit.probe.config import ProbeConfig
from tokencredit.rollout import Rollouts, generate

__all__ = [
    "data_problems",
    "heldout_problems",
    "mc_column_signals",
    "probe_problems",
    "scored",
    "sample_rollouts",
    "select_rollouts",
]


def heldout_problems(cfg: ProbeConfig) -> list[Any]:
    """`cfg.groups` held-out problems of the synthetic task (`cfg.seed` picks them)."""
    task_kw = {} if cfg.operand_digits is None else {"operand_digits": cfg.operand_digits}
    task = ArithmeticTask(difficulty=cfg.difficulty, digits=cfg.digits, seed=cfg.seed, **task_kw)
    return task.sample(cfg.groups, "heldout")


def data_problems(cfg: ProbeConfig) -> list[Any]:
    """min(`cfg.groups`, all) problems of the benchmark or data file `cfg.data`, drawn without
    replacement (`cfg.seed` picks them), in file order."""
    problems = load_benchmark(cfg.data, None)
    if not problems:
        raise ConfigError(f"--data {cfg.data}: no problems")
    g = torch.Generator().manual_seed(cfg.seed)
    keep = sorted(torch.randperm(len(problems), generator=g)[: cfg.groups].tolist())
    return [problems[i] for i in keep]


def probe_problems(cfg: ProbeConfig) -> list[Any]:
    """The problems the probe samples: the synthetic task's held-out problems or `data_problems`."""
    return heldout_problems(cfg) if cfg.synthetic else data_problems(cfg)


def sample_rollouts(model: Any, tokenizer: Any, problems: Sequence[Any], cfg: ProbeConfig) -> Rollouts:
    """`cfg.group_size` completions of every problem (its `.problem` text rendered with `cfg.template`),
    sampled with `cfg.sampling` under `cfg.seed`."""
    prompts = [render(cfg.template, p.problem, tokenizer) for p in problems]
    return generate(model, tokenizer, prompts, cfg.group_size, sampling=cfg.sampling, seed=cfg.seed)


def scored(ro: Rollouts, scores: Tensor) -> ScoredRollouts:
    """The sampled rollouts with `scores` [N] (the reward), each prompt's samples a group, for the batch builder."""
    return ScoredRollouts(
        response_ids=ro.response_ids,
        response_mask=ro.response_mask,
        group_ids=ro.prompt_index.long(),
        scores=scores,
        truncated=ro.truncated,
        prompt_ids=ro.prompt_ids,
        prompt_mask=ro.prompt_mask,
    )


def select_rollouts(ro: Rollouts, rows: Tensor) -> Rollouts:
    """The rollouts at indices `rows` [M] int64 (same padding widths), e.g. for the oracle to estimate."""
    idx = rows.long().cpu()
    return replace(
        ro,
        prompt_ids=ro.prompt_ids[idx],
        prompt_mask=ro.prompt_mask[idx],
        response_ids=ro.response_ids[idx],
        response_mask=ro.response_mask[idx],
        truncated=ro.truncated[idx],
        texts=[ro.texts[i] for i in idx.tolist()],
        prompt_index=ro.prompt_index[idx],
    )


def mc_column_signals(
    model: Any,
    tokenizer: Any,
    ro: Rollouts,
    golds: Sequence[Any],
    reward_fn: Callable[[Sequence[str], Sequence[Any]], Sequence[float]],
    rows: Tensor,
    needs: set[str],
    cfg: ProbeConfig,
    *,
    old_log_probs: Tensor | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The Monte-Carlo signals of the `oracle` / `vineppo` columns (`needs` & MC_SIGNALS), estimated
    with the trainer's default settings (`MCSettings`) and the probe's sampling, on the rollouts where
    `rows` (bool [N]) holds (the mixed groups the metrics score) and 0 on the others: ({name: [N,T]
    float32}, cost with "rows"). golds[i]: rollout i's gold for `reward_fn`."""
    wanted = set(needs) & set(MC_SIGNALS)
    idx = rows.bool().cpu().nonzero().squeeze(1)
    full = {s: torch.zeros(ro.response_ids.shape, dtype=torch.float32) for s in wanted}
    if not wanted or not idx.numel():
        return full, {"rows": 0}
    got, cost = mc_signals(
        model,
        tokenizer,
        select_rollouts(ro, idx),
        [golds[i] for i in idx.tolist()],
        reward_fn,
        wanted,
        sampling=cfg.sampling,
        settings=MCSettings(batch_size=cfg.sampling.batch_size),
        old_log_probs=None if old_log_probs is None else old_log_probs.cpu()[idx],
        seed=cfg.seed,
        log=log,
    )
    for s, v in got.items():
        full[s][idx] = v
    return full, {"rows": int(idx.numel()), **cost.as_dict()}

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
    "group_problems",
    "mc_column_signals",
    "paired_groups",
    "probe_problems",
    "problem_and_copy",
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
    sampled with `cfg.sampling` under `cfg.seed`; `prompt_index` [N] is each rollout's group. With
    `cfg.two_groups`, 2 x group_size completions of each problem, split into two independent groups of
    group_size: problem p's are groups 2p and 2p + 1 (`problem_and_copy`)."""
    prompts = [render(cfg.template, p.problem, tokenizer) for p in problems]
    n = cfg.group_size * (2 if cfg.two_groups else 1)
    ro = generate(model, tokenizer, prompts, n, sampling=cfg.sampling, seed=cfg.seed)
    if not cfg.two_groups:
        return ro
    return replace(ro, prompt_index=paired_groups(ro.prompt_index, cfg.group_size))


def paired_groups(prompt_index: Tensor, group_size: int) -> Tensor:
    """[N] int64 group ids 2p + c of rollouts of prompts `prompt_index` [N] sampled 2 x group_size times
    each: c = 0 for a prompt's first group_size rollouts (in row order), 1 for the others."""
    idx = prompt_index.long().cpu()
    order = torch.argsort(idx, stable=True)
    sorted_idx = idx[order]
    starts = torch.searchsorted(sorted_idx, sorted_idx, right=False)
    rank = torch.empty_like(idx)
    rank[order] = torch.arange(idx.numel()) - starts
    return 2 * idx + (rank >= group_size).long()


def problem_and_copy(group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """(problem [N], copy [N] in {0, 1}) of the group ids of `paired_groups`."""
    g = group_ids.long().cpu()
    return g // 2, g % 2


def group_problems(ro: Rollouts, problems: Sequence[Any], cfg: ProbeConfig) -> list[Any]:
    """Each rollout's problem, from its group id (`sample_rollouts`)."""
    div = 2 if cfg.two_groups else 1
    return [problems[int(i) // div] for i in ro.prompt_index]


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

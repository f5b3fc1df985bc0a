"""The trainer's data side of a step: which problems, the rollouts sampled for them, their rewards.

`PromptSampler` is a deterministic, resumable stream of training problems. `sample_round` samples
G completions for each of P prompts and scores them; `collect` is one step's rollouts, with DAPO's
dynamic sampling (keep only groups whose rewards differ, resample up to a limit). `StepRollouts`
holds the result (prompts left-padded, responses right-padded, one row per completion).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from tokencredit import rollout
from tokencredit.errors import ConfigError, TrainingError
from tokencredit.evaluation import EvalSettings
from tokencredit.rewards import Reward, format_reward, overlong_penalty
from tokencredit.rewards.custom import RewardError
from tokencredit.rollout import PromptResponseLayout, SamplingSettings
from tokencredit.train.config import RolloutConfig, TrainConfig

__all__ = [
    "PromptSampler",
    "StepRollouts",
    "collect",
    "informative_rows",
    "rollout_sampling",
    "sample_round",
    "seed_for",
    "with_greedy_baselines",
    "with_mc_signals",
]


def seed_for(*parts: int) -> int:
    """A deterministic 31-bit seed from integers (run seed, step, round...); FNV-1a mixing."""
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFFFFFF)) * 1099511628211) % (1 << 64)
    return h % (2**31 - 1)


def run_eval_settings(cfg: TrainConfig) -> EvalSettings:
    """The settings of a run's held-out evaluations (the trainer's, and ``tokencredit eval RUN_DIR``'s
    defaults): ``eval.samples`` samples at ``eval.temperature`` / ``eval.top_p``, the rollouts'
    ``max_new_tokens``, ``eval.batch_size`` sequences per generate call, ``data.template``, and a seed
    derived from ``run.seed``, so that the same model gets the same numbers from either."""
    e = cfg.eval
    sampling = SamplingSettings(
        temperature=e.temperature,
        top_p=e.top_p,
        max_new_tokens=cfg.rollout.max_new_tokens,
        batch_size=e.batch_size,
    )
    return EvalSettings(
        samples=e.samples, sampling=sampling, template=cfg.data.template, seed=seed_for(cfg.run.seed, 31337)
    )


def rollout_sampling(c: RolloutConfig) -> SamplingSettings:
    """The sampling settings of a run's rollouts (`c`: its `[rollout]` table): temperature, top_p,
    max_new_tokens, and generation_batch_size rows per generate call (0 = all at once)."""
    return SamplingSettings(
        temperature=c.temperature,
        top_p=c.top_p,
        max_new_tokens=c.max_new_tokens,
        batch_size=c.generation_batch_size or None,
    )


class PromptSampler:
    """Deterministic, resumable stream of training problems: shuffled epochs, cursor in the checkpoint."""

    def __init__(self, problems: list[Any], seed: int) -> None:
        if not problems:
            raise ConfigError("data.train: no training problems")
        self.problems, self.seed, self.cursor = problems, seed, 0

    def take(self, n: int) -> list[Any]:
        out = []
        for _ in range(n):
            epoch, pos = divmod(self.cursor, len(self.problems))
            g = torch.Generator().manual_seed(seed_for(self.seed, 7, epoch))
            out.append(self.problems[int(torch.randperm(len(self.problems), generator=g)[pos])])
            self.cursor += 1
        return out


@dataclass
class StepRollouts(PromptResponseLayout):
    """One step's rollouts, merged over generation rounds (prompt left-padded, response right-padded).

    problems: one per row; group_ids [N] int64 (rows answering the same prompt of the same round);
    scores [N] float32 (correctness + format + overlong shaping); correct [N] bool (the verifier's
    verdict alone); timed_out [N] bool (the verifier did not finish in time: correct is False for
    that reason, not a wrong answer); truncated [N] bool; rounds: generation rounds this step took;
    verify_timeouts: timed-out verifications over every round of the step (dropped groups included);
    generated_tokens: response tokens sampled over every round (dropped groups and ReMax's greedy
    baseline rollouts included): the step's generation cost; baseline_scores [N] float32 or None:
    ReMax's baseline, the score of one greedy rollout of each row's prompt.
    """

    problems: list[Any]
    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    response_mask: Tensor
    truncated: Tensor
    texts: list[str]
    group_ids: Tensor
    scores: Tensor
    correct: Tensor
    timed_out: Tensor
    rounds: int = 1
    verify_timeouts: int = 0
    generated_tokens: int = 0
    baseline_scores: Tensor | None = None
    mc_signals: dict[str, Tensor] = field(default_factory=dict)
    mc_cost: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.texts)

    def select(self, rows: Tensor) -> StepRollouts:
        """The rows where `rows` (bool [N]) is True."""
        idx = rows.nonzero().flatten()
        keep = idx.tolist()
        return replace(
            self,
            problems=[self.problems[i] for i in keep],
            texts=[self.texts[i] for i in keep],
            **{f: getattr(self, f)[idx] for f in _ROW_TENSORS},
            baseline_scores=None if self.baseline_scores is None else self.baseline_scores[idx],
            mc_signals={k: v[idx] for k, v in self.mc_signals.items()},
        )


_ROW_TENSORS = (
    "prompt_ids",
    "prompt_mask",
    "response_ids",
    "response_mask",
    "truncated",
    "group_ids",
    "scores",
    "correct",
    "timed_out",
)


def _pad_cat(tensors: list[Tensor], value: int | bool, left: bool) -> Tensor:
    """Concatenate [n_i, L_i] tensors along rows, padding columns to the widest (left or right)."""
    width = max(t.shape[1] for t in tensors)
    padded = []
    for t in tensors:
        pad = torch.full((t.shape[0], width - t.shape[1]), value, dtype=t.dtype, device=t.device)
        padded.append(torch.cat([pad, t] if left else [t, pad], dim=1))
    return torch.cat(padded)


def _merge(parts: list[StepRollouts], pad_id: int) -> StepRollouts:
    return StepRollouts(
        problems=[p for r in parts for p in r.problems],
        prompt_ids=_pad_cat([r.prompt_ids for r in parts], pad_id, left=True),
        prompt_mask=_pad_cat([r.prompt_mask for r in parts], False, left=True),
        response_ids=_pad_cat([r.response_ids for r in parts], pad_id, left=False),
        response_mask=_pad_cat([r.response_mask for r in parts], False, left=False),
        truncated=torch.cat([r.truncated for r in parts]),
        texts=[t for r in parts for t in r.texts],
        group_ids=torch.cat([r.group_ids for r in parts]),
        scores=torch.cat([r.scores for r in parts]),
        correct=torch.cat([r.correct for r in parts]),
        timed_out=torch.cat([r.timed_out for r in parts]),
        rounds=parts[-1].rounds,
    )


def sample_round(
    model: Any,
    tokenizer: Any,
    problems: list[Any],
    prompts: list[str],
    *,
    group_size: int,
    reward: Reward,
    format_weight: float,
    overlong_buffer: int,
    sampling: SamplingSettings,
    seed: int,
    group_offset: int,
    step: int,
) -> StepRollouts:
    """G = `group_size` completions for each prompt, scored: score = verifier reward (+ format reward
    x `format_weight`) (+ DAPO's overlong penalty with buffer `overlong_buffer`, 0 = off).

    `sampling`: how `tokencredit.rollout.generate` samples (`seed` seeds it; its max_new_tokens is the
    overlong penalty's limit).
    Group ids are the prompt's index plus `group_offset` (distinct across resampling rounds). A
    completion the verifier could not judge in time scores 0 and is marked in `timed_out`.
    """
    try:
        ro = rollout.generate(model, tokenizer, prompts, group_size, sampling=sampling, seed=seed)
    except RuntimeError as e:
        # torch.multinomial refuses a NaN/inf sampling distribution: the model's logits are not finite
        if "inf" in str(e) and "nan" in str(e):
            raise TrainingError(f"step {step + 1}: non-finite logits while sampling rollouts ({e})") from e
        raise
    rows = [problems[int(i)] for i in ro.prompt_index]
    try:
        # what TRL's contract passes besides the texts, gathered only for a module:function reward
        context: dict[str, Any] = {}
        if reward.user is not None:
            context = {
                "prompts": [prompts[int(i)] for i in ro.prompt_index],
                "completion_ids": [r[m].tolist() for r, m in zip(ro.response_ids, ro.response_mask.bool())],
                "problems": rows,
                "step": step,
            }
        verdicts = reward.verify(ro.texts, [p.answer for p in rows], **context)
    except RewardError as e:  # the reward function's output names the bad rollout
        raise TrainingError(f"step {step + 1}: {e}") from e
    raw = torch.tensor(verdicts.scores, dtype=torch.float32)
    scores = raw
    if format_weight:
        scores = scores + format_weight * torch.tensor(format_reward(ro.texts), dtype=torch.float32)
    if overlong_buffer > 0:
        lengths = ro.response_mask.sum(-1)
        scores = scores + overlong_penalty(lengths, sampling.max_new_tokens, overlong_buffer).float()
    return StepRollouts(
        problems=rows,
        prompt_ids=ro.prompt_ids,
        prompt_mask=ro.prompt_mask.bool(),
        response_ids=ro.response_ids,
        response_mask=ro.response_mask.bool(),
        truncated=ro.truncated.bool(),
        texts=list(ro.texts),
        group_ids=ro.prompt_index.long() + group_offset,
        scores=scores,
        correct=raw > 0,
        timed_out=torch.tensor(verdicts.timed_out, dtype=torch.bool),
        verify_timeouts=verdicts.timeouts,
        generated_tokens=int(ro.response_mask.sum()),
    )


def informative_rows(ro: StepRollouts) -> Tensor:
    """bool [N]: rows of groups whose scores are not all equal (DAPO's dynamic-sampling filter)."""
    _, inv = torch.unique(ro.group_ids, return_inverse=True)
    n = int(inv.max()) + 1
    lo = torch.full((n,), float("inf")).scatter_reduce(0, inv, ro.scores, "amin")
    hi = torch.full((n,), float("-inf")).scatter_reduce(0, inv, ro.scores, "amax")
    return (hi > lo)[inv]


def collect(
    sample: Callable[[int], StepRollouts], *, groups: int, dynamic: bool, max_rounds: int, pad_id: int
) -> StepRollouts:
    """One step's rollouts from `sample(round)`; with `dynamic` (DAPO) only informative groups are kept,
    resampling (up to `max_rounds` more rounds) until `groups` of them are found. May be empty.
    `verify_timeouts` of the result counts every round's timed-out verifications."""
    first = sample(0)
    if not dynamic:
        return first
    parts, n_groups, rnd, cur = [], 0, 0, first
    timeouts = tokens = 0
    while True:
        timeouts += cur.verify_timeouts
        tokens += cur.generated_tokens
        informative = informative_rows(cur)
        if bool(informative.any()):
            parts.append(cur.select(informative))
            n_groups += int(torch.unique(cur.group_ids[informative]).numel())
        rnd += 1
        if n_groups >= groups or rnd > max_rounds:
            break
        cur = sample(rnd)
    if not parts:
        empty = first.select(torch.zeros(len(first), dtype=torch.bool))
        return replace(empty, rounds=rnd, verify_timeouts=timeouts, generated_tokens=tokens)
    merged = _merge(parts, pad_id)
    keep_groups = torch.unique(merged.group_ids, sorted=False)[:groups]
    kept = merged.select(torch.isin(merged.group_ids, keep_groups))
    return replace(kept, rounds=rnd, verify_timeouts=timeouts, generated_tokens=tokens)


def with_greedy_baselines(
    ro: StepRollouts, sample_greedy: Callable[[list[Any]], StepRollouts]
) -> StepRollouts:
    """`ro` with ReMax's baseline_scores: `sample_greedy(problems)` samples one greedy (temperature 0)
    rollout per distinct prompt, scored as the rollouts are; each row gets its prompt's score."""
    _, inv = torch.unique(ro.group_ids, return_inverse=True)
    first = torch.full((int(inv.max()) + 1,), len(ro), dtype=torch.long).scatter_reduce(
        0, inv, torch.arange(len(ro)), "amin"
    )
    greedy = sample_greedy([ro.problems[int(i)] for i in first])
    return replace(
        ro,
        baseline_scores=greedy.scores[inv].float(),
        generated_tokens=ro.generated_tokens + greedy.generated_tokens,
    )


def with_mc_signals(
    ro: StepRollouts, estimate: Callable[[StepRollouts], tuple[dict[str, Tensor], Any]]
) -> StepRollouts:
    """`ro` with the Monte-Carlo signals `estimate(ro)` returns (values of the policy's own prefixes, sampled
    with continuations: `tokencredit.oracle.mc_signals`), their cost, and its tokens counted as generated."""
    values, cost = estimate(ro)
    mc_cost = {f"mc_{k}": v for k, v in cost.as_dict().items()}
    return replace(
        ro, mc_signals=values, mc_cost=mc_cost, generated_tokens=ro.generated_tokens + cost.generated_tokens
    )

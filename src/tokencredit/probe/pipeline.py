"""The probe of one model, and of each probed point: sample -> ground truth -> scores.

The stages stay separate (`sample`, `truth`, `score`, `fidelity`) so that both ground truths are
scored on the same sampled batch: the synthetic task's checker (the first wrong token) and, with
`cfg.oracle_k` > 0, the Monte-Carlo estimate of each token's advantage A*, which needs only a
verifier and so also works on benchmark data (where it is the only truth).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from tokencredit.batch import RolloutBatch
from tokencredit.builder import (
    Needs,
    Passes,
    ScoredRollouts,
    build_batch,
    forward_signals,
    needs_of,
    rendered_negative_prompts,
)
from tokencredit.columns import MethodCredit, MethodSpec, resolve_methods
from tokencredit.critic import TrainedCritic
from tokencredit.models import special_token_ids
from tokencredit.probe.config import ProbeConfig
from tokencredit.probe.fidelity import ProbeOracle, oracle_section, run_oracle
from tokencredit.probe.gradients import gradient_fidelity, with_gradient_columns
from tokencredit.probe.points import ProbePoint
from tokencredit.probe.precondition import AdamMoments
from tokencredit.probe.sample import (
    group_problems,
    mc_column_signals,
    probe_problems,
    problem_and_copy,
    sample_rollouts,
    scored,
)
from tokencredit.probe.score import method_credits, score_baselines, score_methods, training_batches
from tokencredit.probe.truth import (
    ProbeTruth,
    build_truth,
    checker_reward,
    mixed_rows,
    rollout_summary,
)
from tokencredit.rewards import Reward, check_rewards
from tokencredit.rollout import Rollouts
from tokencredit.signals import has_lora_adapter

__all__ = ["REWARD_NAMES", "credit_batches", "probe_model", "probe_points", "verifier_summary"]

REWARD_NAMES = {True: "the task's checker", False: "the problems' own checker (reasoning-gym) or math-verify"}
"""The reward of the rollouts and of the oracle's continuations, by `ProbeConfig.synthetic`."""


def _reward(cfg: ProbeConfig) -> AbstractContextManager[Any]:
    """The reward function: the synthetic task's checker, or each problem's own verifier ("auto":
    reasoning-gym data by its checker, everything else by math-verify; closed on exit)."""
    return nullcontext(checker_reward) if cfg.synthetic else Reward("auto")


def verifier_summary(group_ids: Tensor, scores: Tensor, mask: Tensor) -> dict[str, Any]:
    """Counts of rollouts scored by a verifier only (no checker truth): rollouts, groups, accuracy
    (mean reward), mixed groups and their rollouts, mean length."""
    mixed = mixed_rows(group_ids, scores)
    n = int(scores.numel())
    return {
        "rollouts": n,
        "groups": int(torch.unique(group_ids).numel()),
        "accuracy": float(scores.double().mean()) if n else 0.0,
        "mixed_groups": int(torch.unique(group_ids[mixed]).numel()),
        "mixed_rollouts": int(mixed.sum()),
        "mean_length": float(mask.sum(1).double().mean()) if n else 0.0,
    }


def _checker_result(
    truth: ProbeTruth, truths: Sequence[Any], got: dict[str, MethodCredit], cfg: ProbeConfig
) -> dict[str, Any]:
    """The checker's numbers: the rollout summary, every method's `score_credit` and the baselines'."""
    return {
        "rollouts": rollout_summary(truth, truths),
        "methods": score_methods(got, truth, cfg.ks),
        "baselines": score_baselines(truth, cfg.ks, draws=cfg.random_draws, seed=cfg.seed),
    }


def _sample(
    model: Any, tokenizer: Any, cfg: ProbeConfig, say: Callable[[str], None]
) -> tuple[Rollouts, list[Any]]:
    """(rollouts, each rollout's problem) of the probe's problems (`prompt_index`: each rollout's group)."""
    problems = probe_problems(cfg)
    two = " x 2 independent groups" if cfg.two_groups else ""
    say(f"sampling {len(problems)}{two} x {cfg.group_size} rollouts ...")
    ro = sample_rollouts(model, tokenizer, problems, cfg)
    return ro, group_problems(ro, problems, cfg)


def credit_batches(group_ids: Tensor, cfg: ProbeConfig) -> tuple[list[Tensor], dict[str, Any]]:
    """(row indices of the training-sized batches every credit is computed on, their record for the
    report: prompts_per_step, its source, the batches' count and rollouts)."""
    copies = problem_and_copy(group_ids)[1] if cfg.two_groups else None
    batches = training_batches(group_ids, cfg.prompts_per_step, copies)
    record = {
        "prompts_per_step": cfg.prompts_per_step,
        "source": cfg.prompts_per_step_source,
        "batches": len(batches),
        "rollouts_per_batch": [int(b.numel()) for b in batches],
    }
    return batches, record


def _signals(
    model: Any,
    tokenizer: Any,
    rollouts: ScoredRollouts,
    rows: Sequence[Any],
    needs: Needs,
    cfg: ProbeConfig,
    say: Callable[[str], None],
) -> dict[str, Tensor]:
    """The forward signals of `needs` (one no-grad pass of `model`; rows[i]: rollout i's problem, for GCPO)."""
    if needs.forward:
        say(f"signals: {', '.join(sorted(needs.forward))}")
    passes = Passes(
        temperature=cfg.sampling.temperature,
        batch_size=cfg.sampling.batch_size,
        tokenizer=tokenizer,
        negative_prompts=rendered_negative_prompts([p.problem for p in rows], cfg.template, tokenizer),
    )
    return forward_signals(model, rollouts, needs.forward, passes, who="probe")


def _judge(
    cfg: ProbeConfig, reward: Any, ro: Rollouts, rows: Sequence[Any], tokenizer: Any
) -> tuple[ProbeTruth | None, list[Any], Tensor, list[Any]]:
    """(checker truth and each rollout's `RolloutTruth`, on the synthetic task only; scores [N]
    float32, the reward; each rollout's gold for `reward`: its problem, or its answer on other data)."""
    if cfg.synthetic:
        truth, truths = build_truth(rows, ro.response_ids, ro.response_mask, ro.prompt_index, tokenizer)
        return truth, truths, truth.correct.float(), list(rows)
    golds = [p.answer for p in rows]
    scores = check_rewards(reward(ro.texts, golds), len(rows), REWARD_NAMES[False])
    return None, [], torch.tensor(scores, dtype=torch.float32), golds


def _grpo_credit(
    got: dict[str, MethodCredit],
    batch: RolloutBatch,
    batches: Sequence[Tensor],
    *,
    lora: bool,
    special_ids: Sequence[int],
) -> MethodCredit:
    """GRPO's credit on the batch (per training-sized batch), the gradient cosines' second reference: the
    "grpo" column when --methods has one, else the grpo recipe's."""
    have = got.get("grpo")
    if have is not None and have.ok:
        return have
    spec = resolve_methods(["grpo"])[0]
    return method_credits(batch, [spec], special_ids=special_ids, lora=lora, batches=batches)[spec.name]


def _oracle_result(
    model: Any,
    ro: Rollouts,
    oracle: ProbeOracle | None,
    got: dict[str, MethodCredit],
    batch: RolloutBatch,
    batches: Sequence[Tensor],
    cfg: ProbeConfig,
    truth: ProbeTruth | None,
    *,
    lora: bool,
    special_ids: Sequence[int],
    moments: AdamMoments | str | None,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """The point's "oracle" section (`oracle_section`), with the gradient cosines when `cfg.grad_batches` > 0."""
    section = oracle_section(oracle, got, cfg, reward=REWARD_NAMES[cfg.synthetic], truth=truth)
    if oracle is None or not cfg.grad_batches:
        return section
    grpo = _grpo_credit(got, batch, batches, lora=lora, special_ids=special_ids)
    problems = int(problem_and_copy(ro.prompt_index)[0].max()) + 1 if cfg.two_groups else None
    grads = gradient_fidelity(model, ro, oracle, got, grpo, cfg, moments=moments, problems=problems, log=say)
    return with_gradient_columns(section, grads)


def _critic_values(
    critic: TrainedCritic, rollouts: ScoredRollouts, cfg: ProbeConfig, say: Callable[[str], None]
) -> Tensor:
    """V [N,T] of the trained critic on the sampled rollouts (their prompts and responses), on the CPU."""
    assert rollouts.prompt_ids is not None and rollouts.prompt_mask is not None  # sampled with their prompts
    say(f"critic values V: {critic.source}")
    mask = rollouts.response_mask.bool()
    seq = torch.cat([rollouts.prompt_ids, rollouts.response_ids], dim=1)
    attn = torch.cat([rollouts.prompt_mask.long(), mask.long()], dim=1)
    return critic.values(seq, attn, int(rollouts.prompt_ids.shape[1]), mask, cfg.sampling.batch_size)


def probe_model(
    model: Any,
    tokenizer: Any,
    specs: Sequence[MethodSpec],
    cfg: ProbeConfig,
    *,
    log: Callable[[str], None] | None = None,
    critic: TrainedCritic | None = None,
    moments: AdamMoments | str | None = None,
) -> dict[str, Any]:
    """Sample `cfg.groups` x `cfg.group_size` rollouts of held-out problems (`cfg.data`) with `model`,
    compute every method's credit on them (signals in one pass) and score it; returns the point's
    result: on the synthetic task {"rollouts": summary, "methods": {...}, "baselines": {...}}, on
    other data {"rollouts": `verifier_summary`}; with `cfg.oracle_k` > 0 also "oracle"
    (`fidelity.oracle_section`, with `cfg.grad_batches` > 0 its "gradients": `gradients.gradient_fidelity`).
    A column that reads a critic's `values` (ppo, bpco) gets them from `critic` (which must read `tokenizer`'s
    ids: a ConfigError before sampling otherwise), and is n/a saying so without one. Every credit is
    computed per training-sized batch of `cfg.prompts_per_step` groups (`credit_batches`; "credit_batches"
    in the result). moments: the probed run's AdamW second moments for the gradients' preconditioned
    metric (`precondition`), or why there are none (a stand-in is used)."""
    say = log or (lambda _msg: None)
    lora = has_lora_adapter(model)
    needs = needs_of([s.recipe for s in specs], lora=lora)
    with_values = "values" in needs.fields and critic is not None
    if with_values:
        critic.check_tokenizer(tokenizer, "the probed model")  # type: ignore[union-attr]
    ro, rows = _sample(model, tokenizer, cfg, say)
    with _reward(cfg) as reward:
        truth, truths, scores, golds = _judge(cfg, reward, ro, rows, tokenizer)
        rollouts = scored(ro, scores)
        signals = _signals(model, tokenizer, rollouts, rows, needs, cfg, say)
        mc_cost = None
        if needs.sampled:
            say(f"Monte-Carlo signals of the {', '.join(sorted(needs.sampled))} columns (expensive) ...")
            mc, mc_cost = mc_column_signals(
                model,
                tokenizer,
                ro,
                golds,
                reward,
                mixed_rows(ro.prompt_index, scores),
                set(needs.sampled),
                cfg,
                old_log_probs=signals.get("old_log_probs"),
                log=say,
            )
            signals = {**signals, **mc}
        # on a toy-tail task the batch carries its tail, as the trainer's does (the tail-mask column reads it)
        tail = truth.tail_mask if truth is not None else None
        batch = build_batch(rollouts, needs, given=signals, device="cpu", who="probe", tail_mask=tail)
        if with_values:
            batch = replace(batch, values=_critic_values(critic, rollouts, cfg, say))  # type: ignore[arg-type]
        batches, batches_record = credit_batches(batch.group_ids, cfg)
        say(
            f"scoring credit (per training batch of {cfg.prompts_per_step or 'all'} problems: {len(batches)} batches) ..."
        )
        special_ids = special_token_ids(tokenizer)
        got = method_credits(batch, specs, lora=lora, special_ids=special_ids, batches=batches)
        out = (
            _checker_result(truth, truths, got, cfg)
            if truth is not None
            else {"rollouts": verifier_summary(batch.group_ids, scores, batch.mask)}
        )
        out["credit_batches"] = batches_record
        if mc_cost is not None:
            out["mc_signals"] = mc_cost
        if cfg.oracle_k:
            say(f"Monte-Carlo A*: K = {cfg.oracle_k} continuations per state ...")
            oracle = run_oracle(
                model,
                tokenizer,
                ro,
                golds,
                reward,
                mixed_rows(batch.group_ids, scores),
                cfg,
                old_log_probs=signals.get("old_log_probs"),
                known_zero=tail,
                log=say,
            )
            out["oracle"] = _oracle_result(
                model,
                ro,
                oracle,
                got,
                batch,
                batches,
                cfg,
                truth,
                lora=lora,
                special_ids=special_ids,
                moments=moments,
                say=say,
            )
    return out


def probe_points(
    points: Sequence[ProbePoint],
    specs: Sequence[MethodSpec],
    cfg: ProbeConfig,
    *,
    log: Callable[[str], None] | None = None,
    critic: TrainedCritic | None = None,
) -> list[dict[str, Any]]:
    """`probe_model`'s result for every point, with its label, source and step; one model in memory at a time.
    `critic`: a trained critic whose values the ppo / bpco columns read (`--critic`)."""
    say = log or (lambda _msg: None)
    out: list[dict[str, Any]] = []
    for p in points:
        say(f"{p.label}: loading {p.source}")
        model, tokenizer = p.load()
        res = probe_model(
            model,
            tokenizer,
            specs,
            cfg,
            log=lambda m, lab=p.label: say(f"{lab}: {m}"),
            critic=critic,
            moments=p.moments() if cfg.oracle_k and cfg.grad_batches else None,
        )
        out.append({"label": p.label, "source": p.source, "step": p.step, **res})
        del model
    return out

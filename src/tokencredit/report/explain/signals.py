"""Which per-token signals an explain report uses as saved and which it recomputes, and with which model.

From a run directory the saved entropy / old_log_probs (the policy that sampled the rollouts)
are used, and a model is loaded only for the signals they lack (hidden states...): RUN_DIR/final,
or, for the LoRA signals of a LoRA run, the base model with the adapter from the newest checkpoint
(`tokencredit.train.checkpoint.load_run_policy`). From a JSONL every signal is recomputed with
the given model. A signal that cannot be had is reported with the reason, never faked.

The Monte-Carlo values of the `oracle` / `vineppo` columns are the ones an oracle / vineppo run
saved with its rollouts; otherwise they are sampled (`tokencredit.oracle.mc_signals`: expensive, the
cost goes in the notes) with the model, each group's gold answer and the verifier: the run's reward
function, sampling settings and [oracle] section, or the defaults for a JSONL (temperature as
given, the default budget or the longest completion if longer, the math verifier).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from tokencredit.batch import MC_SIGNALS, RolloutBatch
from tokencredit.builder import Needs, Passes, ScoredRollouts, build_batch, rendered_negative_prompts
from tokencredit.data.templates import render
from tokencredit.errors import ConfigError
from tokencredit.models import load_model, load_tokenizer
from tokencredit.oracle import MCSettings, mc_signals
from tokencredit.report.explain.assemble import padded, saved_signals, scored_rollouts
from tokencredit.report.explain.inputs import DISPLAY_SIGNALS, GroupInput
from tokencredit.report.explain.options import Source
from tokencredit.rewards import Reward
from tokencredit.rollout import SamplingSettings
from tokencredit.signals import has_lora_adapter
from tokencredit.train.checkpoint import load_run_policy
from tokencredit.train.config import TrainConfig

__all__ = ["batch_with_signals", "sample_mc_signals"]

_LORA_SIGNALS = frozenset({"base_hidden", "base_log_probs"})


def _bos_aware_ids(tokenizer: Any, text: str) -> list[int]:
    """Prompt ids as `tokencredit.rollout.generate` tokenises them (special tokens unless the text starts with BOS)."""
    bos = getattr(tokenizer, "bos_token", None)
    add = not (bos and text.startswith(bos))
    return list(tokenizer(text, add_special_tokens=add)["input_ids"])


def _prompt_texts(groups: Sequence[GroupInput], tokenizer: Any, template: str) -> list[str]:
    return [g.prompt if g.prompt is not None else render(template, g.problem, tokenizer) for g in groups]  # type: ignore[arg-type]


def _with_prompts(tokenizer: Any, groups: Sequence[GroupInput], scored: ScoredRollouts, template: str) -> ScoredRollouts:
    """The rollouts with their prompts (rebuilt from the groups, left-padded) and pad ids in the responses, on the CPU."""
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    prompts = _prompt_texts(groups, tokenizer, template)
    p_rows = [_bos_aware_ids(tokenizer, p) for g, p in zip(groups, prompts) for _ in g.completions]
    p_ids, p_att = padded(p_rows, pad, torch.int64, left=True)
    mask = scored.response_mask
    resp = torch.where(mask, scored.response_ids, torch.full_like(scored.response_ids, pad))
    return replace(scored, response_ids=resp.cpu(), response_mask=mask.cpu(), prompt_ids=p_ids, prompt_mask=p_att)


def sample_mc_signals(
    model: Any, tokenizer: Any, src: Source, rollouts: ScoredRollouts, needs: set[str], notes: list[str]
) -> dict[str, Tensor]:
    """The Monte-Carlo signals `needs` of the rollouts (with their prompts, `_with_prompts`), sampled with
    `model` (module docstring), on the CPU; their cost is appended to `notes`. Every group must carry its
    gold `answer`."""
    cfg = src.cfg or TrainConfig()
    q = cfg.oracle
    settings = MCSettings(q.k, q.delta, q.vine_k, q.vine_max_steps, q.delimiter, q.batch_size)
    budget = cfg.rollout.max_new_tokens if src.cfg else max(cfg.rollout.max_new_tokens, int(rollouts.response_mask.sum(1).max()))
    golds = [g.answer for g in src.groups for _ in g.completions]
    sampling = SamplingSettings(temperature=src.temperature, top_p=cfg.rollout.top_p, max_new_tokens=budget)
    fn = cfg.reward.function
    with Reward(fn, timeout=cfg.reward.timeout, retry_timeouts=cfg.reward.retry_timeouts) as reward:
        got, cost = mc_signals(
            model, tokenizer, rollouts, golds, reward, needs, sampling=sampling, settings=settings, seed=cfg.run.seed
        )
    c = cost.as_dict()
    notes.append(
        f"Monte-Carlo values sampled ({', '.join(sorted(got))}; reward {fn}, budget {budget} tokens, K = {q.k} per "
        f"token state, {q.vine_k} per VinePPO step): {c['continuations']} continuations, "
        f"{c['generated_tokens']} tokens, {c['seconds']:.1f} s"
    )
    return got


def _display_tokenizer(src: Source, notes: list[str]) -> Any:
    """The tokenizer of the run's model, to show the saved token ids as text (None when there is none)."""
    try:
        return load_tokenizer(src.model_path)
    except (OSError, ValueError) as e:
        notes.append(f"no tokenizer in {src.model_path} ({type(e).__name__}); tokens shown as saved")
        return None


def _recompute_model(
    src: Source, wanted: set[str], device: torch.device, notes: list[str], unavailable: dict[str, str]
) -> tuple[Any, Any, str] | None:
    """(model, tokenizer, description) to recompute a run's missing signals, or None (reasons noted).

    A LoRA run's adapter is restored from its newest checkpoint when LoRA signals are wanted and
    the user named no model; otherwise, or if that fails, the model at `src.model_path`.
    """
    lora_run = not src.model_given and src.cfg is not None and src.cfg.model.lora_rank > 0
    if wanted & _LORA_SIGNALS and lora_run and src.run_dir is not None:

        def damaged(msg: str) -> None:  # a checkpoint that is unusable: on the page and on the console
            notes.append(msg)
            src.damaged.append(msg)

        try:
            return load_run_policy(src.run_dir, None, device, log=damaged)
        except (ConfigError, OSError, RuntimeError) as e:
            notes.append(f"could not restore the run's LoRA adapter ({e}); using {src.model_path}")
    try:
        model, tokenizer = load_model(src.model_path, device=device)
    except (ConfigError, OSError, ValueError) as e:
        unavailable.update({s: f"no model to recompute it ({e})" for s in wanted})
        notes.append(f"no model loaded: {e}")
        return None
    return model, tokenizer, f"model {src.model_path}"


def _lora_unavailable(src: Source, model_desc: str) -> str:
    """Why the LoRA signals cannot be had from a model without an adapter."""
    if src.cfg is not None and not src.model_given and src.cfg.model.lora_rank <= 0:
        return "the run trained without LoRA (model.lora_rank = 0)"
    merged = " (RUN_DIR/final is the merged model)" if src.run_dir is not None and not src.model_given else ""
    return f"{model_desc} has no LoRA adapter{merged}"


def batch_with_signals(
    src: Source, needs: set[str], notes: list[str], *, device: torch.device, batch_size: int
) -> tuple[RolloutBatch, Any, dict[str, str]]:
    """(batch with every obtainable signal, tokenizer or None, {signal: why unavailable}); what was
    used, recomputed or missing is appended to `notes` (see the module docstring). The batch comes from
    the one builder (`tokencredit.builder.build_batch`), on the CPU."""
    recompute_all = src.run_dir is None
    model = tokenizer = None
    model_desc = f"model {src.model_path}"
    unavailable: dict[str, str] = {}
    if recompute_all:
        model, tokenizer = load_model(src.model_path, device=device)
    else:
        tokenizer = _display_tokenizer(src, notes)
    scored = scored_rollouts(src.groups, tokenizer)
    saved = {} if recompute_all else saved_signals(src.groups)
    wanted = (needs | set(DISPLAY_SIGNALS)) - set(saved)
    if "neg_log_probs" in wanted and any(g.problem is None for g in src.groups):
        wanted.discard("neg_log_probs")
        unavailable["neg_log_probs"] = "GCPO's negative prompt needs each group's 'problem' text"
    for name in wanted & set(MC_SIGNALS):
        if any(g.answer is None for g in src.groups):
            wanted.discard(name)
            unavailable[name] = "the Monte-Carlo values need each group's 'answer' for the verifier"
    if model is None and needs - set(saved):
        loaded = _recompute_model(src, wanted, device, notes, unavailable)
        if loaded is not None:
            model, tokenizer, model_desc = loaded
    if model is None:
        wanted = set()
    elif wanted & _LORA_SIGNALS and not has_lora_adapter(model):
        why = _lora_unavailable(src, model_desc)
        for s in wanted & _LORA_SIGNALS:
            unavailable[s] = f"{why}; ARCA / policy-divergence read the adapter's effect"
        wanted -= _LORA_SIGNALS
    sampled = wanted & set(MC_SIGNALS)  # sampled continuations, not a forward pass
    wanted -= sampled
    given = dict(saved)
    if wanted or sampled:
        scored = _with_prompts(tokenizer, src.groups, scored, src.template)
    if sampled:
        notes.append(f"Monte-Carlo values sampled with {model_desc} (expensive)")
        given.update(sample_mc_signals(model, tokenizer, src, scored, sampled, notes))
    passes = Passes(
        temperature=src.temperature, batch_size=batch_size, tokenizer=tokenizer,
        negative_prompts=rendered_negative_prompts([g.problem for g in src.groups for _ in g.completions],
                                                   src.template, tokenizer),  # type: ignore[misc]
    )  # fmt: skip
    need = Needs(forward=frozenset(wanted), sampled=frozenset(sampled))
    batch = build_batch(scored, need, model=model, given=given, passes=passes, device="cpu", who="explain")
    if wanted:
        origin = "recomputed" if recompute_all else "recomputed (the saved rollouts lack them)"
        notes.append(f"signals {origin} with {model_desc}: {', '.join(sorted(wanted))}")
    if saved:
        notes.append(f"from the saved rollouts (the policy that sampled them): {', '.join(sorted(saved))}")
    for s in sorted(set(unavailable) & needs):
        notes.append(f"signal {s} unavailable: {unavailable[s]}")
    return batch, tokenizer, unavailable

"""Which per-token signals an explain report uses as saved and which it recomputes, and with which model.

From a run directory the saved entropy / old_log_probs (the policy that sampled the rollouts)
are used, and a model is loaded only for the signals they lack (hidden states...): RUN_DIR/final,
or, for the LoRA signals of a LoRA run, the base model with the adapter from the newest checkpoint
(`tokencredit.train.checkpoint.load_run_policy`). From a JSONL every signal is recomputed with
the given model. A signal that cannot be had is reported with the reason, never faked.

A column whose recipe reads a learned critic's `values` (ppo, bpco) gets them from the trained critic of
`Source.critic` (`load_critic`: --critic RUN, else the explained run's own), run on the same prompt + response
ids as the policy's signals; without one the column is skipped with the reason.

The Monte-Carlo values of the `oracle` / `vineppo` columns are the ones an oracle / vineppo run
saved with its rollouts; otherwise they are sampled (`tokencredit.oracle.mc_signals`: expensive, the
cost goes in the notes) with the model, each group's gold answer and the verifier: the run's reward
function, sampling settings and [oracle] section, or the defaults for a JSONL (temperature as
given, the default budget or the longest completion if longer, the math verifier).

Before any model loads (`prepare_tokens`): a JSONL's completion texts are tokenised as plain text (special
tokens are never parsed from them), every token id is checked against the tokenizer's and the model
config's vocabulary, and a completion longer than `--max-tokens` is cut (noted). Before the forward
(`batch_with_signals`): a completion that does not fit the model's positions (max_position_embeddings)
after its prompt is cut to fit (noted; marked truncated, as a response that hit a length limit), and the
rows per forward are lowered for long sequences so that the attention's memory stays bounded. A model
named with --model that cannot load is an error naming it; only the implicit RUN_DIR/final degrades to a note.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from tokencredit.batch import MC_SIGNALS, RolloutBatch
from tokencredit.builder import Needs, Passes, ScoredRollouts, build_batch, rendered_negative_prompts
from tokencredit.critic import TrainedCritic, no_critic_reason
from tokencredit.data.templates import render
from tokencredit.data.token_labels import tail_token_mask
from tokencredit.errors import ConfigError
from tokencredit.explain.assemble import padded, saved_signals, scored_rollouts, tokenize_completions
from tokencredit.explain.inputs import DISPLAY_SIGNALS, GroupInput, check_token_ids, cut_completion
from tokencredit.explain.options import Source
from tokencredit.models import load_model, load_tokenizer, resolve_model
from tokencredit.oracle import MCSettings, mc_signals
from tokencredit.rewards import Reward
from tokencredit.rollout import SamplingSettings
from tokencredit.signals import has_lora_adapter
from tokencredit.tasks import tail_task
from tokencredit.train.checkpoint import load_run_critic, load_run_policy
from tokencredit.train.config import TrainConfig

__all__ = [
    "batch_with_signals",
    "load_critic",
    "load_tokens_tokenizer",
    "prepare_tokens",
    "sample_mc_signals",
]

_LORA_SIGNALS = frozenset({"base_hidden", "base_log_probs"})
# rows x sequence length^2 per forward at most (`_rows_per_forward`): the attention's [rows, T, T] scores
_ATTENTION_BUDGET = 2**26
_NAMED = 3  # completions named in a note, the rest counted
_LOAD = object()  # batch_with_signals' tokenizer not given: load it


def _why(e: BaseException) -> str:
    """An exception in a few words for a one-line message (its first line; the type unless a ConfigError)."""
    first = (str(e).strip().splitlines() or [""])[0][:200]
    return first if isinstance(e, ConfigError) else f"{type(e).__name__}: {first}"


def load_tokens_tokenizer(src: Source, notes: list[str]) -> Any:
    """The tokenizer that reads the completions: the model's (--model, or RUN_DIR/final by default), or
    None for a run directory without one (tokens are shown as saved, with a note). A model the user named
    that has no usable tokenizer is a ConfigError naming --model."""
    try:
        return load_tokenizer(src.model_path)
    except Exception as e:  # transformers raises many kinds for a path that holds no tokenizer
        if src.model_given:
            raise ConfigError(f"--model {src.model_path}: cannot load its tokenizer ({_why(e)})") from None
        if not isinstance(e, (OSError, ValueError)):
            raise
        notes.append(f"no tokenizer in {src.model_path} ({type(e).__name__}); tokens shown as saved")
        return None


def load_critic(
    src: Source, device: torch.device, tokenizer: Any, notes: list[str], unavailable: dict[str, str]
) -> TrainedCritic | None:
    """The trained critic of `src.critic`, checked to read the completions' tokenizer; None, with the reason in
    `unavailable["values"]` (and a note), when there is none or the explained run's own cannot be loaded. A
    critic named with --critic that cannot be loaded, or reads another tokenizer, is a ConfigError."""
    if src.critic is None:
        unavailable["values"] = no_critic_reason()
        return None
    try:
        critic = load_run_critic(src.critic, device, log=notes.append)
        critic.check_tokenizer(tokenizer, f"the explained rollouts' ({src.model_path})")
    except (ConfigError, OSError) as e:
        if src.critic_given:
            raise
        unavailable["values"] = f"the run's critic could not be loaded ({_why(e)})"
        notes.append(f"no critic values: {unavailable['values']}")
        return None
    return critic


def _model_config(model_path: str) -> Any:
    """The model's configuration, read without its weights (None when it cannot be read that way)."""
    try:
        from transformers import AutoConfig

        m = resolve_model(model_path)
        kw = {"gguf_file": m.gguf_file} if m.gguf_file else {}
        cfg = AutoConfig.from_pretrained(m.directory, local_files_only=True, **kw)
    except Exception:  # no config to read ahead: the checks run again on the loaded model
        return None
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def _where(g: GroupInput, i: int) -> str:
    return f"{g.where} completions[{i}]"


def _cut_all(
    groups: Sequence[GroupInput],
    *,
    max_tokens: int | None,
    positions: int | None,
    prompt_lengths: Sequence[int] | None,
    model: str,
    notes: list[str],
    warnings: list[str],
) -> None:
    """Cut every completion to `max_tokens` and, with `positions`, to what its group's prompt leaves of the
    model's positions; one note (and one line in `warnings`) names the first few cut and why. A prompt that
    alone fills the positions is a ConfigError naming file:line."""
    cut: list[str] = []
    for k, g in enumerate(groups):
        room, why = (max_tokens, f"--max-tokens {max_tokens}") if max_tokens is not None else (None, "")
        if positions is not None and prompt_lengths is not None:
            left = positions - prompt_lengths[k]
            if left < 1:
                raise ConfigError(
                    f"{g.where}: the prompt has {prompt_lengths[k]} tokens and {model} reads {positions} positions "
                    "(max_position_embeddings): no room for a response; shorten the problem or use another model"
                )
            if room is None or left < room:
                room, why = left, f"{model}'s {positions} positions less the {prompt_lengths[k]}-token prompt"
        if room is None:
            continue
        for i, c in enumerate(g.completions):
            if cut_completion(c, room) > room:
                cut.append(f"{_where(g, i)}: {c.full_length} -> {room} tokens, {why}")
    if cut:
        more = f"; and {len(cut) - _NAMED} more" if len(cut) > _NAMED else ""
        note = (
            f"{len(cut)} completion(s) cut ({'; '.join(cut[:_NAMED])}{more}): their credit and signals are computed "
            "on the kept tokens with the whole response's reward, as for a response truncated at that length "
            "(marked truncated)"
        )
        notes.append(note)
        warnings.append(note)


def prepare_tokens(
    src: Source, tokenizer: Any, notes: list[str], warnings: list[str], *, max_tokens: int
) -> None:
    """Token ids on every completion, checked and cut before any model loads (module docstring): texts
    tokenised as plain text, ids within the vocabulary (DataError naming file:line and the id), each
    completion cut to `max_tokens` and, for a JSONL (scored by the model), to the positions its prompt
    leaves in the model's config (a note, and one line in `warnings`)."""
    tokenize_completions(src.groups, tokenizer)
    positions = prompt_lengths = None
    if tokenizer is not None:
        cfg = _model_config(src.model_path)
        vocab = max(len(tokenizer), int(getattr(cfg, "vocab_size", 0) or 0))
        check_token_ids(src.groups, vocab, src.model_path)
        for g in src.groups:  # a prompt saved as token ids is shown as their text
            if g.prompt is None and g.problem is None and g.prompt_token_ids is not None:
                g.prompt = tokenizer.decode(g.prompt_token_ids, skip_special_tokens=False)
        unk = getattr(tokenizer, "unk_token_id", None)
        n_unk = (
            sum(c.token_ids.count(unk) for g in src.groups for c in g.completions if c.text)
            if unk is not None
            else 0
        )
        if n_unk and src.run_dir is None:
            notes.append(
                f"{n_unk} token(s) of the completion texts are the tokenizer's unknown token {tokenizer.unk_token!r} "
                f"(characters outside the vocabulary of {src.model_path}): scored as that token"
            )
        positions = _positions(cfg) if src.run_dir is None else None
        if positions is not None:
            prompt_lengths = [len(p) for p in _prompt_ids(src.groups, tokenizer, src.template)]
    _cut_all(
        src.groups,
        max_tokens=max_tokens,
        positions=positions,
        prompt_lengths=prompt_lengths,
        model=src.model_path,
        notes=notes,
        warnings=warnings,
    )


def _positions(config: Any) -> int | None:
    """How many positions a model reads (its config's max_position_embeddings), None when it says none."""
    n = getattr(config, "max_position_embeddings", None)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def _rows_per_forward(batch_size: int, longest: int, notes: list[str]) -> int:
    """`batch_size`, lowered so that rows x longest^2 stays within `_ATTENTION_BUDGET` (a note when lowered)."""
    rows = max(1, min(batch_size, _ATTENTION_BUDGET // max(1, longest * longest)))
    if rows < batch_size:
        notes.append(
            f"rows per forward lowered from {batch_size} to {rows} for sequences of up to {longest} tokens "
            "(bounds the attention's memory)"
        )
    return rows


def _bos_aware_ids(tokenizer: Any, text: str) -> list[int]:
    """Prompt ids as `tokencredit.rollout.generate` tokenises them (special tokens unless the text starts with BOS)."""
    bos = getattr(tokenizer, "bos_token", None)
    add = not (bos and text.startswith(bos))
    return list(tokenizer(text, add_special_tokens=add)["input_ids"])


def _prompt_text(g: GroupInput, tokenizer: Any, template: str) -> str:
    return g.prompt if g.prompt is not None else render(template, g.problem, tokenizer)  # type: ignore[arg-type]


def _prompt_ids(groups: Sequence[GroupInput], tokenizer: Any, template: str) -> list[list[int]]:
    """Each group's prompt ids: as the engine fed them when saved (a prime-rl export's), else rebuilt as
    `tokencredit.rollout.generate` tokenised them."""
    return [
        list(g.prompt_token_ids)
        if g.prompt_token_ids is not None
        else _bos_aware_ids(tokenizer, _prompt_text(g, tokenizer, template))
        for g in groups
    ]


def _with_prompts(
    tokenizer: Any, groups: Sequence[GroupInput], scored: ScoredRollouts, prompt_ids: Sequence[list[int]]
) -> ScoredRollouts:
    """The rollouts with their prompts (each group's `prompt_ids`, left-padded) and pad ids in the responses,
    on the CPU."""
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    p_rows = [p for g, p in zip(groups, prompt_ids) for _ in g.completions]
    p_ids, p_att = padded(p_rows, pad, torch.int64, left=True)
    mask = scored.response_mask
    resp = torch.where(mask, scored.response_ids, torch.full_like(scored.response_ids, pad))
    return replace(
        scored, response_ids=resp.cpu(), response_mask=mask.cpu(), prompt_ids=p_ids, prompt_mask=p_att
    )


def sample_mc_signals(
    model: Any, tokenizer: Any, src: Source, rollouts: ScoredRollouts, needs: set[str], notes: list[str]
) -> dict[str, Tensor]:
    """The Monte-Carlo signals `needs` of the rollouts (with their prompts, `_with_prompts`), sampled with
    `model` (module docstring), on the CPU; their cost is appended to `notes`. Every group must carry its
    gold `answer`."""
    cfg = src.cfg or TrainConfig()
    q = cfg.oracle
    settings = MCSettings(q.k, q.delta, q.vine_k, q.vine_max_steps, q.delimiter, q.batch_size)
    budget = (
        cfg.rollout.max_new_tokens
        if src.cfg
        else max(cfg.rollout.max_new_tokens, int(rollouts.response_mask.sum(1).max()))
    )
    golds = [g.answer for g in src.groups for _ in g.completions]
    sampling = SamplingSettings(temperature=src.temperature, top_p=cfg.rollout.top_p, max_new_tokens=budget)
    fn = cfg.reward.function
    with Reward(
        fn, timeout=cfg.reward.timeout, retry_timeouts=cfg.reward.retry_timeouts, contract=cfg.reward.contract
    ) as reward:
        got, cost = mc_signals(
            model,
            tokenizer,
            rollouts,
            golds,
            reward,
            needs,
            sampling=sampling,
            settings=settings,
            seed=cfg.run.seed,
        )
    c = cost.as_dict()
    notes.append(
        f"Monte-Carlo values sampled ({', '.join(sorted(got))}; reward {fn}, budget {budget} tokens, K = {q.k} per "
        f"token state, {q.vine_k} per VinePPO step): {c['continuations']} continuations, "
        f"{c['generated_tokens']} tokens, {c['seconds']:.1f} s"
    )
    return got


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
    except Exception as e:  # transformers raises many kinds for a path that holds no model
        if src.model_given:
            raise ConfigError(f"--model {src.model_path}: cannot load it ({_why(e)})") from None
        if not isinstance(e, (OSError, ValueError)):
            raise
        unavailable.update({s: f"no model to recompute it ({_why(e)})" for s in wanted})
        notes.append(f"no model loaded: {_why(e)}")
        return None
    return model, tokenizer, f"model {src.model_path}"


def _lora_unavailable(src: Source, model_desc: str) -> str:
    """Why the LoRA signals cannot be had from a model without an adapter."""
    if src.cfg is not None and not src.model_given and src.cfg.model.lora_rank <= 0:
        return "the run trained without LoRA (model.lora_rank = 0)"
    merged = " (RUN_DIR/final is the merged model)" if src.run_dir is not None and not src.model_given else ""
    return f"{model_desc} has no LoRA adapter{merged}"


def _load_jsonl_model(src: Source, device: torch.device) -> tuple[Any, Any]:
    """(model, tokenizer) of --model, which a JSONL needs: a ConfigError naming it when it cannot load."""
    try:
        return load_model(src.model_path, device=device)
    except Exception as e:  # transformers raises many kinds for a path that holds no model
        raise ConfigError(f"--model {src.model_path}: cannot load it ({_why(e)})") from None


def _check_embeddings(src: Source, model: Any) -> None:
    """The token ids against the loaded model's embedding rows (the config read ahead may have been missing)."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    n = getattr(emb, "num_embeddings", None)
    if isinstance(n, int):
        check_token_ids(src.groups, n, src.model_path)


def _obtainable(groups: list[Any], wanted: set[str], unavailable: dict[str, str]) -> set[str]:
    """`wanted` less the signals the groups lack the fields for, each said in `unavailable`."""
    wanted = set(wanted)
    if "neg_log_probs" in wanted and any(g.problem is None for g in groups):
        wanted.discard("neg_log_probs")
        unavailable["neg_log_probs"] = "GCPO's negative prompt needs each group's 'problem' text"
    for name in wanted & set(MC_SIGNALS):
        if any(g.answer is None for g in groups):
            wanted.discard(name)
            unavailable[name] = "the Monte-Carlo values need each group's 'answer' for the verifier"
    return wanted


def _fit_to_model(
    src: Source, model: Any, tokenizer: Any, notes: list[str], warnings: list[str]
) -> list[list[int]]:
    """Each group's prompt ids, once the completions' ids are checked against the model's embeddings and
    each completion is cut to the model's positions after its prompt (a no-op when `prepare_tokens` read
    the same positions ahead, as for a JSONL; not for a run's model)."""
    _check_embeddings(src, model)
    prompt_ids = _prompt_ids(src.groups, tokenizer, src.template)
    config = getattr(model, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    _cut_all(
        src.groups,
        max_tokens=None,
        positions=_positions(config),
        prompt_lengths=[len(p) for p in prompt_ids],
        model=src.model_path,
        notes=notes,
        warnings=warnings,
    )
    return prompt_ids


def _critic_values(critic: TrainedCritic, scored: ScoredRollouts, batch_size: int) -> Tensor:
    """V [N,T] of the critic on the rollouts with their prompts (`_with_prompts`), on the CPU."""
    assert scored.prompt_ids is not None and scored.prompt_mask is not None  # `_with_prompts` set them
    mask = scored.response_mask.bool()
    seq = torch.cat([scored.prompt_ids, scored.response_ids], dim=1)
    attn = torch.cat([scored.prompt_mask.long(), mask.long()], dim=1)
    return critic.values(seq, attn, int(scored.prompt_ids.shape[1]), mask, batch_size)


def _tail_mask(src: Source, scored: ScoredRollouts, tokenizer: Any, notes: list[str]) -> Tensor | None:
    """bool [N,T]: on a run trained on a toy-tail task, the rollouts' tail tokens by the trainer's rule
    (`tail_token_mask`), so a recipe with zero_tail (the run's, or the `tail-mask` column) gets the same Â as in
    training; None for any other source."""
    task = tail_task(src.cfg.data.train, src.cfg.data) if src.cfg is not None else None
    if task is None:
        return None
    problems = [g.problem for g in src.groups for _ in g.completions]
    if tokenizer is None or any(p is None for p in problems):
        notes.append(
            "tail mask unavailable: the rollouts' text or problems cannot be read (zero_tail columns n/a)"
        )
        return None
    return tail_token_mask(tokenizer, scored.response_ids, scored.response_mask, problems, task.label_chars)


def batch_with_signals(
    src: Source,
    needs: set[str],
    notes: list[str],
    *,
    device: torch.device,
    batch_size: int,
    tokenizer: Any = _LOAD,
    warnings: list[str] | None = None,
    critic: TrainedCritic | None = None,
) -> tuple[RolloutBatch, Any, dict[str, str]]:
    """(batch with every obtainable signal, tokenizer or None, {signal: why unavailable}); what was
    used, recomputed or missing is appended to `notes`, a completion cut to fit the model also to `warnings`
    (see the module docstring). `tokenizer`: the one `prepare_tokens` read the completions with, None for
    none (loaded here when not given). With `critic` the batch also carries its `values` [N,T]. The batch
    comes from the one builder (`tokencredit.builder.build_batch`), on the CPU."""
    warnings = [] if warnings is None else warnings
    recompute_all = src.run_dir is None
    model = None
    model_desc = f"model {src.model_path}"
    unavailable: dict[str, str] = {}
    if tokenizer is _LOAD:
        tokenizer = load_tokens_tokenizer(src, notes)
    if recompute_all:
        model, tokenizer = _load_jsonl_model(src, device)
    tokenize_completions(src.groups, tokenizer)
    saved = {} if recompute_all else saved_signals(src.groups)
    wanted = _obtainable(src.groups, (needs | set(DISPLAY_SIGNALS)) - set(saved), unavailable)
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
    prompt_ids: list[list[int]] = []
    with_prompts = bool(wanted or sampled or critic is not None)
    # the critic reads the same ids (its tokenizer was checked against this one); its own when none was loaded
    prompt_tok = tokenizer if tokenizer is not None or critic is None else critic.tokenizer
    if with_prompts:
        fit = model if model is not None else critic.model.decoder  # type: ignore[union-attr]
        prompt_ids = _fit_to_model(src, fit, prompt_tok, notes, warnings)
        given = saved_signals(src.groups) if saved else given  # as cut
    scored = scored_rollouts(src.groups, tokenizer)
    if with_prompts:
        scored = _with_prompts(prompt_tok, src.groups, scored, prompt_ids)
        longest = int(scored.prompt_ids.shape[1] + scored.response_ids.shape[1])  # type: ignore[union-attr]
        batch_size = _rows_per_forward(batch_size, longest, notes)
    if sampled:
        notes.append(f"Monte-Carlo values sampled with {model_desc} (expensive)")
        given.update(sample_mc_signals(model, tokenizer, src, scored, sampled, notes))
    passes = Passes(
        temperature=src.temperature,
        batch_size=batch_size,
        tokenizer=tokenizer,
        negative_prompts=rendered_negative_prompts(
            [g.problem for g in src.groups for _ in g.completions], src.template, tokenizer
        ),  # type: ignore[misc]
    )
    need = Needs(forward=frozenset(wanted), sampled=frozenset(sampled))
    tail = _tail_mask(src, scored, tokenizer, notes)
    batch = build_batch(
        scored, need, model=model, given=given, passes=passes, device="cpu", who="explain", tail_mask=tail
    )
    if critic is not None:
        batch = replace(batch, values=_critic_values(critic, scored, batch_size))
        notes.append(
            f"critic values V: {critic.source}, on these rollouts (the Â a run saves was computed with its critic "
            "before that step's update, so a saved column can differ)"
        )
    if wanted:
        origin = "recomputed" if recompute_all else "recomputed (the saved rollouts lack them)"
        notes.append(f"signals {origin} with {model_desc}: {', '.join(sorted(wanted))}")
    if saved:
        notes.append(f"from the saved rollouts (the policy that sampled them): {', '.join(sorted(saved))}")
    for s in sorted(set(unavailable) & needs):
        notes.append(f"signal {s} unavailable: {unavailable[s]}")
    return batch, tokenizer, unavailable

"""The one batch builder: rollouts + a model + what the recipe needs -> the `RolloutBatch` credit reads.

Every engine turns its rollouts into the batch that credit reads here: the trainer, `explain`,
`probe`, the TRL plugin and the verl plugin. Two decisions are made once, for all of them:

- `needs_of(recipes, ...)` decides which signals a batch must carry: the credit method's, the
  advantage estimator's and the ratio kernel's (`recipes.credit_needs`); with ``objective=True``
  also the objective's (old log-probs for a ratio, reference log-probs for KL), for an engine whose
  loss is ours; plus what the engine shows or logs (``extra``). They come in three kinds, by who
  produces them: `Needs.forward`, per-token statistics of a no-grad pass of a model
  (`tokencredit.signals.compute_signals`); `Needs.sampled`, Monte-Carlo values of the policy's
  prefixes (`tokencredit.oracle.mc_signals`, which needs the engine's reward, so the engine samples
  them and hands them over); `Needs.fields`, batch fields besides signals (ReMax's greedy baseline
  scores, produced by the engine's sampler).
- `build_batch(rollouts, needs, model=..., given=...)` computes the forward signals that are not
  `given` in the fewest passes (one old-policy pass; adapter-off, reference and GCPO's negative
  prompt passes only when asked for), refuses a needed signal that is neither given nor computable
  with a ConfigError naming it and the engine, and assembles the validated batch on one device.

`forward_signals` is the pass itself, for an engine that runs it on its own rows and model wrapper (the
TRL plugin). A data-parallel engine builds each rank's batch of its own rows with `shard=` set
(`tokencredit.distributed.Shard`): nothing per-token is gathered across ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from tokencredit.batch import MC_SIGNALS, SIGNALS, RolloutBatch
from tokencredit.credit.gcpo import negative_prompt
from tokencredit.data.templates import render
from tokencredit.distributed import Shard
from tokencredit.errors import ConfigError, closest
from tokencredit.recipes import Recipe, batch_fields, credit_needs, recipe_needs, requires_lora
from tokencredit.signals import compute_signals, negative_prompt_inputs

__all__ = [
    "Needs",
    "Passes",
    "Responses",
    "ScoredRollouts",
    "build_batch",
    "forward_signals",
    "needs_of",
    "rendered_negative_prompts",
]

# The signals a fused training forward yields (tokencredit.train.update): not computed before the update.
FUSED_SIGNALS = frozenset({"old_log_probs", "entropy"})


@dataclass(frozen=True)
class Needs:
    """What a batch must carry, by who produces it (module docstring).

    forward: per-token signals of no-grad model passes (names from `tokencredit.batch.SIGNALS`);
    sampled: Monte-Carlo signals (`tokencredit.batch.MC_SIGNALS`), sampled by the engine;
    fields: RolloutBatch fields besides the signals (``baseline_scores``), filled by the engine.
    """

    forward: frozenset[str] = frozenset()
    sampled: frozenset[str] = frozenset()
    fields: frozenset[str] = frozenset()

    @property
    def signals(self) -> frozenset[str]:
        """Every per-token signal: forward and sampled."""
        return self.forward | self.sampled


def needs_of(
    recipes: Recipe | Iterable[Recipe],
    *,
    objective: bool = False,
    extra: Iterable[str] = (),
    fused_old: bool = False,
    lora: bool = True,
) -> Needs:
    """The `Needs` of one recipe or of several (the columns of a report), the one rule every engine uses.

    objective: also the objective's signals (`recipes.recipe_needs`: old log-probs for a ratio kernel,
      reference log-probs for a KL term), for an engine that trains with tokencredit's loss.
    extra: signals the engine wants besides (the trainer logs entropy; explain shows entropy and log-probs).
    fused_old: the old log-probs and entropy come from the training forward (`train.update`), so no
      pass computes them before the update (the trainer decides this with `update.can_fuse_old_pass`).
    lora: False leaves out the needs of methods that read a LoRA adapter (a report on a model without one
      shows those columns as unavailable).
    """
    rs = [recipes] if isinstance(recipes, Recipe) else list(recipes)
    names, fields_ = set(extra), set[str]()
    for r in rs:
        if not lora and requires_lora(r):
            continue
        names |= recipe_needs(r) if objective else credit_needs(r)
        fields_ |= batch_fields(r)
    _check_names(names, "needs_of")
    if fused_old:
        names -= FUSED_SIGNALS
    return Needs(frozenset(names - set(MC_SIGNALS)), frozenset(names & set(MC_SIGNALS)), frozenset(fields_))


class Scored(Protocol):
    """What `build_batch` reads from an engine's rollouts (`ScoredRollouts`, or the trainer's `StepRollouts`).

    Read-only properties, not attributes: the builder only reads them, so a frozen dataclass matches, and
    so does a class whose field is narrower (the trainer's `truncated: Tensor` for `Tensor | None`).
    """

    @property
    def response_ids(self) -> Tensor: ...  # [N,T] int64
    @property
    def response_mask(self) -> Tensor: ...  # [N,T] bool
    @property
    def group_ids(self) -> Tensor: ...  # [N] int64
    @property
    def scores(self) -> Tensor: ...  # [N] float
    @property
    def truncated(self) -> Tensor | None: ...  # [N] bool
    @property
    def baseline_scores(self) -> Tensor | None: ...  # [N] float
    @property
    def prompt_ids(self) -> Tensor | None: ...  # [N,P] int64, left-padded
    @property
    def prompt_mask(self) -> Tensor | None: ...  # [N,P]


@dataclass(frozen=True, kw_only=True)
class Responses:
    """Responses after their prompts, the layout the no-grad passes read (`forward_signals`).

    response_ids [N,T] int64, right-padded; response_mask [N,T] bool (valid response tokens, the ones that
    get credit); prompt_ids / prompt_mask [N,P], left-padded (None when nothing is computed with a model);
    response_attention [N,T] or None: the response tokens the model attends to when they are more than
    response_mask's (TRL's tool-call tokens are attended to but get no credit).
    """

    response_ids: Tensor
    response_mask: Tensor
    prompt_ids: Tensor | None = None
    prompt_mask: Tensor | None = None
    response_attention: Tensor | None = None


@dataclass(frozen=True, kw_only=True)
class ScoredRollouts(Responses):
    """N scored responses, in the form every engine can produce (the trainer's `StepRollouts` has these fields).

    group_ids [N] int64 (rows with the same id answered the same prompt); scores [N] float (the reward);
    truncated [N] bool or None (hit the length limit without EOS); baseline_scores [N] or None (ReMax's
    greedy-rollout reward of each row's prompt).
    """

    group_ids: Tensor
    scores: Tensor
    truncated: Tensor | None = None
    baseline_scores: Tensor | None = None


@dataclass(frozen=True)
class Passes:
    """How the no-grad passes run (`tokencredit.signals.compute_signals`).

    temperature: log-probs and entropy use logits / temperature, the sampling temperature.
    batch_size: rows per forward (None: all rows at once).
    ref_model: the reference policy for ref_log_probs (None: the LoRA adapter's disabled base).
    negative_prompts: GCPO only: returns each row's negative prompt, rendered as the real prompts were
      (`rendered_negative_prompts`); called only when neg_log_probs is computed.
    tokenizer: tokenises the negative prompts.
    add_special_tokens: as the engine tokenised its prompts (None: as `tokencredit.rollout.generate` does).
    """

    temperature: float = 1.0
    batch_size: int | None = None
    ref_model: nn.Module | None = None
    negative_prompts: Callable[[], Sequence[str]] | None = None
    tokenizer: Any = None
    add_special_tokens: bool | None = None


def rendered_negative_prompts(
    problems: Sequence[str], template: str, tokenizer: Any
) -> Callable[[], list[str]]:
    """`Passes.negative_prompts` for rows whose problem texts are `problems`: GCPO's negative prompt of each,
    rendered with the chat `template` as the rollouts' prompts were."""
    return lambda: [render(template, negative_prompt(p), tokenizer) for p in problems]


def forward_signals(
    model: nn.Module,
    rollouts: Responses | Scored,
    names: Iterable[str],
    passes: Passes = Passes(),
    *,
    who: str = "tokencredit",
) -> dict[str, Tensor]:
    """{name: [N,T] (hidden signals [N,T,H])} float32, detached, 0 off the response mask, on the model's
    device: the signals `names` of the rollouts (their prompts and responses are read) in the fewest no-grad
    passes of `model`."""
    names = set(names)
    if not names:
        return {}
    if rollouts.prompt_ids is None or rollouts.prompt_mask is None:
        raise ConfigError(
            f"{who}: computing {', '.join(sorted(names))} needs the prompts (prompt_ids, prompt_mask)"
        )
    device = next(model.parameters()).device
    resp, mask = rollouts.response_ids.to(device), rollouts.response_mask.to(device).bool()
    attend = getattr(rollouts, "response_attention", None)  # StepRollouts and the like have none
    attend = mask if attend is None else attend.to(device)
    prompt_ids = rollouts.prompt_ids.to(device)
    seq = torch.cat([prompt_ids, resp], dim=1)
    attn = torch.cat([rollouts.prompt_mask.to(device).long(), attend.long()], dim=1)
    neg: dict[str, Any] = {}
    if "neg_log_probs" in names:
        if passes.negative_prompts is None or passes.tokenizer is None:
            raise ConfigError(f"{who}: neg_log_probs (GCPO) needs the rows' negative prompts and a tokenizer")
        neg = negative_prompt_inputs(
            passes.tokenizer,
            list(passes.negative_prompts()),
            resp,
            attend,
            add_special_tokens=passes.add_special_tokens,
        )
    return compute_signals(
        model,
        seq,
        attn,
        int(prompt_ids.shape[1]),
        mask,
        names,
        temperature=passes.temperature,
        batch_size=passes.batch_size,
        ref_model=passes.ref_model,
        **neg,
    )


def build_batch(
    rollouts: Scored,
    needs: Needs,
    *,
    model: nn.Module | None = None,
    given: Mapping[str, Tensor] | None = None,
    passes: Passes = Passes(),
    device: torch.device | str | None = None,
    who: str = "tokencredit",
    shard: Shard | None = None,
    tail_mask: Tensor | None = None,
) -> RolloutBatch:
    """The validated RolloutBatch of `rollouts` carrying every signal of `needs` (and every `given` one).

    given: signals the engine already has ({name: [N,T] or [N,T,H]}): saved with the rollouts, computed by
      the engine (verl's actor), or sampled (`needs.sampled` must all be here). They are used as they are.
    model: computes the `needs.forward` signals that are not given (`forward_signals`, with `passes`); without
      a model each of them must be given. `device`: where the batch lives (default: the responses' device).
    shard: these rollouts are this rank's part of a batch split across data-parallel ranks
      (`tokencredit.distributed.Shard`; group ids global): credit statistics are then the whole batch's.
    tail_mask: bool [N,T], the tokens of the task's reward-irrelevant tail (`tokencredit.credit.tail`).
    ConfigError names the engine (`who`) and every signal that is missing.
    """
    have = dict(given or {})
    _check_names(have, f"{who}: given")
    compute = set(needs.forward) - set(have)
    if compute and model is None:
        raise ConfigError(
            f"{who} needs the per-token signal(s) {', '.join(sorted(compute))}, which were neither given nor "
            "computable (no model)"
        )
    missing = sorted(set(needs.sampled) - set(have))
    if missing:
        raise ConfigError(
            f"{who} needs the Monte-Carlo signal(s) {', '.join(missing)}: values of the policy's prefixes, sampled "
            "with continuations and the reward (tokencredit.oracle.mc_signals) by the engine"
        )
    if compute and model is not None:  # (compute without a model was refused above)
        have.update(forward_signals(model, rollouts, compute, passes, who=who))
    dev = torch.device(device) if device is not None else rollouts.response_ids.device

    def on(x: Tensor | None) -> Tensor | None:
        return None if x is None else x.to(dev)

    return RolloutBatch(
        token_ids=rollouts.response_ids.to(dev),
        mask=rollouts.response_mask.to(dev),
        group_ids=rollouts.group_ids.to(dev),
        scores=rollouts.scores.to(dev),
        truncated=on(rollouts.truncated),
        baseline_scores=on(rollouts.baseline_scores),
        tail_mask=on(tail_mask),
        shard=shard,
        **{k: v.to(dev) for k, v in have.items()},
    )


def _check_names(names: Iterable[str], where: str) -> None:
    for name in sorted(names):
        if name not in SIGNALS:
            raise ConfigError(
                f"{where}: unknown signal {name!r}{closest(name, SIGNALS)}; known: {', '.join(SIGNALS)}"
            )

"""The policy update of one step: PPO epochs x mini-batches, each an optimizer step over micro-batches.

Every micro-batch's loss is `tokencredit.objectives.policy_loss` with the step's `TokenCredit`
(Â, the loss tokens, the objective's arguments) and the step's global token / response counts,
so the sum of micro-batch gradients equals the gradient of the undivided mini-batch.

With one epoch and one mini-batch (and nothing needing a pre-update signal) the old policy's
log-probs are taken from the training forward itself (`fuse_old=True`): the parameters do not
move between the old-policy pass and the training forward, so pi_old = pi_theta token for token
and a separate no-grad pass would only repeat work (TRL skips it the same way).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from tokencredit import objectives
from tokencredit.batch import RolloutBatch
from tokencredit.errors import ConfigError, TrainingError
from tokencredit.recipes import TokenCredit
from tokencredit.signals import token_log_probs
from tokencredit.train.config import OptimConfig
from tokencredit.train.sampling import seed_for

__all__ = ["UpdateStats", "policy_update"]


@dataclass(frozen=True)
class UpdateStats:
    """The update's metrics: the objective's (mean over micro-batches) and the mean gradient norm."""

    metrics: dict[str, float]
    grad_norm: float
    old_signals: dict[str, Tensor] = field(
        default_factory=dict
    )  # fused: old_log_probs, entropy [N,T] (detached)


def _mean_metrics(mets: list[dict[str, float]]) -> dict[str, float]:
    keys: list[str] = []
    for m in mets:
        keys += [k for k in m if k not in keys]
    return {k: sum(m[k] for m in mets if k in m) / max(1, sum(k in m for m in mets)) for k in keys}


def policy_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    credit: TokenCredit,
    sequences: Tensor,
    attention_mask: Tensor,
    prompt_len: int,
    optim: OptimConfig,
    *,
    temperature: float,
    fuse_old: bool,
    seed: int,
    step: int,
) -> UpdateStats:
    """Update `model` in place on `batch` with `credit`; sequences / attention_mask [N, P+T] hold the
    prompts (`prompt_len` columns) and responses. With `fuse_old`, the old policy's log-probs and entropy
    come from the training forward (see the module docstring) and are returned in `UpdateStats.old_signals`;
    `batch`, which credit was computed on, is never written to."""
    model.train()
    n, mask = batch.num_rollouts, batch.mask
    g = torch.Generator().manual_seed(seed_for(seed, step, 99))
    params = [p for p in model.parameters() if p.requires_grad]
    mets: list[dict[str, float]] = []
    grad_norms: list[float] = []
    fused: dict[str, Tensor] = {}
    if fuse_old:
        fused = {
            s: torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
            for s in ("old_log_probs", "entropy")
        }
    old_log_probs = fused.get("old_log_probs", batch.old_log_probs)
    forward = _Forward(model, sequences, attention_mask, prompt_len, temperature, fused, step)
    for _epoch in range(optim.ppo_epochs):
        order = torch.randperm(n, generator=g) if optim.mini_batches > 1 else torch.arange(n)
        for mb in order.tensor_split(optim.mini_batches):
            mb = mb.to(mask.device)
            counts = {
                "global_tokens": float(credit.loss_mask[mb].sum()),
                "global_seqs": float((credit.loss_mask[mb].sum(-1) > 0).sum()),
            }
            optimizer.zero_grad(set_to_none=True)
            for micro in mb.split(optim.micro_batch_size or len(mb)):
                logp = forward(batch, micro)
                loss, met = objectives.policy_loss(
                    logp,
                    old_log_probs[micro] if credit.recipe.uses_ratio else None,
                    credit.token_advantages[micro],
                    credit.mask[micro],
                    credit.objective.rows(micro),
                    ref_log_prob=None if batch.ref_log_probs is None else batch.ref_log_probs[micro],
                    **counts,
                )
                if not bool(torch.isfinite(loss)):
                    raise TrainingError(f"step {step + 1}: non-finite loss ({loss.item()})")
                loss.backward()
                mets.append(met)
            gn = torch.nn.utils.clip_grad_norm_(
                params, optim.grad_clip if optim.grad_clip > 0 else float("inf")
            )
            if not bool(torch.isfinite(gn)):
                raise TrainingError(f"step {step + 1}: non-finite gradient norm")
            grad_norms.append(float(gn))
            optimizer.step()
    return UpdateStats(_mean_metrics(mets), sum(grad_norms) / len(grad_norms), fused)


@dataclass(frozen=True)
class _Forward:
    """The training forward of a micro-batch: log pi(y_t) with grad; fused (`fused` holds the buffers), also
    the old policy's log-probs and entropy, written into `fused` at the micro-batch's rows."""

    model: torch.nn.Module
    sequences: Tensor
    attention_mask: Tensor
    prompt_len: int
    temperature: float
    fused: dict[str, Tensor]
    step: int

    def __call__(self, batch: RolloutBatch, micro: Tensor) -> Tensor:
        mask = batch.mask[micro]
        out = token_log_probs(
            self.model,
            self.sequences[micro],
            self.attention_mask[micro],
            self.prompt_len,
            temperature=self.temperature,
            response_mask=mask,
            with_entropy=bool(self.fused),
        )
        logp = out[0] if self.fused else out
        if not bool(torch.isfinite(logp[mask]).all()):
            raise TrainingError(f"step {self.step + 1}: non-finite log-probs in the training forward")
        if self.fused:
            self.fused["old_log_probs"][micro] = logp.detach()
            self.fused["entropy"][micro] = out[1].detach()
        return logp


def can_fuse_old_pass(
    model: torch.nn.Module, optim: OptimConfig, recipe: Any, credit_needs: frozenset[str]
) -> bool:
    """True when the old-policy log-probs can come from the training forward (module docstring).

    It stays a separate pass when the credit method or the ratio kernel needs a policy signal
    *before* the update (S-trace's kept set, DelTA's hidden states, ARCA's surprisal), when the
    loss uses no ratio, or when dropout makes the train-mode forward differ from the eval-mode one.
    """
    if not (optim.reuse_training_forward and optim.ppo_epochs == 1 and optim.mini_batches == 1):
        return False
    if not recipe.uses_ratio or credit_needs & {"old_log_probs", "entropy", "hidden"}:
        return False
    dropout = any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())
    return not (dropout or getattr(getattr(model, "config", None), "attention_dropout", 0.0))


def lr_factor(o: OptimConfig, total_steps: int, step: int) -> float:
    """The learning-rate multiplier at `step` (a LambdaLR function): linear warm-up over
    `o.warmup_steps`, then constant or cosine down to `o.min_lr_ratio` at `total_steps`."""
    if o.warmup_steps > 0 and step < o.warmup_steps:
        return (step + 1) / o.warmup_steps
    if o.schedule == "constant":
        return 1.0
    if o.schedule == "cosine":
        span = max(1, total_steps - o.warmup_steps)
        progress = min(1.0, (step - o.warmup_steps) / span)
        return o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    raise ConfigError(f"optim.schedule must be 'constant' or 'cosine', got {o.schedule!r}")

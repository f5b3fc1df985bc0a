"""The trainer's learned critic: a `tokencredit.critic.ValueModel` with its own AdamW, built for a recipe whose
advantage estimator reads the batch's `values` (its `fields`; `ppo`, `bpco`), never for another.

Each step (`Trainer.step`): `values` gives V_old [N,T] in one no-grad forward of the step's rollouts, the
estimator turns them into A, the policy updates, then `update` fits the critic to the targets R
(`tokencredit.advantages.gae.critic_targets`) with verl's clipped value loss over `critic.epochs` x
`critic.mini_batches` optimiser steps. Token counts of its forward and backward passes are kept (and
checkpointed) so that the cost of the critic is logged beside the policy's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tokencredit import advantages, models
from tokencredit.advantages.gae import critic_targets
from tokencredit.batch import RolloutBatch
from tokencredit.critic import ValueModel, explained_variance, value_loss
from tokencredit.errors import ConfigError, TrainingError
from tokencredit.recipes import Recipe
from tokencredit.train.config import TrainConfig
from tokencredit.train.sampling import seed_for

__all__ = ["Critic", "needs_critic"]


def needs_critic(recipe: Recipe) -> bool:
    """True when the recipe's estimator reads a learned critic's values (declared data: its `fields`)."""
    return "values" in advantages.get_estimator(recipe.advantage).fields


@dataclass
class Critic:
    model: ValueModel
    optimizer: torch.optim.Optimizer
    cfg: TrainConfig
    params: dict[str, Any]  # the estimator's parameters with the recipe's values (gamma, lam, target, bounds)
    forward_tokens: int = 0  # cumulative over the run (checkpointed)
    backward_tokens: int = 0

    @classmethod
    def build(cls, cfg: TrainConfig, recipe: Recipe, device: torch.device | str) -> Critic:
        """A separate value model on the policy's warm start (`model.name` loaded again: the same starting
        weights, none shared with the policy; LoRA policies too get a fully trained critic)."""
        est = advantages.get_estimator(recipe.advantage)
        params = {**est.defaults, **recipe.advantage_params}
        lm, _ = models.load_model(cfg.model.name, dtype=cfg.model.dtype, device=device)
        try:
            model = ValueModel(lm, float(params["value_min"]), float(params["value_max"])).to(device)
        except KeyError as e:
            raise ConfigError(
                f"recipe {recipe.name!r}: advantage estimator {recipe.advantage!r} reads critic values but has no "
                f"parameter {e.args[0]!r} (the critic's value bounds)"
            ) from None
        if cfg.model.gradient_checkpointing:
            enable = getattr(model.decoder, "gradient_checkpointing_enable", None)
            if callable(enable):
                enable()
        c = cfg.critic
        trainable = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(
            trainable, lr=c.lr, betas=(cfg.optim.beta1, cfg.optim.beta2), weight_decay=c.weight_decay
        )
        return cls(model, opt, cfg, params)

    # ------------------------------------------------------------------ the step's two calls
    @torch.no_grad()
    def values(self, sequences: Tensor, attention_mask: Tensor, prompt_len: int, mask: Tensor) -> Tensor:
        """V_old [N,T] float32 (0 off `mask`): one no-grad forward of the critic before any update."""
        self.model.eval()
        rows = self.cfg.optim.micro_batch_size or sequences.shape[0]
        out = torch.cat(
            [
                self.model(
                    sequences[i : i + rows], attention_mask[i : i + rows], prompt_len, mask[i : i + rows]
                )
                for i in range(0, sequences.shape[0], rows)
            ]
        )
        self.forward_tokens += int(attention_mask.sum())
        return out

    def update(
        self, batch: RolloutBatch, sequences: Tensor, attention_mask: Tensor, prompt_len: int, step: int
    ) -> dict[str, float]:
        """Fit the critic to the step's targets; `batch.values` holds V_old. Returns the step's critic/* metrics."""
        t0 = time.perf_counter()
        assert batch.values is not None  # the trainer filled them before the estimator read them
        c, mask, old = self.cfg.critic, batch.mask, batch.values
        returns = critic_targets(batch, **self.params).float()
        ev = explained_variance(old, returns, mask)
        n = batch.num_rollouts
        g = torch.Generator().manual_seed(seed_for(self.cfg.run.seed, step, 98))
        micro_rows = self.cfg.optim.micro_batch_size
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        losses: list[float] = []
        clipfracs: list[float] = []
        grad_norms: list[float] = []
        fwd = bwd = 0
        self.model.train()
        for _epoch in range(c.epochs):
            order = torch.randperm(n, generator=g) if c.mini_batches > 1 else torch.arange(n)
            for mb in order.tensor_split(c.mini_batches):
                mb = mb.to(mask.device)
                counts = {
                    "global_tokens": float(mask[mb].sum()),
                    "global_seqs": float((mask[mb].sum(-1) > 0).sum()),
                }
                self.optimizer.zero_grad(set_to_none=True)
                for micro in mb.split(micro_rows or len(mb)):
                    v = self.model(sequences[micro], attention_mask[micro], prompt_len, mask[micro])
                    loss, clipfrac = value_loss(
                        v,
                        returns[micro],
                        old[micro],
                        mask[micro],
                        c.cliprange_value,
                        c.loss_agg_mode,
                        norm_constant=float(self.cfg.rollout.max_new_tokens),
                        **counts,
                    )
                    if not bool(torch.isfinite(loss)):
                        raise TrainingError(f"step {step + 1}: non-finite critic value loss ({loss.item()})")
                    loss.backward()
                    tokens = int(attention_mask[micro].sum())
                    fwd, bwd = fwd + tokens, bwd + tokens
                    # each micro-batch's loss is its share of the mini-batch's (global counts): sum them
                    losses.append(float(loss.detach()))
                    clipfracs.append(float(clipfrac))
                gn = torch.nn.utils.clip_grad_norm_(
                    trainable, c.grad_clip if c.grad_clip > 0 else float("inf")
                )
                if not bool(torch.isfinite(gn)):
                    raise TrainingError(f"step {step + 1}: non-finite critic gradient norm")
                grad_norms.append(float(gn))
                self.optimizer.step()
        self.forward_tokens += fwd
        self.backward_tokens += bwd
        m = mask.bool()
        steps = c.epochs * c.mini_batches
        return {
            "critic/value_loss": sum(losses) / steps,
            "critic/clipfrac": sum(clipfracs) / max(1, len(clipfracs)),
            "critic/explained_variance": ev,
            "critic/values_mean": float(old[m].mean()) if bool(m.any()) else 0.0,
            "critic/returns_mean": float(returns[m].mean()) if bool(m.any()) else 0.0,
            "critic/grad_norm": sum(grad_norms) / max(1, len(grad_norms)),
            "critic/forward_tokens": fwd + int(attention_mask.sum()),
            "critic/backward_tokens": bwd,
            "critic/forward_tokens_total": self.forward_tokens,
            "critic/backward_tokens_total": self.backward_tokens,
            "critic/time": time.perf_counter() - t0,
        }

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The critic's whole state for a checkpoint: every weight (it is trained in full), AdamW, token counts."""
        return {
            "model": {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "forward_tokens": self.forward_tokens,
            "backward_tokens": self.backward_tokens,
        }

    def load_state_dict(self, state: dict[str, Any], where: str) -> None:
        try:
            self.model.load_state_dict(state["model"])
        except RuntimeError as e:
            raise ConfigError(
                f"{where}: the critic's weights do not match this run's value model ({e})"
            ) from None
        self.optimizer.load_state_dict(state["optimizer"])
        self.forward_tokens = int(state["forward_tokens"])
        self.backward_tokens = int(state["backward_tokens"])

"""AdamW's preconditioned metric for the probe's gradient figures.

AdamW steps along m̂ / (sqrt(v̂) + eps), not along the raw gradient: each coordinate is divided by the
root of its running second moment v̂ = v / (1 - beta2^t) (Loshchilov & Hutter 2019, Alg. 2; torch's
AdamW). The cosines and signal shares of raw gradients (`gradients`, `expected`, `noise`) do not see that
rescaling; in the preconditioned metric every gradient is first mapped

    g ↦ g ⊙ s,   s = 1 / (sqrt(v̂) + eps)                    [P], θ flattened in order

and the same dot products are taken (a·b ↦ Σ_i a_i b_i s_i^2). v̂ is, in order of preference:

- the probed run's: `exp_avg_sq` of its AdamW state in a checkpoint (`read_adam_moments`), bias-corrected
  with its step count and beta2, matched to θ by parameter name (a checkpoint point: that checkpoint's; the
  run's final model: its last checkpoint's, when θ is the same parameters: not for a merged LoRA export);
- a stated stand-in otherwise (`standin_moments`): the mean over the probe's gradient batches of
  (g_b(GRPO) / n_b)^2, n_b the batch's valid response tokens (the trainer's token-mean loss gives a
  gradient of that scale), eps = 1e-8 (torch's default, the trainer's). It ignores the trainer's gradient
  clipping and its running average's memory of earlier policies, and it is estimated from the same batches
  it rescales (a mild dependence, small with many batches).

Which one was used is in the report ("preconditioner": {"source", "description"}).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "ADAM_EPS",
    "AdamMoments",
    "Preconditioner",
    "from_moments",
    "read_adam_moments",
    "standin_moments",
]

ADAM_EPS = 1e-8
"""torch.optim.AdamW's default eps, which the trainer keeps."""


@dataclass(frozen=True)
class AdamMoments:
    """AdamW's second moments of a run's trained parameters: exp_avg_sq by parameter name (float32, each the
    parameter's shape), the optimizer's step count t, beta2 and eps, and where they were read."""

    exp_avg_sq: Mapping[str, Tensor]
    step: int
    beta2: float
    eps: float
    source: str


@dataclass(frozen=True)
class Preconditioner:
    """The map g ↦ g ⊙ scale, scale [P] float32 = 1 / (sqrt(v̂) + eps); source "run" or "stand-in"."""

    scale: Tensor
    source: str
    description: str

    def record(self) -> dict[str, Any]:
        return {"source": self.source, "description": self.description}


def read_adam_moments(state: Mapping[str, Any], source: str) -> AdamMoments | str:
    """The AdamW moments in a trainer checkpoint's payload (`tokencredit.train.checkpoint.save_checkpoint`:
    "model", the trained parameters by name in the optimizer's order, and "optimizer", its state_dict), or
    the reason there are none (no step taken yet, another optimizer)."""
    opt, names = state.get("optimizer"), list(state.get("model", {}))
    if not isinstance(opt, Mapping) or not opt.get("param_groups"):
        return f"{source} holds no optimizer state"
    group = opt["param_groups"][0]
    ids = list(group.get("params", []))
    if len(opt["param_groups"]) != 1 or len(ids) != len(names) or "betas" not in group:
        return f"{source}: its optimizer state does not match its {len(names)} trained parameters one to one"
    per = opt.get("state", {})
    if not per or any(i not in per or "exp_avg_sq" not in per[i] for i in ids):
        return f"{source}: AdamW has no second moments yet (no optimizer step taken)"
    step = int(float(per[ids[0]]["step"]))
    return AdamMoments(
        {n: per[i]["exp_avg_sq"].detach().float().cpu() for n, i in zip(names, ids)},
        step,
        float(group["betas"][1]),
        float(group.get("eps", ADAM_EPS)),
        source,
    )


def from_moments(
    moments: AdamMoments,
    names: Sequence[str],
    shapes: Sequence[torch.Size],
    device: torch.device | str = "cpu",
) -> Preconditioner | str:
    """The run's preconditioner on θ (`names`, `shapes` in θ's order), or why it does not apply (θ is not the
    parameters the optimizer stepped: a merged LoRA export, another model)."""
    missing = [n for n in names if n not in moments.exp_avg_sq]
    if missing or len(names) != len(moments.exp_avg_sq):
        return (
            f"{moments.source}: its AdamW state is of {len(moments.exp_avg_sq)} parameters, the probe's θ has "
            f"{len(names)}" + (f" (e.g. {missing[0]!r} has no moment)" if missing else "")
        )
    bad = [n for n, s in zip(names, shapes) if tuple(moments.exp_avg_sq[n].shape) != tuple(s)]
    if bad:
        return f"{moments.source}: the moment of {bad[0]!r} has another shape than the parameter"
    v = torch.cat([moments.exp_avg_sq[n].reshape(-1) for n in names]).double()
    v_hat = v / (1.0 - moments.beta2**moments.step)
    scale = (1.0 / (v_hat.sqrt() + moments.eps)).float().to(device)
    return Preconditioner(
        scale,
        "run",
        f"the run's AdamW second moments from {moments.source} (t = {moments.step}, beta2 {moments.beta2:g}, "
        f"eps {moments.eps:g}, bias-corrected)",
    )


def standin_moments(sum_sq: Tensor, batches: int, why: str, eps: float = ADAM_EPS) -> Preconditioner:
    """The stand-in preconditioner from `sum_sq` [P] = Σ_b (g_b(GRPO) / n_b)^2 over `batches` batches
    (module docstring); `why` says why the run's own moments are not used."""
    v = sum_sq.double() / max(1, batches)
    return Preconditioner(
        (1.0 / (v.sqrt() + eps)).float(),
        "stand-in",
        f"a stand-in ({why}): v = the mean over the probe's {batches} gradient batches of (g_b(GRPO) / n_b)^2, "
        f"n_b the batch's response tokens, eps {eps:g}",
    )

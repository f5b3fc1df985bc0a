"""Hidden-state credit reduced inside verl's workers: what crosses Ray instead of the hidden states.

DelTA and ARCA read final hidden states ([bs, T, H]); at real scale shipping those to the driver is
hundreds of GB per step. Each is split at the point where the per-token work needs nothing but the
rank's own rows (and, for DelTA, sums over all ranks):

- ARCA: alpha_t = ||h_t - h_t^base||_2 (`tokencredit.credit.arca.residual_norm`) per micro-batch, from
  the policy forward and the adapter-free forward of the same micro-batch (`adapter_residual`);
- DelTA: the coefficients c~ of `tokencredit.credit.delta.discriminate` from the rank's hidden states,
  old log-probs and the sequence advantages A the driver sends, with the batch statistics
  all-reduced across the data-parallel group (`delta_coefficients`).

Only jagged [r_i] float32 rows leave a worker. The driver pads them into the batch as the core's reduced
signals (`tokencredit.batch.REDUCED_SIGNALS`: ``adapter_residual``, ``delta_coefficients``), which the
credit methods read in place of the hidden states, so Â comes from the one pipeline
(`tokencredit.recipes.token_credit`) as in every engine. Pure torch (no verl import): the worker hooks
(`tokencredit.integrations.verl.actor.worker`) and the estimators (`tokencredit.integrations.verl`) call it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tokencredit import credit
from tokencredit.credit.arca import residual_norm
from tokencredit.credit.delta import discriminate
from tokencredit.errors import ConfigError

__all__ = ["REDUCTIONS", "SEQ_ADV", "Reduction", "adapter_residual", "delta_coefficients", "method_params"]

SEQ_ADV = "tc_seq_adv"  # [bs] float32: DelTA's sequence advantages, sent to the workers with the batch


def method_params(method: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The credit method's hyperparameters: its defaults, then `params` (a recipe's credit_params)."""
    return {**credit.get(method).defaults, **dict(params or {})}


def adapter_residual(hidden: Tensor, base_hidden: Tensor) -> Tensor:
    """ARCA's alpha [n] float32 for n token rows [n, H] of the policy and the adapter-free hidden states."""
    if hidden.dim() != 2 or hidden.shape != base_hidden.shape:
        raise ValueError(
            f"adapter_residual: expected two [n, H] tensors, got {tuple(hidden.shape)} and {tuple(base_hidden.shape)}"
        )
    ones = torch.ones(1, hidden.shape[0], dtype=torch.bool, device=hidden.device)
    return residual_norm(hidden[None], base_hidden[None], ones)[0]


def _padded(rows: Tensor, width: int) -> Tensor:
    size = (int(rows.size(0)), width, *rows.shape[2:])
    return torch.nested.to_padded_tensor(rows, 0.0, output_size=size)


def delta_coefficients(
    hidden: Tensor,
    old_log_probs: Tensor,
    seq_adv: Tensor,
    response_mask: Tensor | None = None,
    *,
    lam_min: float = 0.8,
    lam_max: float = 1.2,
    refine_iters: int = 1,
    group: Any = None,
) -> Tensor:
    """DelTA's c~ of one rank's rows, jagged [r_i] float32, with the statistics of the whole batch.

    hidden: jagged [n, r_i, H] (the LM-head input predicting each response token, any float dtype);
    old_log_probs: jagged [n, r_i] (log pi_old of the response tokens, at the rollout temperature);
    seq_adv: [n] the rows' sequence advantages A; response_mask: [n, >= max r_i] the tokens that get credit
    (verl's response_mask; None: all r_i response rows). Row i's entries are the positions 0 .. r_i - 1
    of its response. Collective over `group` (a torch.distributed process
    group, None: the default one) whenever torch.distributed is initialised: every rank of the group
    must call it, also a rank without valid tokens (a group of one process runs no collective). Held while it runs: this rank's hidden states padded
    to [n, max r_i, H] (the input dtype; `discriminate` upcasts one block of rows at a time).
    """
    lens = hidden.offsets().diff().cpu()
    n = int(lens.numel())
    if tuple(seq_adv.shape) != (n,):
        raise ValueError(f"delta_coefficients: seq_adv has shape {tuple(seq_adv.shape)}, expected ({n},)")
    width = int(lens.max()) if n else 0
    h = _padded(hidden, width)
    logp = _padded(old_log_probs, width).float()
    rows = torch.arange(width, device=h.device)[None, :] < lens.to(h.device)[:, None]
    mask = rows if response_mask is None else rows & response_mask[:, :width].to(h.device).bool()
    # s = 1 - p_old, as tokencredit.credit.delta.delta computes it (expm1 keeps small p precise)
    scale = (-torch.expm1(logp)).clamp(0.0, 1.0)
    shard = None
    # the same decision on every rank of the group: one process needs no collective
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if torch.distributed.get_world_size(group) > 1:
            from tokencredit.distributed import Shard

            shard = Shard.split(n, group=group)
    terms = discriminate(
        h,
        scale,
        seq_adv.to(device=h.device, dtype=torch.float32),
        mask,
        lam_min,
        lam_max,
        refine_iters,
        shard=shard,
    )
    offsets = torch.cat([lens.new_zeros(1), torch.cumsum(lens, 0)]).to(h.device)
    return torch.nested.nested_tensor_from_jagged(terms.coefficients[rows].float(), offsets=offsets)


@dataclass(frozen=True)
class Reduction:
    """A credit method whose hidden-state work runs in the workers.

    request: its name in the worker request; key: the worker output and DataProto batch key of its
    [r_i] rows; signal: the core's reduced signal those rows are (`tokencredit.batch.REDUCED_SIGNALS`, the
    one the credit method declares with ``reduced=``); replaces: the signals it stands for (never sent to
    the driver); sends_advantages: the workers need A (sent as `SEQ_ADV`), so the driver computes it before
    the old-log-prob step and the estimator checks that its own A is the same.
    """

    method: str
    request: str
    key: str
    signal: str
    replaces: tuple[str, ...]
    sends_advantages: bool = False

    def worker_params(self, params: Mapping[str, Any] | None) -> dict[str, Any]:
        """The hyperparameters the workers need (DelTA's lam_min, lam_max, refine_iters), defaults filled in."""
        if not self.sends_advantages:
            return {}
        full = method_params(self.method, params)
        return {k: full[k] for k in ("lam_min", "lam_max", "refine_iters")}


# credit method -> its reduction
REDUCTIONS: dict[str, Reduction] = {
    "delta": Reduction(
        "delta", "delta_coef", "tc_delta_coef", "delta_coefficients", ("hidden",), sends_advantages=True
    ),
    "arca": Reduction(
        "arca", "adapter_residual", "tc_adapter_residual", "adapter_residual", ("hidden", "base_hidden")
    ),
}
# each reduction is the signal its credit method declares (`register(..., reduced=...)`)
assert all(credit.get(r.method).reduced == r.signal for r in REDUCTIONS.values())
HIDDEN_SIGNALS = ("hidden", "base_hidden")  # never leave a worker


def reduction_for(method: str, needs: Iterable[str]) -> Reduction | None:
    """The reduction that serves `method`'s hidden-state signals among `needs`; None when it reads none.
    ConfigError for a method that reads hidden states and has no reduction (they are not shipped)."""
    hidden = sorted(set(needs) & set(HIDDEN_SIGNALS))
    if not hidden:
        return None
    found = REDUCTIONS.get(method)
    if found is None or not set(hidden) <= set(found.replaces):
        raise ConfigError(
            f"credit method {method!r} reads {', '.join(hidden)} [bs, T, H]; verl's workers do not send hidden "
            f"states to the driver, they reduce them for {', '.join(sorted(REDUCTIONS))} only "
            "(tokencredit.integrations.verl.actor.reductions)"
        )
    return found

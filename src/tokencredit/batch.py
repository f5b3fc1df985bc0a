"""`RolloutBatch`: one validated container for N rollouts right-padded to T response tokens.

Everything downstream (group advantages, credit methods, objectives, diagnostics) reads its
inputs from here, so shape, dtype and finiteness are checked once, with errors that name the
field and the expected vs actual shape/dtype, and for scores the offending rollout.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from tokencredit.distributed import Shard

# Optional per-token signals and their trailing shape ("T" = per token, "TH" = per token vector).
# They are produced by `tokencredit.signals` in one no-grad pass of the old policy (plus one
# adapter-disabled pass for the base_* signals and one negative-prompt pass for GCPO).
SIGNALS: dict[str, str] = {
    "old_log_probs": "T",  # log pi_old(y_t), logits / temperature
    "ref_log_probs": "T",  # log pi_ref(y_t) for the KL term
    "entropy": "T",  # full-vocabulary entropy of pi_old at t
    "sum_sq_probs": "T",  # sum_v pi_old(v)^2 at t, full vocabulary (the optimal token baseline's variance proxy)
    "hidden": "TH",  # final hidden state that feeds the LM head (after the final norm), old policy
    "base_hidden": "TH",  # same with the LoRA adapter disabled (ARCA)
    "base_log_probs": "T",  # log pi_base(y_t), adapter disabled (policy divergence)
    "neg_log_probs": "T",  # log q(y_t) under GCPO's negative prompt
    # Monte-Carlo signals, computed by sampling continuations and scoring them (tokencredit.oracle.mc_signals)
    "mc_advantages": "T",  # A*_t = V(s_t+1) - V(s_t), token-level ground-truth advantage (the oracle recipe)
    "mc_step_advantages": "T",  # VinePPO: V(end of step) - V(start of step) on each reasoning step's tokens
    # Hidden-state credit reduced where the hidden states live (verl's workers), so that [N,T,H] never moves:
    "adapter_residual": "T",  # ARCA's alpha_t = ||hidden_t - base_hidden_t||_2
    "delta_coefficients": "T",  # DelTA's c~ for this batch's own sequence advantages (whole-batch statistics)
}
# The signals that come from sampling continuations with the policy, not from a forward pass.
MC_SIGNALS = ("mc_advantages", "mc_step_advantages")
# The signals an engine computes from hidden states where they live and hands over instead of them; a credit
# method that declares one (`register(..., reduced=...)`) reads it in place of its `needs` when present.
REDUCED_SIGNALS = ("adapter_residual", "delta_coefficients")


class BatchValidationError(ValueError):
    """A RolloutBatch field has the wrong shape, dtype or values."""


def _describe(t: Tensor) -> str:
    return f"shape {tuple(t.shape)} dtype {t.dtype}"


@dataclass
class RolloutBatch:
    """N rollouts (prompts x G completions), right-padded to T response tokens.

    Required:
      token_ids [N,T] int64: response token ids (prompt excluded); padding may hold any id.
      mask [N,T] bool: True on valid response tokens (0/1 integer or float input is converted).
      group_ids [N] int64: rollouts with the same id answered the same prompt.
      scores [N] float: verifier reward per rollout; must be finite.
    Optional per-token signals: see `SIGNALS` ([N,T] or [N,T,H], floating point).
      truncated [N] bool: the completion hit the length limit without EOS.
      baseline_scores [N] float: the reward of one greedy (temperature 0) rollout of each row's
        prompt (ReMax's baseline; every row of a group carries its prompt's value); must be finite.
      tail_mask [N,T] bool: the tokens of the task's reward-irrelevant tail, whose exact credit is 0
        (`tokencredit.credit.tail`; read by a recipe with ``zero_tail``); False off the mask.
      values [N,T] float: a learned critic's V_t, the value of the state before response token t (PPO's
        GAE; `tokencredit.critic`); must be finite on valid tokens.
      shard: set when these N rollouts are this rank's part of a batch split across data-parallel
        ranks (`tokencredit.distributed.Shard`); batch statistics are then the whole batch's, and
        `group_ids` must be the same for a prompt on every rank.
    """

    token_ids: Tensor
    mask: Tensor
    group_ids: Tensor
    scores: Tensor
    old_log_probs: Tensor | None = None
    ref_log_probs: Tensor | None = None
    entropy: Tensor | None = None
    sum_sq_probs: Tensor | None = None
    hidden: Tensor | None = None
    base_hidden: Tensor | None = None
    base_log_probs: Tensor | None = None
    neg_log_probs: Tensor | None = None
    mc_advantages: Tensor | None = None
    mc_step_advantages: Tensor | None = None
    adapter_residual: Tensor | None = None
    delta_coefficients: Tensor | None = None
    truncated: Tensor | None = None
    baseline_scores: Tensor | None = None
    values: Tensor | None = None
    tail_mask: Tensor | None = None
    shard: Shard | None = None

    def __post_init__(self) -> None:
        self._validate()

    # ------------------------------------------------------------------ validation
    def _validate(self) -> None:
        for name in ("token_ids", "mask", "group_ids", "scores"):
            if not isinstance(getattr(self, name), Tensor):
                raise BatchValidationError(
                    f"RolloutBatch.{name}: expected a torch.Tensor, got {type(getattr(self, name)).__name__}"
                )
        ids = self.token_ids
        if ids.dim() != 2:
            raise BatchValidationError(f"RolloutBatch.token_ids: expected shape [N, T], got {_describe(ids)}")
        if ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise BatchValidationError(
                f"RolloutBatch.token_ids: expected an integer dtype, got {_describe(ids)}"
            )
        n, t = ids.shape
        if ids.dtype != torch.int64:
            self.token_ids = ids = ids.long()

        m = self.mask
        if tuple(m.shape) != (n, t):
            raise BatchValidationError(f"RolloutBatch.mask: expected shape ({n}, {t}), got {_describe(m)}")
        if m.dtype != torch.bool:
            if not bool(((m == 0) | (m == 1)).all()):
                raise BatchValidationError("RolloutBatch.mask: values must be 0/1 (or bool)")
            self.mask = m.bool()

        g = self.group_ids
        if tuple(g.shape) != (n,):
            raise BatchValidationError(f"RolloutBatch.group_ids: expected shape ({n},), got {_describe(g)}")
        if g.dtype.is_floating_point or g.dtype == torch.bool:
            raise BatchValidationError(
                f"RolloutBatch.group_ids: expected an integer dtype, got {_describe(g)}"
            )
        self.group_ids = g.long()

        s = self.scores
        if tuple(s.shape) != (n,):
            raise BatchValidationError(f"RolloutBatch.scores: expected shape ({n},), got {_describe(s)}")
        if not s.dtype.is_floating_point:
            self.scores = s = s.float()
        check_finite_scores(s)

        for name, kind in SIGNALS.items():
            if getattr(self, name) is not None:
                self._check_signal(name, kind, n, t)
        if self.truncated is not None:
            tr = self.truncated
            if tuple(tr.shape) != (n,):
                raise BatchValidationError(
                    f"RolloutBatch.truncated: expected shape ({n},), got {_describe(tr)}"
                )
            self.truncated = tr.bool()
        if self.baseline_scores is not None:
            b = self.baseline_scores
            if not isinstance(b, Tensor) or tuple(b.shape) != (n,):
                got = _describe(b) if isinstance(b, Tensor) else type(b).__name__
                raise BatchValidationError(f"RolloutBatch.baseline_scores: expected shape ({n},), got {got}")
            if not b.dtype.is_floating_point:
                self.baseline_scores = b = b.float()
            check_finite_scores(b, "RolloutBatch.baseline_scores")
        if self.values is not None:
            self._check_signal("values", "T", n, t)  # a per-token float field, checked as the signals are
        if self.tail_mask is not None:
            tm = self.tail_mask
            if not isinstance(tm, Tensor) or tuple(tm.shape) != (n, t):
                got = _describe(tm) if isinstance(tm, Tensor) else type(tm).__name__
                raise BatchValidationError(f"RolloutBatch.tail_mask: expected shape ({n}, {t}), got {got}")
            self.tail_mask = tm.bool() & self.mask
        if self.shard is not None and tuple(self.shard.rows.shape) != (n,):
            raise BatchValidationError(
                f"RolloutBatch.shard: rows must give the global index of each of the {n} rollouts, "
                f"got shape {tuple(self.shard.rows.shape)}"
            )

    def _check_signal(self, name: str, kind: str, n: int, t: int) -> None:
        """A per-token signal: a float tensor [N,T] ("T") or [N,T,H] ("TH"), finite on valid tokens."""
        v = getattr(self, name)
        if not isinstance(v, Tensor):
            raise BatchValidationError(
                f"RolloutBatch.{name}: expected a torch.Tensor, got {type(v).__name__}"
            )
        ok = (
            v.dim() == 2 and tuple(v.shape) == (n, t)
            if kind == "T"
            else v.dim() == 3 and tuple(v.shape[:2]) == (n, t)
        )
        if not ok:
            want = f"({n}, {t})" if kind == "T" else f"({n}, {t}, H)"
            raise BatchValidationError(f"RolloutBatch.{name}: expected shape {want}, got {_describe(v)}")
        if not v.dtype.is_floating_point:
            raise BatchValidationError(f"RolloutBatch.{name}: expected a floating dtype, got {_describe(v)}")
        if v.dim() == 3:
            # amax/amin propagate NaN and keep inf: same verdict as isfinite(v).all(-1), no [N,T,H] temporary
            bad = ~(torch.isfinite(v.amax(-1)) & torch.isfinite(v.amin(-1)))
        else:
            bad = ~torch.isfinite(v)
        bad &= self.mask
        if bool(bad.any()):
            i, j = (int(x) for x in bad.nonzero()[0])
            raise BatchValidationError(
                f"RolloutBatch.{name}: non-finite value at rollout {i}, token {j} ({int(bad.sum())} in all)"
            )

    # ------------------------------------------------------------------ helpers
    @property
    def num_rollouts(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def max_len(self) -> int:
        return int(self.token_ids.shape[1])

    @property
    def lengths(self) -> Tensor:
        """[N] number of valid response tokens per rollout."""
        return self.mask.sum(-1)

    def correct(self, threshold: float = 0.0) -> Tensor:
        """[N] bool: rollout i counts as correct iff its score > threshold (KTAE's convention)."""
        return self.scores > threshold

    def available_signals(self) -> set[str]:
        return {name for name in SIGNALS if getattr(self, name) is not None}

    def require(self, names: Iterable[str], who: str) -> None:
        """Raise a clear error if any of the per-token signals `names` is missing."""
        missing = sorted(n for n in names if getattr(self, n, None) is None)
        if missing:
            raise BatchValidationError(
                f"{who} needs the per-token signal(s) {', '.join(missing)}, which this RolloutBatch does not carry; "
                "compute them with tokencredit.signals (the trainer and plugins do this from the method's `needs`)"
            )

    def signal(self, name: str, who: str) -> Tensor:
        """The per-token signal `name` ([N,T], or [N,T,H] for the hidden states; see `SIGNALS`), never None.

        The one way a consumer reads an optional signal: the field is `Tensor | None`, and this returns
        the tensor or raises `require`'s BatchValidationError naming `who` (e.g. "credit method
        'entropy-80-20'") and the missing signal, where a plain attribute read would fail later on None.
        """
        if name not in SIGNALS:
            raise BatchValidationError(
                f"{who} reads an unknown per-token signal {name!r}; known: {', '.join(SIGNALS)}"
            )
        value = getattr(self, name)
        if not isinstance(value, Tensor):
            self.require((name,), who)  # None: the message every consumer gives for a missing signal
            raise BatchValidationError(
                f"RolloutBatch.{name}: expected a torch.Tensor, got {type(value).__name__}"
            )
        return value

    def select(self, rows: Tensor) -> RolloutBatch:
        """A new batch with the rollouts `rows` (index or bool mask over N); not for a rank's shard (the
        selection would no longer be a split of the whole batch)."""
        if self.shard is not None:
            raise BatchValidationError("RolloutBatch.select: a sharded batch cannot be sub-selected")
        kwargs: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            kwargs[f.name] = None if v is None else v[rows]
        return RolloutBatch(**kwargs)

    def with_signals(self, signals: Mapping[str, Tensor]) -> RolloutBatch:
        """A new, validated batch with `signals` ({name: tensor}, names from SIGNALS) added or replaced, moved
        to this batch's device; this batch is left as it is (credit computed on it stays valid)."""
        unknown = sorted(set(signals) - set(SIGNALS))
        if unknown:
            raise BatchValidationError(
                f"RolloutBatch.with_signals: unknown signal(s) {unknown}; known: {sorted(SIGNALS)}"
            )
        kwargs = {f.name: getattr(self, f.name) for f in fields(self)}
        kwargs.update({k: v.to(self.mask.device) for k, v in signals.items()})
        return RolloutBatch(**kwargs)

    def to(self, device: torch.device | str) -> RolloutBatch:
        kwargs = {f.name: getattr(self, f.name) for f in fields(self)}
        kwargs.update({k: v.to(device) for k, v in kwargs.items() if isinstance(v, Tensor)})
        return RolloutBatch(**kwargs)


def check_finite_scores(scores: Tensor, what: str = "RolloutBatch.scores") -> None:
    """Raise naming the first rollout whose score is NaN or inf (never a silent 0)."""
    bad = ~torch.isfinite(scores)
    if bool(bad.any()):
        idx = bad.nonzero().flatten().tolist()
        shown = ", ".join(str(i) for i in idx[:8]) + (" ..." if len(idx) > 8 else "")
        raise BatchValidationError(
            f"{what}: non-finite score at rollout {idx[0]} (value {scores[idx[0]].item()}); "
            f"{len(idx)} non-finite in all: rollouts {shown}"
        )

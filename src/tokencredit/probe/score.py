"""Scoring: the probe's numbers for a credit tensor against the ground truth, the chance baselines,
and every `--methods` column on one batch.

Metrics (per method; rollouts of "mixed" groups, i.e. groups with both correct and wrong
rollouts, where the sequence advantage is not 0):

- blame@k: share of wrong rollouts (verifier score 0) whose first wrong token is among the k
  most negatively credited tokens of that rollout (the k smallest Â over its valid tokens,
  EOS included), k = 1, 3, 10 by default;
- mean rank of the first wrong token (1 = the most negative), and rank / length;
- praise@k (JSON only): share of correct rollouts whose first answer token is among the k most
  positively credited tokens;
- |Â| format / computed / answer / free: per rollout, the share of its |Â| mass on each token label,
  averaged over the rollouts that carry credit (uniform credit gives the token shares).

Ties count in expectation (`tokencredit.probe.metrics`). Two baselines are scored on the
same rollouts: "random" (i.i.d. N(0, 1) credit per token, averaged over ``draws`` draws) and
"uniform" (one value per rollout).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import torch
from torch import Tensor

from tokencredit.batch import RolloutBatch
from tokencredit.columns import NA_LORA, MethodCredit, MethodSpec, method_credit
from tokencredit.probe.config import DEFAULT_KS
from tokencredit.probe.metrics import (
    blame_hits,
    expected_hits,
    mass_shares,
    mean_of,
    random_credit,
    stderr_of,
    target_ranks,
    uniform_credit,
)
from tokencredit.probe.truth import LABELS, ProbeTruth
from tokencredit.recipes import TokenCredit

__all__ = [
    "method_credits",
    "method_row",
    "probe_batch",
    "score_baselines",
    "score_credit",
    "score_methods",
    "stitch_credits",
    "training_batches",
]


def score_credit(credit: Tensor, truth: ProbeTruth, ks: Sequence[int] = DEFAULT_KS) -> dict[str, Any]:
    """The probe's numbers for one credit tensor [N,T] (None where no rollout qualifies).

    Keys: blame_rollouts, blame@k (and blame@k_se, its standard error over rollouts), mean_rank,
    mean_rank_frac (rank / length), praise_rollouts,
    praise@k, mass_rollouts, mass_format / mass_computed / mass_answer / mass_free, blame_by_kind {kind: {n, blame@k}}.
    """
    c = credit.detach().cpu()
    if tuple(c.shape) != tuple(truth.mask.shape):
        raise ValueError(
            f"score_credit: credit shape {tuple(c.shape)} differs from the truth's {tuple(truth.mask.shape)}"
        )
    return {**_blame_scores(c, truth, ks), **_praise_scores(c, truth, ks), **_mass_scores(c, truth)}


def _blame_scores(c: Tensor, truth: ProbeTruth, ks: Sequence[int]) -> dict[str, Any]:
    """blame_rollouts, blame@k, blame@k_se, mean_rank, mean_rank_frac, blame_by_kind."""
    out: dict[str, Any] = {}
    b = truth.blame_rows.nonzero().squeeze(1)
    out["blame_rollouts"] = int(b.numel())
    if not b.numel():
        out.update({f"blame@{k}": None for k in ks})
        out.update({f"blame@{k}_se": None for k in ks})
        out.update(mean_rank=None, mean_rank_frac=None, blame_by_kind={})
        return out
    cb, mb, tb = c[b], truth.mask[b], truth.target[b]
    for k in ks:
        hits = blame_hits(cb, mb, tb, k)
        out[f"blame@{k}"] = mean_of(hits)
        out[f"blame@{k}_se"] = stderr_of(hits)
    ranks = target_ranks(cb, mb, tb)
    out["mean_rank"] = mean_of(ranks)
    out["mean_rank_frac"] = mean_of(ranks / mb.sum(1).double())
    kinds = [truth.kinds[i] for i in b.tolist()]
    by_kind: dict[str, dict[str, Any]] = {}
    for kind in sorted(set(kinds)):
        sel = torch.tensor([x == kind for x in kinds])
        entry: dict[str, Any] = {"n": int(sel.sum())}
        for k in ks:
            entry[f"blame@{k}"] = mean_of(blame_hits(cb[sel], mb[sel], tb[sel], k))
        by_kind[kind] = entry
    out["blame_by_kind"] = by_kind
    return out


def _praise_scores(c: Tensor, truth: ProbeTruth, ks: Sequence[int]) -> dict[str, Any]:
    """praise_rollouts and praise@k: the first answer token among the k most positive Â of a correct rollout."""
    m = truth.mask
    p = truth.praise_rows.nonzero().squeeze(1)
    out: dict[str, Any] = {"praise_rollouts": int(p.numel())}
    for k in ks:
        out[f"praise@{k}"] = (
            mean_of(expected_hits(c[p], m[p], truth.target[p], k, descending=True)) if p.numel() else None
        )
    return out


def _mass_scores(c: Tensor, truth: ProbeTruth) -> dict[str, Any]:
    """mass_rollouts and mass_<label>: the mean share of |Â| on each token label over mixed-group rollouts."""
    rows = truth.mixed.nonzero().squeeze(1)
    shares, defined = mass_shares(c[rows], truth.mask[rows], truth.labels[rows].clamp(min=0))
    out: dict[str, Any] = {"mass_rollouts": int(defined.sum())}
    for j, name in enumerate(LABELS):
        out[f"mass_{name}"] = mean_of(shares[defined, j])
    return out


def _average(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Key-wise mean of numeric values (nested dicts recursively); None stays None."""
    out: dict[str, Any] = {}
    for key, first in results[0].items():
        if isinstance(first, dict):
            out[key] = _average([r[key] for r in results])
        elif first is None or isinstance(first, str):
            out[key] = first
        elif key in ("blame_rollouts", "praise_rollouts", "mass_rollouts", "n"):
            out[key] = first
        else:
            out[key] = sum(r[key] for r in results) / len(results)
    return out


def score_baselines(
    truth: ProbeTruth, ks: Sequence[int] = DEFAULT_KS, *, draws: int = 20, seed: int = 0
) -> dict[str, dict[str, Any]]:
    """{"random": mean over `draws` i.i.d. N(0, 1) credits, "uniform": constant credit} on the same rollouts."""
    if draws < 1:
        raise ValueError(f"random draws must be >= 1, got {draws}")
    g = torch.Generator().manual_seed(seed)
    rand = _average([score_credit(random_credit(truth.mask, g), truth, ks) for _ in range(draws)])
    return {"random": rand, "uniform": score_credit(uniform_credit(truth.mask), truth, ks)}


def training_batches(group_ids: Tensor, prompts_per_step: int, copies: Tensor | None = None) -> list[Tensor]:
    """Row indices (int64) of the training-sized batches of a probe set: its groups in order of id, cut
    into runs of `prompts_per_step` groups (the last may be shorter), as the trainer's steps take them;
    with `copies` [N] (0 / 1, two groups per problem) each copy's groups are cut separately, so that a
    batch holds distinct problems. One batch of every row when prompts_per_step is 0 or covers all groups."""
    g = group_ids.long().cpu()
    keys = torch.zeros_like(g) if copies is None else copies.long().cpu()
    out: list[Tensor] = []
    for key in torch.unique(keys).tolist():
        ids = torch.unique(g[keys == key])
        step = prompts_per_step or max(1, ids.numel())
        for part in ids.split(step):
            out.append((torch.isin(g, part) & (keys == key)).nonzero().squeeze(1))
    if copies is None and len(out) <= 1:
        return [torch.arange(g.numel())]
    return out


def _scatter(parts: Sequence[Tensor], rows: Sequence[Tensor], n: int) -> Tensor:
    """[n, ...] with parts[k] at rows[k] (the parts' rows partition 0..n-1)."""
    out = parts[0].new_zeros((n, *parts[0].shape[1:]))
    for part, r in zip(parts, rows):
        out[r.to(out.device)] = part
    return out


def stitch_credits(parts: Sequence[TokenCredit], rows: Sequence[Tensor], n: int) -> TokenCredit:
    """One `TokenCredit` of n rows from the credits of the batches `rows` (a partition of 0..n-1), each
    computed on its own: the per-row tensors (A, Â, masks, a ratio kernel's per-row arguments such as
    S-trace's kept set) put back in place; the other kernel arguments must agree across the batches.
    Under token-mean each row's effective credit is its batch's (`TokenCredit.effective`)."""
    first = parts[0]
    args: dict[str, Any] = {}
    for key, value in first.objective.kernel_args.items():
        values = [p.objective.kernel_args[key] for p in parts]
        if (
            isinstance(value, Tensor)
            and value.dim() >= 1
            and all(v.shape[0] == r.numel() for v, r in zip(values, rows))
        ):
            args[key] = _scatter(values, rows, n)
        elif all((torch.equal(v, value) if isinstance(v, Tensor) else v == value) for v in values):
            args[key] = value
        else:
            raise ValueError(f"kernel argument {key!r} differs between the training batches")
    return TokenCredit(
        first.recipe,
        _scatter([p.seq_advantages for p in parts], rows, n),
        _scatter([p.token_advantages for p in parts], rows, n),
        _scatter([p.mask for p in parts], rows, n),
        _scatter([p.loss_mask for p in parts], rows, n),
        replace(first.objective, kernel_args=args),
    )


def method_credits(
    batch: RolloutBatch,
    specs: Sequence[MethodSpec],
    *,
    lora: bool = False,
    unavailable: Mapping[str, str] | None = None,
    special_ids: Sequence[int] | None = None,
    batches: Sequence[Tensor] | None = None,
) -> dict[str, MethodCredit]:
    """{method name: `MethodCredit`} for `specs` on one batch, from the one pipeline
    (`tokencredit.columns.method_credit`, with the tokenizer's `special_ids`).

    batches: row indices of training-sized batches (`training_batches`): each method's credit is computed
    on each of them separately (`RolloutBatch.select`, the same pipeline call the trainer makes per step)
    and put back in place (`stitch_credits`), so that a batch statistic (DelTA's centroids and scale, the
    80/20 mask's and S-trace's entropy quantiles, a batch-normalised advantage) is the training batch's.
    None or a single batch: the whole batch at once. A method that fails on any batch is n/a, naming it."""
    if batches is None or len(batches) <= 1:
        return {
            spec.name: method_credit(spec, batch, special_ids=special_ids, lora=lora, unavailable=unavailable)
            for spec in specs
        }
    subs = [batch.select(b) for b in batches]
    out: dict[str, MethodCredit] = {}
    for spec in specs:
        got = [
            method_credit(spec, s, special_ids=special_ids, lora=lora, unavailable=unavailable) for s in subs
        ]
        bad = next((k for k, g in enumerate(got) if g.credit is None), None)
        if bad is not None:
            reason = got[bad].reason
            out[spec.name] = MethodCredit(
                spec, None, reason if reason == NA_LORA or bad == 0 else f"training batch {bad + 1}: {reason}"
            )
            continue
        try:
            credit = stitch_credits([g.credit for g in got], batches, batch.num_rollouts)  # type: ignore[misc]
        except ValueError as e:
            out[spec.name] = MethodCredit(spec, None, f"ValueError: {e}")
            continue
        out[spec.name] = MethodCredit(spec, credit)
    return out


def method_row(got: MethodCredit, numbers: Callable[[Tensor], dict[str, Any]]) -> dict[str, Any]:
    """One method's result: kind, label and "status": "ok" with `numbers` of its effective credit, or
    "n/a" with the "reason" it has no credit."""
    base = {"kind": got.spec.kind, "label": got.spec.label}
    if got.credit is None:
        return {**base, "status": "n/a", "reason": got.reason}
    return {**base, "status": "ok", **numbers(got.credit.effective())}


def probe_batch(
    batch: RolloutBatch,
    truth: ProbeTruth,
    specs: Sequence[MethodSpec],
    *,
    ks: Sequence[int] = DEFAULT_KS,
    lora: bool = False,
    unavailable: Mapping[str, str] | None = None,
    special_ids: Sequence[int] | None = None,
    credits: dict[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """{method name: result} for `specs` (`tokencredit.columns.MethodSpec`) on one batch.

    Credit comes from the one pipeline, `tokencredit.recipes.token_credit`, with the tokenizer's
    `special_ids`. Each result has "status": "ok" with `score_credit`'s numbers on the method's
    effective credit, or "n/a" with a "reason" (a LoRA method without an adapter, a missing
    signal, or the error the method raised on this batch). `credits`, when given, receives each
    computed method's `TokenCredit` by name.
    """
    got = method_credits(batch, specs, lora=lora, unavailable=unavailable, special_ids=special_ids)
    if credits is not None:
        credits.update({name: g.credit for name, g in got.items() if g.credit is not None})
    return score_methods(got, truth, ks)


def score_methods(
    got: Mapping[str, MethodCredit], truth: ProbeTruth, ks: Sequence[int] = DEFAULT_KS
) -> dict[str, dict[str, Any]]:
    """{method name: `method_row` with `score_credit`'s numbers} for credit already computed."""
    return {name: method_row(g, partial(score_credit, truth=truth, ks=ks)) for name, g in got.items()}

"""The numbers of an explain page: every method's effective credit on a batch, its diagnostics on the
shown rows and the rank correlations between methods, as a `ReportData` (no model, no I/O).

What is shown for every method is its effective credit (`tokencredit.objectives.effective`): the
per-token gradient weight at ratio 1, which is Â itself for per-token kernels and the kernel's
on-policy credit for GSPO, P-trace and S-trace. The `saved` column shows the Â saved with the rollouts
as it is (`assemble.SavedCredit`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from tokencredit import diagnostics as dg
from tokencredit.batch import RolloutBatch
from tokencredit.columns import MethodCredit, MethodSpec, SavedSpec, method_credit
from tokencredit.errors import ConfigError
from tokencredit.explain.assemble import SavedCredit
from tokencredit.explain.inputs import GroupInput
from tokencredit.explain.tokens import display_text, saved_display_text
from tokencredit.explain.views import GroupView, MethodView, ReportData, ResponseView

__all__ = [
    "Columns",
    "compute_columns",
    "credited_groups",
    "display_tokens",
    "explain_batch",
    "make_groups",
    "report_data",
]


def display_tokens(
    groups: Sequence[GroupInput], tokenizer: Any
) -> tuple[list[list[str]], list[list[bool]], list[list[bool]]]:
    """Per completion, the text of each token (decoded one id at a time; byte tokens as <0xNN>, `tokens`), whether
    it is a special token and whether its text holds <0xNN> byte marks."""
    special = set(getattr(tokenizer, "all_special_ids", []) or []) if tokenizer is not None else set()
    texts, flags, marked = [], [], []
    for g in groups:
        for c in g.completions:
            ids = c.token_ids or []
            if tokenizer is not None:
                shown, raw = display_text(tokenizer, ids)
            elif c.tokens is not None:
                shown, raw = saved_display_text(c.tokens)
            else:
                shown, raw = [f"⟨{i}⟩" for i in ids], [False] * len(ids)
            texts.append(shown)
            marked.append(raw)
            flags.append([i in special for i in ids])
    return texts, flags, marked


def make_groups(
    batch: RolloutBatch,
    tokens: Sequence[Sequence[str]],
    seq_advantages: Tensor,
    *,
    problems: Mapping[int, str] | None = None,
    answers: Mapping[int, str | None] | None = None,
    correct: Sequence[bool | None] | None = None,
    special: Sequence[Sequence[bool]] | None = None,
    byte_marks: Sequence[Sequence[bool]] | None = None,
    groups: int | None = None,
    group_ids: Sequence[int] | None = None,
) -> list[GroupView]:
    """GroupViews of the first `groups` groups of `batch` (in order of first appearance), or of the groups
    `group_ids` names, in that order; one ResponseView per row.

    tokens[i]: display text of row i's valid tokens; entropy and probability come from the
    batch's entropy / old_log_probs (exp) when present; seq_advantages A [N] is shown per response.
    """
    mask = batch.mask.cpu()
    order: list[int] = []
    for g in batch.group_ids.tolist():
        if g not in order:
            order.append(g)
    index = {g: k for k, g in enumerate(order)}
    if group_ids is not None:
        missing = [g for g in group_ids if g not in index]
        if missing:
            raise ValueError(f"make_groups: no group {missing[0]} in the batch")
        order = list(group_ids)
    if groups is not None:
        order = order[:groups]
    ent = batch.entropy.detach().float().cpu() if batch.entropy is not None else None
    lp = batch.old_log_probs.detach().double().cpu() if batch.old_log_probs is not None else None
    out = []
    gids = batch.group_ids.tolist()
    for gid in order:
        views = []
        for i in (i for i, g in enumerate(gids) if g == gid):
            n = int(mask[i].sum())
            if len(tokens[i]) != n:
                raise ValueError(
                    f"make_groups: row {i} has {n} valid tokens but {len(tokens[i])} display tokens"
                )
            views.append(
                ResponseView(
                    row=i,
                    tokens=list(tokens[i]),
                    reward=float(batch.scores[i]),
                    advantage=float(seq_advantages[i]),
                    correct=None if correct is None else correct[i],
                    truncated=bool(batch.truncated[i]) if batch.truncated is not None else False,
                    entropy=None if ent is None else ent[i, :n].tolist(),
                    prob=None if lp is None else lp[i, :n].exp().tolist(),
                    special=None if special is None else list(special[i]),
                    byte_marks=None if byte_marks is None else list(byte_marks[i]),
                )
            )
        out.append(GroupView(gid, (problems or {}).get(gid, ""), views, (answers or {}).get(gid), index[gid]))
    return out


def _varying(x: Tensor, mask: Tensor) -> Tensor:
    """bool[N]: rows with >= 2 valid tokens whose values are not all equal (up to float rounding)."""
    m = mask.bool()
    xd = x.double()
    hi = torch.where(m, xd, torch.full_like(xd, -math.inf)).amax(-1)
    lo = torch.where(m, xd, torch.full_like(xd, math.inf)).amin(-1)
    tol = 1e-6 * torch.maximum(hi.abs(), lo.abs()).clamp(min=1.0)
    return (m.sum(-1) >= 2) & ((hi - lo) > tol)


def _effective(got: MethodCredit, view: MethodView) -> Tensor | None:
    """The column's effective credit [N, T] on the whole batch, or None with the reason in `view.note`."""
    if got.credit is None:
        view.note = got.reason
        return None
    try:
        return got.credit.effective()
    except (ConfigError, ValueError, FloatingPointError) as e:
        view.note = f"{type(e).__name__}: {e}"
        return None


def _fill_view(
    view: MethodView, eff: Tensor, seq: Tensor, mask: Tensor, rows: list[int], entropy: Tensor | None
) -> None:
    """A computed column on the shown rows: eff [n, T] and seq [n] and mask [n, T] on the CPU, row k is batch row rows[k]."""
    view.credit = {r: eff[k, : int(mask[k].sum())].tolist() for k, r in enumerate(rows)}
    view.seq_advantages = {r: float(seq[k]) for k, r in enumerate(rows)}
    w = dg.credit_weights(eff, mask)
    g = dg.gini(w, mask)
    defined = dg.defined_rows(w, mask)
    view.row_gini = {r: (float(g[k]) if bool(defined[k]) else None) for k, r in enumerate(rows)}
    view.diagnostics = dict(dg.summary(eff, mask, seq, entropy))
    peak = float(eff[mask].abs().max()) if bool(mask.any()) else 0.0
    view.scale = peak if peak > 0 else 1.0


def _correlations(
    shown: Mapping[str, Tensor], mask: Tensor
) -> dict[tuple[str, str], tuple[float | None, int]]:
    """{(a, b): (mean Spearman over the rows where both credits vary, or None; how many rows)}, both orders."""
    correlations: dict[tuple[str, str], tuple[float | None, int]] = {}
    names = list(shown)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            rho = dg.rank_correlation(shown[a], shown[b], mask)
            ok = _varying(shown[a], mask) & _varying(shown[b], mask)
            value = float(rho[ok].mean()) if bool(ok.any()) else None
            correlations[(a, b)] = correlations[(b, a)] = (value, int(ok.sum()))
    return correlations


@dataclass
class Columns:
    """Every column's credit on the whole batch: `views` (a skipped one with its note), and for each computed
    column its effective credit [N, T] and sequence advantages [N] (CPU; the saved column's rows without Â are 0,
    `present` [N] says which)."""

    views: list[MethodView]
    effective: dict[str, Tensor] = field(default_factory=dict)
    seq_advantages: dict[str, Tensor] = field(default_factory=dict)
    present: dict[str, Tensor] = field(default_factory=dict)


def compute_columns(
    batch: RolloutBatch,
    methods: Sequence[MethodSpec | SavedSpec],
    *,
    unavailable: Mapping[str, str] | None = None,
    special_ids: Sequence[int] | None = None,
    credits: dict[str, Any] | None = None,
    saved: SavedCredit | None = None,
) -> Columns:
    """Every method's effective credit on the whole `batch` (see `explain_batch`), before any group is chosen."""
    mask = batch.mask.cpu()
    cols = Columns(views=[])
    for spec in methods:
        view = MethodView(spec.name, spec.label, spec.description)
        cols.views.append(view)
        if isinstance(spec, SavedSpec):
            if saved is None:
                view.note = "no saved token advantages given"
                continue
            cols.effective[spec.name] = (
                saved.token_advantages * mask
            )  # 0 off the tokens, as every computed column
            cols.seq_advantages[spec.name] = saved.seq_advantages
            cols.present[spec.name] = saved.present
            continue
        got = method_credit(spec, batch, special_ids=special_ids, unavailable=unavailable)
        effective = _effective(got, view)
        if effective is None or got.credit is None:
            continue
        if credits is not None:
            credits[spec.name] = got.credit
        cols.effective[spec.name] = effective.detach().cpu()
        cols.seq_advantages[spec.name] = got.credit.seq_advantages.detach().cpu()
    return cols


def credited_groups(batch: RolloutBatch, columns: Columns) -> set[int]:
    """The ids of the groups where some computed column's credit is non-zero on one of the tokens."""
    mask = batch.mask.cpu()
    hit = torch.zeros(mask.shape[0], dtype=torch.bool)
    for eff in columns.effective.values():
        hit |= ((eff != 0) & mask).any(-1)
    return set(batch.group_ids.cpu()[hit].tolist())


def report_data(
    batch: RolloutBatch,
    columns: Columns,
    groups: Sequence[GroupView],
    *,
    title: str = "tokencredit explain",
    subtitle: str = "",
    notes: Sequence[str] = (),
) -> ReportData:
    """The report structure of `columns` on the rows of `groups`: diagnostics and rank correlations on those rows."""
    rows = [r.row for g in groups for r in g.responses]
    idx = torch.tensor(rows, dtype=torch.int64)
    mask = batch.mask.cpu()[idx]
    entropy = batch.entropy.cpu()[idx] if batch.entropy is not None else None
    shown: dict[str, Tensor] = {}
    for view in columns.views:
        if view.name not in columns.effective:
            continue
        present = columns.present.get(view.name)
        if present is not None and not bool(present[idx].all()):
            view.note = f"{int((~present[idx]).sum())} shown response(s) carry no token_advantages"
            continue
        shown[view.name] = columns.effective[view.name][idx]
        _fill_view(view, shown[view.name], columns.seq_advantages[view.name][idx], mask, rows, entropy)
    return ReportData(
        title=title,
        groups=list(groups),
        methods=columns.views,
        correlations=_correlations(shown, mask),
        subtitle=subtitle,
        notes=list(notes),
    )


def explain_batch(
    batch: RolloutBatch,
    methods: Sequence[MethodSpec | SavedSpec],
    groups: Sequence[GroupView],
    *,
    title: str = "tokencredit explain",
    subtitle: str = "",
    notes: Sequence[str] = (),
    unavailable: Mapping[str, str] | None = None,
    special_ids: Sequence[int] | None = None,
    credits: dict[str, Any] | None = None,
    saved: SavedCredit | None = None,
) -> ReportData:
    """The report structure: every method's effective credit on `batch`, diagnostics and correlations on the shown rows.

    Credit is computed on the whole batch (batch-level statistics as in training) by the one
    pipeline, `tokencredit.recipes.token_credit`, with the tokenizer's `special_ids`; the
    diagnostics (`tokencredit.diagnostics.summary`, per-response Gini) and the rank correlations
    use the rows of `groups`. `unavailable` maps a signal name to why it could not be had; a
    method needing it (or failing with a configuration/data error) is skipped with that note.
    `credits`, when given, receives each computed method's `TokenCredit` by name. A `SavedSpec` column
    shows `saved` (rows as in `batch`) as it is; it is skipped with a note if a shown row lacks it.
    `compute_columns` then `report_data`, which a caller choosing groups by their credit runs apart.
    """
    columns = compute_columns(
        batch, methods, unavailable=unavailable, special_ids=special_ids, credits=credits, saved=saved
    )
    return report_data(batch, columns, groups, title=title, subtitle=subtitle, notes=notes)

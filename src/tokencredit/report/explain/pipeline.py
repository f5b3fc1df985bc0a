"""One explain report end to end: options -> groups and signals -> credit -> HTML file."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from tokencredit import advantages
from tokencredit.batch import BatchValidationError, RolloutBatch
from tokencredit.builder import needs_of
from tokencredit.errors import ConfigError
from tokencredit.models import resolve_device, special_token_ids
from tokencredit.report.explain.assemble import saved_credit
from tokencredit.report.explain.compute import display_tokens, explain_batch, make_groups
from tokencredit.report.explain.inputs import GroupInput
from tokencredit.report.explain.marks import mark_groups
from tokencredit.report.explain.options import ExplainOptions, Source, read_source
from tokencredit.report.explain.picture import draw_png
from tokencredit.report.explain.render import build_report
from tokencredit.report.explain.selection import Selection, parse_indices, select_groups
from tokencredit.report.explain.signals import batch_with_signals
from tokencredit.report.explain.views import GroupView
from tokencredit.report.methods import SAVED, MethodSpec, SavedSpec, resolve_columns

__all__ = ["ExplainResult", "write_report"]

_TITLE = "tokencredit explain: where does the credit go?"


@dataclass(frozen=True)
class ExplainResult:
    path: Path  # the HTML file written
    skipped: list[str]  # methods skipped (the reasons are on the page)
    damaged: list[str] = field(default_factory=list)  # parts of the run skipped as damaged (file:line, what to do)


def _shown_advantages(batch: RolloutBatch, src: Source, notes: list[str]) -> Tensor:
    """A [N] shown per response: `src.advantage` on the batch (a token-level A: its mean over the response's
    tokens); GRPO's, with a note, when the saved rollouts lack what that estimator reads (remax's greedy
    baseline, OTB's Σπ²)."""
    try:
        a = advantages.estimate(src.advantage, batch, **src.advantage_params)
    except (ConfigError, BatchValidationError) as e:
        notes.append(f"sequence advantage shown with grpo: {src.advantage} cannot be recomputed here ({e})")
        return advantages.grpo(batch.scores, batch.group_ids)
    if a.dim() == 2:
        m = batch.mask.to(a.dtype)
        return (a * m).sum(-1) / m.sum(-1).clamp(min=1)
    return a


def _shown_groups(
    batch: RolloutBatch, src: Source, tokenizer: Any, chosen: Selection, notes: list[str]
) -> list[GroupView]:
    """The `chosen` groups as displayed, with the sequence advantage A of `src.advantage` and, where the
    task's checker knows them, the first wrong tokens and wrong steps (`marks`)."""
    seq_adv = _shown_advantages(batch, src, notes)
    texts, special = display_tokens(src.groups, tokenizer)
    shown = make_groups(
        batch,
        texts,
        seq_adv,
        problems={g.group_id: (g.problem if g.problem is not None else g.prompt or "") for g in src.groups},
        answers={g.group_id: g.answer for g in src.groups},
        correct=[c.correct for g in src.groups for c in g.completions],
        special=special,
        group_ids=[g.group_id for g in chosen.groups],
    )
    note = mark_groups(shown, {g.group_id: g.problem for g in src.groups}, batch, tokenizer)
    if note is not None:
        notes.append(note)
    return shown


def _require_saved(groups: Sequence[GroupInput]) -> None:
    """ConfigError naming the first shown group (file:line) with a completion that has no saved Â: the `saved`
    column shows the input's own numbers, which a hand-made file or a short-form line does not have."""
    for g in groups:
        missing = [i for i, c in enumerate(g.completions) if c.token_advantages is None]
        if missing:
            raise ConfigError(
                f"--methods {SAVED}: {g.where} (group {g.group_id}): completions[{missing[0]}] has no token_advantages; "
                f"{SAVED!r} shows the Â saved with the rollouts (a run's, or a file written by tokencredit.rollout."
                "records): drop it from --methods or choose groups that carry them (--group-index)"
            )


def _scope_notes(
    specs: Sequence[MethodSpec | SavedSpec],
    src: Source,
    batch: RolloutBatch,
    shown: list[GroupView],
    chosen: Selection,
) -> list[str]:
    """What the columns show and on which rows the credit and the summaries were computed."""
    notes = []
    if any(isinstance(s, SavedSpec) for s in specs):
        notes.append(
            f"{SAVED} (as trained): the token advantages Â saved in the input, as the engine trained with them, not "
            "recomputed; Â before the ratio kernel and loss mask (a per-token recipe's column shows the same "
            "numbers when its Â is recomputed from the same batch and signals)"
        )
    if any(isinstance(s, MethodSpec) and not s.recipe.per_token for s in specs):
        notes.append(
            "recipes with a sequence or trace ratio kernel (gspo, ptrace, strace) show their on-policy credit "
            "Â_eff = −n·∂L/∂log π at ratio 1, token-mean (P-/S-trace: a reconstruction from the paper's abstract)"
        )
    n_shown = sum(len(g.responses) for g in shown)
    notes.append(
        f"credit computed on all {len(src.groups)} groups ({batch.num_rollouts} responses) as one batch; "
        f"{len(shown)} groups ({n_shown} responses) shown and summarised: {chosen.description}; "
        f"sequence advantage A: {src.advantage}"
    )
    return notes


def write_report(opts: ExplainOptions) -> ExplainResult:
    """Read the groups `opts` names, compute every method's credit and write the page (see the package docstring)."""
    opts.check()
    src = read_source(opts)
    indices = parse_indices(opts.group_index) if opts.group_index is not None else None
    chosen = select_groups(src.groups, kind=opts.select, indices=indices, count=opts.groups)  # before any model
    specs = resolve_columns(
        opts.methods.split(","),
        advantage=src.advantage,
        advantage_params=src.advantage_params,
        run_recipe=src.recipe,
    )
    with_saved = any(isinstance(s, SavedSpec) for s in specs)
    if with_saved:
        _require_saved(chosen.groups)  # before any model loads
    needs = set(needs_of([s.recipe for s in specs if isinstance(s, MethodSpec)]).signals)
    notes = list(src.notes)
    device = resolve_device(opts.device, "--device")
    batch, tokenizer, unavailable = batch_with_signals(
        src, needs, notes, device=device, batch_size=opts.batch_size
    )
    shown = _shown_groups(batch, src, tokenizer, chosen, notes)
    data = explain_batch(
        batch,
        specs,
        shown,
        title=_TITLE,
        subtitle=src.description,
        notes=notes + _scope_notes(specs, src, batch, shown, chosen),
        unavailable=unavailable,
        special_ids=special_token_ids(tokenizer),
        saved=saved_credit(src.groups, batch.mask.shape[1]) if with_saved else None,
    )
    src.out.parent.mkdir(parents=True, exist_ok=True)
    src.out.write_text(build_report(data), encoding="utf-8")
    if opts.png is not None:
        draw_png(data, opts.png)
    return ExplainResult(src.out, [m.name for m in data.methods if m.skipped], src.damaged)

"""One explain report end to end: options -> groups and signals -> credit -> HTML file.

Everything that can be checked without a model is checked before one loads: the options, the input,
the output paths (`output.check_output`), the methods, --model (that it names a model), the token ids
and lengths (`signals.prepare_tokens`), and the page's size, estimated from the shown tokens (a warning
past `PAGE_WARN_BYTES`). The page and the picture are each written whole or not at all
(`output.write_whole`). Warnings (a large page, a completion cut) go to `write_report`'s `warn` as they
arise, before the work that follows them, and to `ExplainResult.warnings`; each is also a note on the page."""

from __future__ import annotations

import contextlib
import warnings as py_warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from tokencredit import advantages
from tokencredit.batch import BatchValidationError, RolloutBatch
from tokencredit.builder import needs_of
from tokencredit.columns import SAVED, MethodSpec, SavedSpec, resolve_columns, with_critic_recipe
from tokencredit.errors import ConfigError
from tokencredit.explain.assemble import saved_credit
from tokencredit.explain.compute import (
    compute_columns,
    credited_groups,
    display_tokens,
    make_groups,
    report_data,
)
from tokencredit.explain.inputs import GroupInput
from tokencredit.explain.marks import mark_groups
from tokencredit.explain.options import DEFAULT_METHODS, ExplainOptions, Source, read_source
from tokencredit.explain.output import check_output, same_file, write_whole
from tokencredit.explain.picture import draw_png
from tokencredit.explain.render import build_report
from tokencredit.explain.selection import (
    DEFAULT_KIND,
    Selection,
    credited_selection,
    parse_indices,
    select_groups,
)
from tokencredit.explain.signals import batch_with_signals, load_critic, load_tokens_tokenizer, prepare_tokens
from tokencredit.explain.views import GroupView
from tokencredit.models import resolve_device, resolve_model, special_token_ids

__all__ = ["PAGE_WARN_BYTES", "ExplainResult", "estimate_page_bytes", "write_report"]

_TITLE = "tokencredit explain: where does the credit go?"
# past this estimated size a page is slow to open and to scroll in a browser: a warning says so
PAGE_WARN_BYTES = 20_000_000
# bytes per shown token: a coloured span per method (~100 B of HTML and ~11 B of JSON), and its text,
# entropy and probability in the JSON (~25 B); per response and the fixed part of the page (CSS, script)
_TOKEN_METHOD_BYTES, _TOKEN_BYTES, _RESPONSE_BYTES, _PAGE_BYTES = 112, 25, 600, 40_000


@dataclass(frozen=True)
class ExplainResult:
    path: Path  # the HTML file written
    skipped: list[str]  # methods skipped (the reasons are on the page)
    # parts of the run skipped as damaged (file:line, what to do)
    damaged: list[str] = field(default_factory=list)
    # a large page, a completion cut: given to `write_report`'s `warn` as they arose (also on the page)
    warnings: list[str] = field(default_factory=list)


def estimate_page_bytes(groups: Sequence[GroupInput], n_methods: int) -> int:
    """About how many bytes the page showing `groups` (token ids set) with `n_methods` columns will take."""
    tokens = sum(len(c.token_ids or ()) for g in groups for c in g.completions)
    responses = sum(len(g.completions) for g in groups)
    per_token = _TOKEN_METHOD_BYTES * max(1, n_methods) + _TOKEN_BYTES
    return _PAGE_BYTES + responses * _RESPONSE_BYTES * max(1, n_methods) + tokens * per_token


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB" if n >= 10e6 else f"{n / 1e6:.1f} MB"


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
    texts, special, byte_marks = display_tokens(src.groups, tokenizer)
    shown = make_groups(
        batch,
        texts,
        seq_adv,
        problems={g.group_id: (g.problem if g.problem is not None else g.prompt or "") for g in src.groups},
        answers={g.group_id: g.answer for g in src.groups},
        correct=[c.correct for g in src.groups for c in g.completions],
        special=special,
        byte_marks=byte_marks,
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


def _check_outputs(opts: ExplainOptions, src: Source) -> None:
    """The page's and the picture's paths, before any model loads: writable files, not the input."""
    inputs = [Path(str(opts.jsonl))] if opts.jsonl is not None else []
    paths = [("--out" if opts.out else "--out (default)", src.out)]
    if opts.png is not None:
        paths.append(("--png", Path(opts.png)))
    for what, path in paths:
        check_output(path, what)
        if any(same_file(path, x) for x in inputs):
            raise ConfigError(f"{what} {path}: that is the input file (--jsonl); give another file name")
    if len(paths) == 2 and same_file(paths[0][1], paths[1][1]):
        raise ConfigError(f"--png {opts.png}: the same file as the page (--out); give another file name")


def _check_model(src: Source) -> None:
    """A model the user named must exist (no weights loaded yet); the implicit RUN_DIR/final may be missing."""
    if src.model_given:
        try:
            resolve_model(src.model_path)
        except ConfigError as e:
            raise ConfigError(f"--model: {e}") from None


def _size_warning(chosen: Selection, n_methods: int, opts: ExplainOptions, notes: list[str]) -> str | None:
    """The page's estimated size as a note, and a warning when it is past `PAGE_WARN_BYTES`."""
    size = estimate_page_bytes(chosen.groups, n_methods)
    if size <= PAGE_WARN_BYTES:
        return None
    tokens = sum(len(c.token_ids or ()) for g in chosen.groups for c in g.completions)
    responses = sum(len(g.completions) for g in chosen.groups)
    asked = f"--groups {opts.groups} shows" if opts.groups is not None else "the page shows"
    msg = (
        f"warning: the page will be about {_mb(size)} (estimated: {asked} {len(chosen.groups)} groups, {responses} "
        f"responses, {tokens} tokens x {n_methods} methods), more than a browser shows comfortably "
        f"(~{_mb(PAGE_WARN_BYTES)}); fewer --groups or --methods, or --max-tokens, make it smaller"
    )
    notes.append(msg.removeprefix("warning: "))
    return msg


@contextlib.contextmanager
def _warnings_as_notes(notes: list[str]) -> Iterator[None]:
    """tokencredit's own warnings raised inside (e.g. "a group of size 1 has no baseline") become notes on the
    page, not stderr lines; any other warning is shown as it would be."""
    with py_warnings.catch_warnings():
        py_warnings.filterwarnings("always", category=RuntimeWarning, module=r"tokencredit\.")
        py_warnings.filterwarnings("always", category=UserWarning, module=r"tokencredit\.")
        show = py_warnings.showwarning

        def to_notes(message: Any, category: type[Warning], filename: str, lineno: int, *rest: Any) -> None:
            text = (str(message).splitlines() or [""])[0]
            ours = "tokencredit" in filename and issubclass(category, (RuntimeWarning, UserWarning))
            if not ours:
                show(message, category, filename, lineno, *rest)
            elif text and text not in notes:
                notes.append(text)

        py_warnings.showwarning = to_notes
        yield


class _Warnings(list[str]):
    """The warnings of one report, each also given to `say` as it arises (before the work that follows it)."""

    def __init__(self, say: Callable[[str], None] | None) -> None:
        super().__init__()
        self.say = say

    def append(self, line: str) -> None:
        super().append(line)
        if self.say is not None:
            self.say(line)


def write_report(opts: ExplainOptions, warn: Callable[[str], None] | None = None) -> ExplainResult:
    """Read the groups `opts` names, compute every method's credit and write the page (see the package docstring).
    `warn` is called with each warning as it arises (a page past `PAGE_WARN_BYTES`, a completion cut)."""
    opts.check()
    src = read_source(opts)
    _check_outputs(opts, src)
    indices = parse_indices(opts.group_index) if opts.group_index is not None else None
    # which groups are shown, known before any model loads (by default the candidates: the choice needs the credit)
    kind = opts.select or DEFAULT_KIND
    chosen = select_groups(src.groups, kind=kind, indices=indices, count=opts.groups)
    names = opts.methods.split(",")
    if src.critic_recipe is not None and opts.methods == DEFAULT_METHODS:
        names.append(src.critic_recipe.name)  # the critic's Â beside the default columns
    specs = resolve_columns(
        names, advantage=src.advantage, advantage_params=src.advantage_params, run_recipe=src.recipe
    )
    if src.critic_recipe is not None:  # its column with the gamma, lam and bounds the critic was trained with
        specs = with_critic_recipe(specs, src.critic_recipe)
    with_saved = any(isinstance(s, SavedSpec) for s in specs)
    if with_saved:
        _require_saved(chosen.groups)  # before any model loads
    _check_model(src)
    need = needs_of([s.recipe for s in specs if isinstance(s, MethodSpec)])
    needs = set(need.signals)
    notes = list(src.notes)
    warnings = _Warnings(warn)
    device = resolve_device(opts.device, "--device")
    tokenizer = load_tokens_tokenizer(src, notes)
    prepare_tokens(src, tokenizer, notes, warnings, max_tokens=opts.max_tokens)
    size = _size_warning(chosen, len(specs), opts, notes)
    if size is not None:
        warnings.append(size)
    missing: dict[str, str] = {}  # {"values": why} when a column needs the critic and none is loaded
    critic = load_critic(src, device, tokenizer, notes, missing) if "values" in need.fields else None
    with _warnings_as_notes(notes):
        batch, tokenizer, unavailable = batch_with_signals(
            src,
            needs,
            notes,
            device=device,
            batch_size=opts.batch_size,
            tokenizer=tokenizer,
            warnings=warnings,
            critic=critic,
        )
        unavailable.update(missing)
        columns = compute_columns(
            batch,
            specs,
            unavailable=unavailable,
            special_ids=special_token_ids(tokenizer),
            saved=saved_credit(src.groups, batch.mask.shape[1]) if with_saved else None,
        )
        if chosen.by_credit:
            chosen = credited_selection(src.groups, credited_groups(batch, columns), opts.groups)
        shown = _shown_groups(batch, src, tokenizer, chosen, notes)
        data = report_data(
            batch,
            columns,
            shown,
            title=_TITLE,
            subtitle=src.description,
            notes=notes + _scope_notes(specs, src, batch, shown, chosen),
        )
    data.notes += [n for n in notes if n not in data.notes]  # warnings raised while the credit was computed
    if opts.png is not None:
        draw_png(data, opts.png)
    write_whole(src.out, build_report(data).encode("utf-8"), "--out")
    return ExplainResult(src.out, [m.name for m in data.methods if m.skipped], src.damaged, list(warnings))

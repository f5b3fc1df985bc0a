"""`tokencredit probe`: does a credit method blame the token where a wrong solution went astray?

Papers on token credit argue that their method finds the "key" tokens; none measures it against
ground truth. On the embedded arithmetic task (`tokencredit.data.synthetic`) the truth is known:
in a wrong solution the first line whose content departs from the reference holds the first
wrong token (e.g. the tens digit of a sum whose carry was dropped), and every token is either
shared boilerplate ("format"), problem-dependent arithmetic ("computed") or the boxed answer.
The probe samples groups on held-out problems, computes every method's credit on the *same*
rollouts, and scores it, without any training:

    tokencredit probe --model toy|PATH|RUN_DIR [--checkpoint step_N | --all-checkpoints]
                      [--methods grpo,ktae,delta,strace,arca,...] [--groups N] [--group-size G] [--seed S]

Metrics (per method; rollouts of "mixed" groups, i.e. groups with both correct and wrong
rollouts, where the sequence advantage is not 0):

- blame@k: share of wrong rollouts (verifier score 0) whose first wrong token is among the k
  most negatively credited tokens of that rollout (the k smallest Â over its valid tokens,
  EOS included), k = 1, 3, 10 by default;
- mean rank of the first wrong token (1 = the most negative), and rank / length;
- praise@k (JSON only): share of correct rollouts whose first answer token is among the k most
  positively credited tokens;
- |Â| format / computed / answer: per rollout, the share of its |Â| mass on each token label,
  averaged over the rollouts that carry credit (uniform credit gives the token shares).

Ties. Tokens whose credit equals the target's (within 1e-6 of the row's largest |Â|) are
ranked in random order, and we report the *expectation* over that order: with ``a`` tokens
strictly more negative and ``e`` tied tokens (target included), hit@k = clamp(k - a, 0, e) / e and
rank = a + (e + 1) / 2. Uniform credit is therefore exactly at chance, hit@k = min(k, L) / L.
Two baselines are shown for every point: "random" (i.i.d. N(0, 1) credit per token, averaged
over ``--random-draws`` draws) and "uniform" (one value per rollout).

Credit is the *effective* credit of each method (`tokencredit.objectives.effective`): the per-token
gradient weight of the recipe's objective at ratio 1, which is Â itself for per-token kernels
and the on-policy credit of the sequence / trace kernels (GSPO, P-trace, S-trace; the traces
are our reconstruction of Mou et al. 2026, see `tokencredit.objectives.traces`). Methods that
read a LoRA adapter (ARCA, policy-divergence) are "n/a" on a model without one: a freshly
attached adapter (B = 0) would make them uniform, which says nothing about the method.

Token ground truth is mapped from the checker's character offsets to the sampled token ids by
decoding them (`token_char_spans`), so it works for any tokenizer, not only the toy's
character-level one: the first wrong token is the token whose decoded text contains the first
wrong character, or the first token after the text (EOS) when the completion stopped early.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tokencredit.batch import RolloutBatch
from tokencredit.data.synthetic import LABELS, check, label_chars, locate_first_error
from tokencredit.errors import ConfigError
from tokencredit.models import resolve_device, special_token_ids
from tokencredit.report.methods import NA_LORA, method_credit, needed_signals, resolve_methods
from tokencredit.train.checkpoint import load_run_policy
from tokencredit.train.rundir import RunDir

__all__ = [
    "DEFAULT_KS",
    "DEFAULT_METHODS",
    "LABELS",
    "ProbeConfig",
    "ProbeTruth",
    "RolloutTruth",
    "add_arguments",
    "blame_hits",
    "build_truth",
    "char_to_token",
    "expected_hits",
    "markdown_report",
    "mass_shares",
    "mean_rank",
    "probe_batch",
    "probe_model",
    "random_credit",
    "rollout_truth",
    "run",
    "score_baselines",
    "score_credit",
    "target_ranks",
    "tie_counts",
    "token_char_spans",
    "token_labels",
    "uniform_credit",
]

DEFAULT_METHODS = (
    "grpo,ktae,delta,gspo,ptrace,strace,entropy-80-20,surprisal,entropy-reduction,gcpo,arca,policy-divergence"
)
DEFAULT_KS: tuple[int, ...] = (1, 3, 10)
DEFAULT_RTOL = 1e-6
_LABEL_CODE = {name: i for i, name in enumerate(LABELS)}


# ============================================================================ metrics (pure)
def _check_ranked(
    credit: Tensor, mask: Tensor, target_pos: Tensor, who: str
) -> tuple[Tensor, Tensor, Tensor]:
    """(credit float64, mask bool, target int64) after checking shapes, target validity and finiteness."""
    if credit.dim() != 2:
        raise ValueError(f"{who}: credit must be [N, T], got shape {tuple(credit.shape)}")
    if tuple(mask.shape) != tuple(credit.shape):
        raise ValueError(f"{who}: mask shape {tuple(mask.shape)} differs from credit {tuple(credit.shape)}")
    n, t = credit.shape
    if (
        tuple(target_pos.shape) != (n,)
        or target_pos.dtype.is_floating_point
        or target_pos.dtype == torch.bool
    ):
        raise ValueError(
            f"{who}: target_pos must be an integer tensor of shape ({n},), got {tuple(target_pos.shape)} "
            f"{target_pos.dtype}"
        )
    m = mask.bool()
    tgt = target_pos.long().to(credit.device)
    out_of_range = (tgt < 0) | (tgt >= t)
    if bool(out_of_range.any()):
        i = int(out_of_range.nonzero()[0])
        raise ValueError(f"{who}: target position {int(tgt[i])} of rollout {i} is outside [0, {t})")
    off = ~m.gather(1, tgt[:, None]).squeeze(1)
    if bool(off.any()):
        i = int(off.nonzero()[0])
        raise ValueError(
            f"{who}: target position {int(tgt[i])} of rollout {i} is not a valid (masked-in) token"
        )
    x = credit.detach().double()
    bad = m & ~torch.isfinite(x)
    if bool(bad.any()):
        i, j = (int(v) for v in bad.nonzero()[0])
        raise ValueError(f"{who}: non-finite credit at rollout {i}, token {j}")
    return x, m, tgt


def tie_counts(
    credit: Tensor,
    mask: Tensor,
    target_pos: Tensor,
    *,
    descending: bool = False,
    rtol: float = DEFAULT_RTOL,
) -> tuple[Tensor, Tensor, Tensor]:
    """(ahead [N], tied [N], length [N]) int64 for the target token of every rollout.

    ahead: valid tokens ranked strictly before the target (credit smaller than the target's, or
    larger with ``descending``); tied: valid tokens whose credit equals the target's within
    ``rtol`` x the row's largest |credit| (the target included, so tied >= 1); length: valid tokens.
    """
    x, m, tgt = _check_ranked(credit, mask, target_pos, "tie_counts")
    if descending:
        x = -x
    xt = x.gather(1, tgt[:, None])
    tol = rtol * torch.where(m, x.abs(), torch.zeros((), dtype=x.dtype, device=x.device)).amax(
        1, keepdim=True
    )
    ahead = ((x < xt - tol) & m).sum(1)
    tied = (((x - xt).abs() <= tol) & m).sum(1)
    return ahead, tied, m.sum(1)


def expected_hits(
    credit: Tensor,
    mask: Tensor,
    target_pos: Tensor,
    k: int,
    *,
    descending: bool = False,
    rtol: float = DEFAULT_RTOL,
) -> Tensor:
    """[N] float64: P(target among the k first-ranked valid tokens), ties broken uniformly at random.

    Ranked by ascending credit (most negative first), or descending with ``descending``. With a
    tokens ahead and e tied: clamp(k - a, 0, e) / e, so all-equal credit gives min(k, L) / L.
    """
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    ahead, tied, _ = tie_counts(credit, mask, target_pos, descending=descending, rtol=rtol)
    return (k - ahead).clamp(min=0).minimum(tied).double() / tied.double()


def blame_hits(adv: Tensor, mask: Tensor, target_pos: Tensor, k: int) -> Tensor:
    """[N] float64 expected blame-hit@k: is the first wrong token among the k smallest Â of its rollout?

    adv: Â [N,T]; mask [N,T] valid tokens; target_pos [N] int: first wrong token per rollout
    (must be a valid token). Ties are broken uniformly at random (expectation; see the module doc).
    """
    return expected_hits(adv, mask, target_pos, k)


def target_ranks(adv: Tensor, mask: Tensor, target_pos: Tensor, *, descending: bool = False) -> Tensor:
    """[N] float64 expected rank of the target token (1 = most negative Â; ties at random: a + (e + 1) / 2)."""
    ahead, tied, _ = tie_counts(adv, mask, target_pos, descending=descending)
    return ahead.double() + (tied.double() + 1) / 2


def mean_rank(adv: Tensor, mask: Tensor, target_pos: Tensor) -> float:
    """Mean over rollouts of the expected rank of the first wrong token (1 = most negative); NaN-free (N >= 1)."""
    if target_pos.numel() == 0:
        raise ValueError("mean_rank: no rollout to average over")
    return float(target_ranks(adv, mask, target_pos).mean())


def mass_shares(
    adv: Tensor, mask: Tensor, labels: Tensor, n_labels: int = len(LABELS)
) -> tuple[Tensor, Tensor]:
    """(shares [N, n_labels] float64, defined [N] bool): per rollout, the share of sum |Â| on each label.

    labels [N,T] int: a code in [0, n_labels) at every valid token (`LABELS` order: format, computed,
    answer). Rows without credit mass (sum |Â| = 0) are not defined and get 0 shares.
    """
    if tuple(labels.shape) != tuple(adv.shape) or tuple(mask.shape) != tuple(adv.shape):
        raise ValueError(
            f"mass_shares: adv {tuple(adv.shape)}, mask {tuple(mask.shape)} and labels {tuple(labels.shape)} "
            "must have the same shape"
        )
    m = mask.bool()
    lab = labels.long()
    bad = m & ((lab < 0) | (lab >= n_labels))
    if bool(bad.any()):
        i, j = (int(v) for v in bad.nonzero()[0])
        raise ValueError(
            f"mass_shares: label {int(lab[i, j])} at rollout {i}, token {j} is not in [0, {n_labels})"
        )
    a = torch.where(m, adv.detach().double().abs(), torch.zeros((), dtype=torch.float64, device=adv.device))
    if bool((m & ~torch.isfinite(a)).any()):
        i, j = (int(v) for v in (m & ~torch.isfinite(a)).nonzero()[0])
        raise ValueError(f"mass_shares: non-finite credit at rollout {i}, token {j}")
    onehot = torch.nn.functional.one_hot(torch.where(m, lab, 0), n_labels).double()
    per_label = (a[..., None] * onehot).sum(1)
    total = a.sum(1)
    defined = total > 0
    shares = torch.where(
        defined[:, None], per_label / total.clamp(min=1e-300)[:, None], torch.zeros_like(per_label)
    )
    return shares, defined


def random_credit(mask: Tensor, generator: torch.Generator) -> Tensor:
    """[N,T] float32 i.i.d. standard-normal credit on valid tokens, 0 elsewhere (the chance baseline)."""
    m = mask.bool()
    z = torch.randn(m.shape, generator=generator, dtype=torch.float64).to(m.device)
    return torch.where(m, z, torch.zeros((), dtype=torch.float64, device=m.device)).float()


def uniform_credit(mask: Tensor, value: float = -1.0) -> Tensor:
    """[N,T] float32: one value on every valid token (GRPO's credit up to the row's sign and scale)."""
    m = mask.bool()
    return torch.where(m, torch.tensor(float(value)), torch.tensor(0.0)).to(m.device)


# ============================================================================ token ground truth
def _common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def token_char_spans(tokenizer: Any, token_ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
    """(text, spans): the decoded text (special tokens skipped) and each token's [start, end) in it.

    Decoding one token at a time is used when the pieces concatenate to the text (character-level
    and byte-level BPE tokenizers on ASCII). Otherwise (SentencePiece's stripped leading spaces,
    multi-byte characters split over tokens, clean-up rules) token j ends where the decoded prefix
    ids[:j+1] stops agreeing with the text, made non-decreasing: a character split over several
    tokens belongs to the token that completes it. Spans partition the text; special tokens (and
    incomplete byte pieces) get empty spans.
    """
    ids = [int(i) for i in token_ids]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    pieces = tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=True) if ids else []
    ends: list[int] = []
    if "".join(pieces) == text:
        pos = 0
        for p in pieces:
            pos += len(p)
            ends.append(pos)
    else:
        prefixes = tokenizer.batch_decode([ids[: j + 1] for j in range(len(ids))], skip_special_tokens=True)
        prev = 0
        for p in prefixes:
            prev = max(prev, _common_prefix_len(p, text))
            ends.append(prev)
        if ends:
            ends[-1] = len(text)
    starts = [0, *ends[:-1]]
    return text, list(zip(starts, ends))


def char_to_token(spans: Sequence[tuple[int, int]], char_pos: int) -> int | None:
    """Index of the token whose span holds character `char_pos`; for a position at or past the end of
    the text, the first token after the text (EOS), or None when the text ends the token list."""
    if char_pos < 0:
        raise ValueError(f"char_to_token: character position must be >= 0, got {char_pos}")
    if not spans:
        return None
    text_len = spans[-1][1]
    if char_pos < text_len:
        return bisect.bisect_right([e for _, e in spans], char_pos)
    for j, (s, _) in enumerate(spans):
        if s >= text_len:
            return j
    return None


def token_labels(char_labels: Sequence[str], spans: Sequence[tuple[int, int]]) -> list[str]:
    """One label per token from per-character labels: "answer" if any of its characters is answer, else
    "computed" if any is computed, else "format" (tokens without text, e.g. EOS, are format)."""
    out = []
    for s, e in spans:
        chars = set(char_labels[s:e])
        out.append("answer" if "answer" in chars else ("computed" if "computed" in chars else "format"))
    return out


@dataclass(frozen=True)
class RolloutTruth:
    """Ground truth of one sampled completion, at token level.

    correct: the outcome check (`synthetic.check`, the reward). kind / step: `locate_first_error`'s.
    target: token index of the first wrong token (kind != "correct") or of the first answer token
    (kind == "correct"); None when the error lies past the last token (a truncated completion).
    labels: one of `LABELS` per token.
    """

    text: str
    correct: bool
    kind: str
    step: int | None
    target: int | None
    labels: tuple[str, ...]


def rollout_truth(problem: Any, token_ids: Sequence[int], tokenizer: Any) -> RolloutTruth:
    """Token-level ground truth of a completion (its valid token ids, EOS included) of a synthetic problem."""
    text, spans = token_char_spans(tokenizer, token_ids)
    loc = locate_first_error(problem, text)
    labels = token_labels(label_chars(problem, text), spans)
    return RolloutTruth(
        text=text,
        correct=check(problem, text),
        kind=loc.kind,
        step=loc.step,
        target=char_to_token(spans, loc.start),
        labels=tuple(labels),
    )


@dataclass
class ProbeTruth:
    """Batch ground truth aligned with a RolloutBatch.

    mask [N,T] bool; group_ids [N] int64; correct [N] bool (reward); target [N] int64 (-1 = none);
    labels [N,T] int64 codes into `LABELS` (-1 off the mask); kinds: `locate_first_error` kind per row.
    """

    mask: Tensor
    group_ids: Tensor
    correct: Tensor
    target: Tensor
    labels: Tensor
    kinds: list[str]

    @property
    def mixed(self) -> Tensor:
        """bool [N]: the row's group holds both correct and wrong rollouts (its advantage is not 0)."""
        _, inv = torch.unique(self.group_ids, return_inverse=True)
        n_groups = int(inv.max()) + 1 if inv.numel() else 0
        c = self.correct.long()
        n_correct = torch.zeros(n_groups, dtype=torch.long).index_add_(0, inv, c)
        size = torch.zeros(n_groups, dtype=torch.long).index_add_(0, inv, torch.ones_like(c))
        return ((n_correct > 0) & (n_correct < size))[inv]

    @property
    def is_correct_kind(self) -> Tensor:
        return torch.tensor([k == "correct" for k in self.kinds], dtype=torch.bool)

    @property
    def blame_rows(self) -> Tensor:
        """bool [N]: wrong rollouts (score 0) of mixed groups whose first wrong token is a sampled token."""
        return ~self.correct & self.mixed & (self.target >= 0) & ~self.is_correct_kind

    @property
    def praise_rows(self) -> Tensor:
        """bool [N]: fully correct rollouts (every step right) of mixed groups."""
        return self.correct & self.mixed & (self.target >= 0) & self.is_correct_kind


def build_truth(
    problems: Sequence[Any], token_ids: Tensor, mask: Tensor, group_ids: Tensor, tokenizer: Any
) -> tuple[ProbeTruth, list[RolloutTruth]]:
    """Ground truth for every row: problems[i] is row i's problem, token_ids / mask [N,T] its response."""
    n, t = token_ids.shape
    if len(problems) != n:
        raise ValueError(f"build_truth: {len(problems)} problems for {n} rollouts")
    m = mask.bool().cpu()
    ids = token_ids.cpu()
    rows = [rollout_truth(problems[i], ids[i, m[i]].tolist(), tokenizer) for i in range(n)]
    labels = torch.full((n, t), -1, dtype=torch.long)
    target = torch.full((n,), -1, dtype=torch.long)
    for i, r in enumerate(rows):
        cols = m[i].nonzero().squeeze(1)  # valid-token index -> column (right padding makes them equal)
        if r.labels:
            labels[i, cols] = torch.tensor([_LABEL_CODE[x] for x in r.labels])
        if r.target is not None:
            target[i] = cols[r.target]
    truth = ProbeTruth(
        mask=m,
        group_ids=group_ids.long().cpu(),
        correct=torch.tensor([r.correct for r in rows], dtype=torch.bool),
        target=target,
        labels=labels,
        kinds=[r.kind for r in rows],
    )
    return truth, rows


# ============================================================================ scoring
def _mean(x: Tensor) -> float | None:
    return float(x.double().mean()) if x.numel() else None


def _stderr(x: Tensor) -> float | None:
    """Standard error of the mean over rollouts (None below 2 rollouts)."""
    return float(x.double().std() / math.sqrt(x.numel())) if x.numel() >= 2 else None


def score_credit(credit: Tensor, truth: ProbeTruth, ks: Sequence[int] = DEFAULT_KS) -> dict[str, Any]:
    """The probe's numbers for one credit tensor [N,T] (None where no rollout qualifies).

    Keys: blame_rollouts, blame@k (and blame@k_se, its standard error over rollouts), mean_rank,
    mean_rank_frac (rank / length), praise_rollouts,
    praise@k, mass_rollouts, mass_format / mass_computed / mass_answer, blame_by_kind {kind: {n, blame@k}}.
    """
    c = credit.detach().cpu()
    m = truth.mask
    if tuple(c.shape) != tuple(m.shape):
        raise ValueError(
            f"score_credit: credit shape {tuple(c.shape)} differs from the truth's {tuple(m.shape)}"
        )
    out: dict[str, Any] = {}
    b = truth.blame_rows.nonzero().squeeze(1)
    out["blame_rollouts"] = int(b.numel())
    if b.numel():
        cb, mb, tb = c[b], m[b], truth.target[b]
        for k in ks:
            hits = blame_hits(cb, mb, tb, k)
            out[f"blame@{k}"] = _mean(hits)
            out[f"blame@{k}_se"] = _stderr(hits)
        ranks = target_ranks(cb, mb, tb)
        out["mean_rank"] = _mean(ranks)
        out["mean_rank_frac"] = _mean(ranks / mb.sum(1).double())
        by_kind: dict[str, dict[str, Any]] = {}
        kinds = [truth.kinds[i] for i in b.tolist()]
        for kind in sorted(set(kinds)):
            sel = torch.tensor([x == kind for x in kinds])
            entry: dict[str, Any] = {"n": int(sel.sum())}
            for k in ks:
                entry[f"blame@{k}"] = _mean(blame_hits(cb[sel], mb[sel], tb[sel], k))
            by_kind[kind] = entry
        out["blame_by_kind"] = by_kind
    else:
        out.update({f"blame@{k}": None for k in ks})
        out.update({f"blame@{k}_se": None for k in ks})
        out.update(mean_rank=None, mean_rank_frac=None, blame_by_kind={})
    p = truth.praise_rows.nonzero().squeeze(1)
    out["praise_rollouts"] = int(p.numel())
    for k in ks:
        out[f"praise@{k}"] = (
            _mean(expected_hits(c[p], m[p], truth.target[p], k, descending=True)) if p.numel() else None
        )
    rows = truth.mixed.nonzero().squeeze(1)
    shares, defined = mass_shares(c[rows], m[rows], truth.labels[rows].clamp(min=0))
    out["mass_rollouts"] = int(defined.sum())
    for j, name in enumerate(LABELS):
        out[f"mass_{name}"] = _mean(shares[defined, j])
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


def probe_batch(
    batch: RolloutBatch,
    truth: ProbeTruth,
    specs: Sequence[Any],
    *,
    ks: Sequence[int] = DEFAULT_KS,
    lora: bool = False,
    unavailable: Mapping[str, str] | None = None,
    special_ids: Sequence[int] | None = None,
    credits: dict[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """{method name: result} for `specs` (`tokencredit.report.methods.MethodSpec`) on one batch.

    Credit comes from the one pipeline, `tokencredit.recipes.token_credit`, with the tokenizer's
    `special_ids`. Each result has "status": "ok" with `score_credit`'s numbers on the method's
    effective credit, or "n/a" with a "reason" (a LoRA method without an adapter, a missing
    signal, or the error the method raised on this batch). `credits`, when given, receives each
    computed method's `TokenCredit` by name.
    """
    out: dict[str, dict[str, Any]] = {}
    for spec in specs:
        base = {"kind": spec.kind, "label": spec.label}
        got = method_credit(spec, batch, special_ids=special_ids, lora=lora, unavailable=unavailable)
        if got.credit is None:
            out[spec.name] = {**base, "status": "n/a", "reason": got.reason}
            continue
        if credits is not None:
            credits[spec.name] = got.credit
        out[spec.name] = {**base, "status": "ok", **score_credit(got.credit.effective(), truth, ks)}
    return out


def rollout_summary(truth: ProbeTruth, rows: Sequence[RolloutTruth]) -> dict[str, Any]:
    """Counts that say what the numbers are computed on."""
    blame = truth.blame_rows
    n = len(rows)
    kinds: dict[str, int] = {}
    for i in blame.nonzero().squeeze(1).tolist():
        kinds[rows[i].kind] = kinds.get(rows[i].kind, 0) + 1
    target_labels: dict[str, int] = {}
    for i in blame.nonzero().squeeze(1).tolist():
        lab = rows[i].labels[rows[i].target]  # type: ignore[index]
        target_labels[lab] = target_labels.get(lab, 0) + 1
    mixed = truth.mixed
    lengths = truth.mask.sum(1).double()
    n_groups = int(torch.unique(truth.group_ids).numel())
    return {
        "rollouts": n,
        "groups": n_groups,
        "accuracy": float(truth.correct.double().mean()) if n else 0.0,
        "mixed_groups": int(torch.unique(truth.group_ids[mixed]).numel()),
        "wrong": int((~truth.correct).sum()),
        "wrong_in_mixed_groups": int((~truth.correct & mixed).sum()),
        "blame_rollouts": int(blame.sum()),
        "no_target": int((~truth.correct & mixed & (truth.target < 0)).sum()),
        "praise_rollouts": int(truth.praise_rows.sum()),
        "first_error_kinds": dict(sorted(kinds.items())),
        "first_wrong_token_labels": dict(sorted(target_labels.items())),
        "mean_length": float(lengths.mean()) if n else 0.0,
        "mean_length_blamed": float(lengths[blame].mean()) if bool(blame.any()) else None,
    }


# ============================================================================ sampling with a model
@dataclass
class ProbeConfig:
    """How rollouts are sampled and scored (the task's difficulty / digits pick the held-out problems)."""

    groups: int = 64
    group_size: int = 8
    seed: int = 0
    difficulty: int = 3
    digits: int = 2
    operand_digits: int | None = None  # None: the task's default
    template: str = "qwen-math"
    temperature: float = 1.0
    max_new_tokens: int = 96
    advantage: str = "grpo"
    advantage_params: dict[str, Any] = field(default_factory=dict)
    ks: tuple[int, ...] = DEFAULT_KS
    random_draws: int = 20
    batch_size: int = 64  # rows per forward for signals and per generate call


def _sample(model: Any, tokenizer: Any, problems: Sequence[Any], cfg: ProbeConfig) -> Any:
    from tokencredit.data.templates import render
    from tokencredit.rollout import generate

    prompts = [render(cfg.template, p.problem, tokenizer) for p in problems]
    return generate(
        model,
        tokenizer,
        prompts,
        cfg.group_size,
        temperature=cfg.temperature,
        top_p=1.0,
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed,
        batch_size=cfg.batch_size,
    )


def _negative_prompt_inputs(
    tokenizer: Any, rows: Sequence[Any], ro: Any, template: str, device: Any
) -> dict[str, Any]:
    """GCPO's negative-prompt sequences, built as the trainer builds them."""
    from tokencredit.credit.gcpo import negative_prompt
    from tokencredit.data.templates import render
    from tokencredit.signals import negative_prompt_inputs

    texts = [render(template, negative_prompt(p.problem), tokenizer) for p in rows]
    return negative_prompt_inputs(tokenizer, texts, ro.response_ids.to(device), ro.response_mask.to(device))


def probe_model(
    model: Any,
    tokenizer: Any,
    specs: Sequence[Any],
    cfg: ProbeConfig,
    *,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Sample `cfg.groups` x `cfg.group_size` rollouts of held-out synthetic problems with `model`,
    compute every method's credit on them (signals in one pass) and score it; returns the point's
    result: {"rollouts": summary, "methods": {...}, "baselines": {...}}."""
    from tokencredit.data.synthetic import ArithmeticTask
    from tokencredit.signals import compute_signals, has_lora_adapter

    say = log or (lambda _msg: None)
    lora = has_lora_adapter(model)
    needs = needed_signals(specs, lora=lora)
    task_kw = {} if cfg.operand_digits is None else {"operand_digits": cfg.operand_digits}
    task = ArithmeticTask(difficulty=cfg.difficulty, digits=cfg.digits, seed=cfg.seed, **task_kw)
    problems = task.sample(cfg.groups, "heldout")
    say(f"sampling {cfg.groups} x {cfg.group_size} rollouts ...")
    ro = _sample(model, tokenizer, problems, cfg)
    rows = [problems[int(i)] for i in ro.prompt_index]
    device = next(model.parameters()).device
    signals: dict[str, Tensor] = {}
    if needs:
        say(f"signals: {', '.join(sorted(needs))}")
        seq, att = ro.sequences.to(device), ro.attention_mask.to(device)
        neg = (
            _negative_prompt_inputs(tokenizer, rows, ro, cfg.template, device)
            if "neg_log_probs" in needs
            else {}
        )
        signals = compute_signals(
            model,
            seq,
            att,
            int(ro.prompt_ids.shape[1]),
            ro.response_mask.to(device),
            needs,
            temperature=cfg.temperature,
            batch_size=cfg.batch_size,
            **neg,
        )
    truth, truths = build_truth(rows, ro.response_ids, ro.response_mask, ro.prompt_index, tokenizer)
    batch = RolloutBatch(
        token_ids=ro.response_ids,
        mask=ro.response_mask,
        group_ids=ro.prompt_index.long(),
        scores=truth.correct.float(),
        truncated=ro.truncated,
        **{k: v.cpu() for k, v in signals.items()},
    )
    say("scoring credit ...")
    return {
        "rollouts": rollout_summary(truth, truths),
        "methods": probe_batch(batch, truth, specs, ks=cfg.ks, lora=lora, special_ids=special_token_ids(tokenizer)),
        "baselines": score_baselines(truth, cfg.ks, draws=cfg.random_draws, seed=cfg.seed),
    }


# ============================================================================ report
def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _rank(r: dict[str, Any]) -> str:
    if r.get("mean_rank") is None:
        return "–"
    return f"{r['mean_rank']:.1f} ({r['mean_rank_frac']:.2f})"


def _row(name: str, r: dict[str, Any], ks: Sequence[int]) -> str:
    if r.get("status", "ok") != "ok":
        reason = r.get("reason", "n/a")
        text = reason if reason == NA_LORA else f"n/a ({reason})"
        return f"| {name} | " + " | ".join([text] + [""] * (len(ks) + 3)) + " |"
    cells = [_pct(r.get(f"blame@{k}")) for k in ks] + [_rank(r)]
    cells += [_pct(r.get(f"mass_{lab}")) for lab in LABELS]
    return f"| {name} | " + " | ".join(cells) + " |"


def point_table(point: dict[str, Any], ks: Sequence[int]) -> str:
    """The Markdown table of one probed model: one row per method, then the two chance baselines."""
    head = (
        "| credit | "
        + " | ".join(f"blame@{k}" for k in ks)
        + " | mean rank (/len) | mass: format | mass: computed | mass: answer |"
    )
    sep = "|" + "---|" * (len(ks) + 5)
    lines = [head, sep]
    lines += [_row(name, r, ks) for name, r in point["methods"].items()]
    lines.append(_row("*random (chance)*", point["baselines"]["random"], ks))
    lines.append(_row("*uniform (chance)*", point["baselines"]["uniform"], ks))
    return "\n".join(lines)


def _summary_line(point: dict[str, Any]) -> str:
    s = point["rollouts"]
    kinds = ", ".join(f"{k} {v}" for k, v in s["first_error_kinds"].items()) or "none"
    labels = ", ".join(f"{k} {v}" for k, v in s["first_wrong_token_labels"].items()) or "none"
    mean_len = s["mean_length_blamed"]
    return (
        f"{s['rollouts']} rollouts ({s['groups']} held-out problems x {s['rollouts'] // max(1, s['groups'])}), "
        f"accuracy {100 * s['accuracy']:.1f}%, {s['mixed_groups']} mixed groups; "
        f"{s['blame_rollouts']} wrong rollouts scored"
        + (f" (mean length {mean_len:.1f} tokens)" if mean_len is not None else "")
        + f"; first error: {kinds}; first wrong token: {labels}"
        + (
            f"; {s['no_target']} wrong rollouts end before their error (truncated), not scored"
            if s["no_target"]
            else ""
        )
        + "."
    )


def evolution_table(points: Sequence[dict[str, Any]], ks: Sequence[int]) -> str:
    """Methods x probed points: blame@k for the two smallest k, to show how blame accuracy evolves."""
    shown = list(ks[:2])
    head = "| credit | " + " | ".join(p["label"] for p in points) + " |"
    lines = [head, "|" + "---|" * (len(points) + 1)]
    names: list[str] = []
    for p in points:
        names += [n for n in p["methods"] if n not in names]

    def cell(r: dict[str, Any] | None) -> str:
        if r is None or r.get("status", "ok") != "ok":
            return "n/a"
        return " / ".join(_pct(r.get(f"blame@{k}")) for k in shown)

    for n in names:
        lines.append(f"| {n} | " + " | ".join(cell(p["methods"].get(n)) for p in points) + " |")
    for b in ("random", "uniform"):
        lines.append(f"| *{b} (chance)* | " + " | ".join(cell(p["baselines"][b]) for p in points) + " |")
    return "\n".join(lines)


def markdown_report(result: dict[str, Any]) -> str:
    """The whole report as Markdown: the command, one table per probed point, the evolution table."""
    ks = result["ks"]
    out = [
        "# tokencredit probe: does the credit blame the first wrong token?",
        "",
        f"`{result['command']}`",
        "",
        f"blame@k: share of wrong rollouts whose first wrong token is among the k most negatively credited "
        f"tokens (expected value under random tie-breaking); mean rank of that token (1 = most negative; "
        f"rank / length in brackets); |Â| columns: share of the credit mass on format / computed / answer "
        f"tokens. Effective credit (per-token gradient weight at ratio 1); sequence advantage "
        f"{result['config']['advantage']}; task difficulty {result['config']['difficulty']}, "
        f"digits {result['config']['digits']}, temperature {result['config']['temperature']}, seed "
        f"{result['config']['seed']}.",
    ]
    for p in result["points"]:
        out += ["", f"## {p['label']}", "", f"{p['source']}. {_summary_line(p)}", "", point_table(p, ks)]
    if len(result["points"]) > 1:
        shown = " / ".join(f"blame@{k}" for k in ks[:2])
        out += ["", f"## Evolution ({shown})", "", evolution_table(result["points"], ks)]
    return "\n".join(out) + "\n"


# ============================================================================ models, runs, checkpoints
@dataclass
class ProbePoint:
    """One model to probe: its label in the tables, a description, the training step, a loader."""

    label: str
    source: str
    step: int | None
    load: Callable[[], tuple[Any, Any]]


def parse_checkpoint(name: str) -> int:
    """The step number of "step_N", "step_000020", "N" or a path to step_N.pt."""
    m = re.fullmatch(r"(?:.*/)?(?:step_)?(\d+)(?:\.pt)?", name.strip())
    if m is None:
        raise ConfigError(f"--checkpoint: expected step_N (e.g. step_20), got {name!r}")
    return int(m.group(1))


def _checkpoint_policy(run: RunDir, step: int, device: Any) -> tuple[Any, Any]:
    model, tok, _ = load_run_policy(run, step, device)
    return model, tok


def resolve_points(args: argparse.Namespace) -> tuple[list[ProbePoint], Any, Any, Path | None]:
    """(points to probe, run TrainConfig or None, run recipe or None, run directory or None)."""
    from tokencredit import models

    device = resolve_device(args.device, "--device")
    target = args.model
    path = Path(target).expanduser()
    run = RunDir(path)
    if target != "toy" and run.is_run():
        run_cfg = run.read_config()
        recipe = run.read_recipe(run_cfg)
        if args.all_checkpoints and args.checkpoint:
            raise ConfigError("give --checkpoint step_N or --all-checkpoints, not both")
        base = run_cfg.model.name
        if args.all_checkpoints:
            steps = run.checkpoint_steps()
            if not steps:
                raise ConfigError(f"{path}: no checkpoints in {run.checkpoints_dir}")
            points = [
                ProbePoint(
                    "step 0 (start)",
                    f"the run's starting model {base!r}",
                    0,
                    lambda: models.load_model(base, device=device),
                )
            ]
            for s in steps:
                points.append(
                    ProbePoint(
                        f"step {s}",
                        f"run {path}, checkpoint step {s} on {base!r}",
                        s,
                        lambda s=s: _checkpoint_policy(run, s, device),
                    )
                )
            return points, run_cfg, recipe, path
        if args.checkpoint:
            s = parse_checkpoint(args.checkpoint)
            return (
                [
                    ProbePoint(
                        f"step {s}",
                        f"run {path}, checkpoint step {s} on {base!r}",
                        s,
                        lambda: _checkpoint_policy(run, s, device),
                    )
                ],
                run_cfg,
                recipe,
                path,
            )
        final = run.final_dir
        if not (final / "config.json").is_file():
            have = ", ".join(f"step_{s}" for s in run.checkpoint_steps()) or "none"
            raise ConfigError(
                f"{path}: no exported model in {final} (the run did not finish?); probe a checkpoint with "
                f"--checkpoint step_N (saved: {have})"
            )
        steps = run.checkpoint_steps()
        merged = (
            " (LoRA merged into the weights: probe a --checkpoint for ARCA / policy-divergence)"
            if run_cfg.model.lora_rank > 0
            else ""
        )
        return (
            [
                ProbePoint(
                    "final",
                    f"run {path}, exported model (final){merged}",
                    steps[-1] if steps else None,
                    lambda: models.load_model(str(final), device=device),
                )
            ],
            run_cfg,
            recipe,
            path,
        )
    if args.all_checkpoints or args.checkpoint:
        raise ConfigError(
            f"--checkpoint / --all-checkpoints need --model RUN_DIR (a training run directory); {target!r} is not one"
        )
    label = "warm start (toy)" if target == "toy" else f"model {target}"
    source = "the shipped toy warm start" if target == "toy" else f"model directory {target}"
    return (
        [ProbePoint(label, source, None, lambda: models.load_model(target, device=device))],
        None,
        None,
        None,
    )


def _ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise ConfigError(f"--ks: expected comma-separated integers, got {text!r}") from None
    if not ks or ks[0] < 1:
        raise ConfigError(f"--ks: expected integers >= 1, got {text!r}")
    return ks


# ============================================================================ command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", required=True, help="'toy' (the shipped warm start), a model directory, or a RUN_DIR"
    )
    parser.add_argument(
        "--checkpoint", help="with a RUN_DIR: probe checkpoint step_N (default: RUN_DIR/final)"
    )
    parser.add_argument(
        "--all-checkpoints",
        action="store_true",
        help="with a RUN_DIR: probe the run's starting model and every saved checkpoint",
    )
    parser.add_argument(
        "--methods",
        default=DEFAULT_METHODS,
        help=f"comma-separated credit methods and/or recipes (default: {DEFAULT_METHODS})",
    )
    parser.add_argument("--groups", type=int, default=64, help="held-out problems (groups), default 64")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per problem (G), default 8")
    parser.add_argument(
        "--seed", type=int, default=0, help="problem sample, sampling and random baseline seed"
    )
    parser.add_argument("--difficulty", type=int, help="arithmetic steps (default: the run's, else 3)")
    parser.add_argument(
        "--digits", type=int, help="digits of the running totals (default: the run's, else 2)"
    )
    parser.add_argument(
        "--operand-digits",
        type=int,
        help="digits of the added operands (default: the run's, else the task's)",
    )
    parser.add_argument("--template", help="prompt template (default: the run's, else qwen-math)")
    parser.add_argument(
        "--temperature", type=float, help="sampling temperature (default: the run's, else 1.0)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=96, help="generation limit (default 96)")
    parser.add_argument(
        "--advantage", help="group estimator for plain credit methods (default: the run's, else grpo)"
    )
    parser.add_argument(
        "--ks", default=",".join(map(str, DEFAULT_KS)), help="k values of blame@k (default 1,3,10)"
    )
    parser.add_argument("--random-draws", type=int, default=20, help="draws averaged for the random baseline")
    parser.add_argument("--batch-size", type=int, default=64, help="rows per forward / generate call")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    parser.add_argument(
        "--out",
        help="output JSON file; the Markdown goes next to it as .md (default: RUN_DIR/probe.json or ./probe.json)",
    )


def _probe_config(args: argparse.Namespace, run_cfg: Any, recipe: Any) -> ProbeConfig:
    from tokencredit import advantages
    from tokencredit.data.templates import check_template
    from tokencredit.errors import closest

    toy_data = run_cfg is not None and run_cfg.data.train == "toy"
    for name in ("groups", "group_size", "max_new_tokens", "batch_size", "random_draws"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.group_size < 2:
        raise ConfigError(f"--group-size must be >= 2 for a group baseline, got {args.group_size}")
    advantage = args.advantage or (recipe.advantage if recipe is not None else "grpo")
    if advantage not in advantages.ESTIMATORS:
        raise ConfigError(
            f"--advantage: unknown estimator {advantage!r}{closest(advantage, advantages.ESTIMATORS)}; "
            f"one of {', '.join(advantages.ESTIMATORS)}"
        )
    cfg = ProbeConfig(
        groups=args.groups,
        group_size=args.group_size,
        seed=args.seed,
        difficulty=args.difficulty or (run_cfg.data.difficulty if toy_data else 3),
        digits=args.digits or (run_cfg.data.digits if toy_data else 2),
        operand_digits=args.operand_digits
        or (getattr(run_cfg.data, "operand_digits", None) if toy_data else None),
        template=args.template or (run_cfg.data.template if run_cfg is not None else "qwen-math"),
        temperature=(
            args.temperature
            if args.temperature is not None
            else (run_cfg.rollout.temperature if run_cfg is not None else 1.0)
        ),
        max_new_tokens=args.max_new_tokens,
        advantage=advantage,
        advantage_params=dict(recipe.advantage_params)
        if recipe is not None and args.advantage is None
        else {},
        ks=_ks(args.ks),
        random_draws=args.random_draws,
        batch_size=args.batch_size,
    )
    check_template(cfg.template)
    if cfg.temperature <= 0:
        raise ConfigError(f"--temperature must be > 0 (the probe samples groups), got {cfg.temperature}")
    return cfg


def _command(args: argparse.Namespace) -> str:
    """The command line that reproduces the run (options left at their defaults are omitted)."""
    parts = ["tokencredit probe", f"--model {args.model}"]
    if args.checkpoint:
        parts.append(f"--checkpoint {args.checkpoint}")
    if args.all_checkpoints:
        parts.append("--all-checkpoints")
    parts.append(f"--methods {args.methods}")
    parts += [f"--groups {args.groups}", f"--group-size {args.group_size}", f"--seed {args.seed}"]
    for name in ("difficulty", "digits", "operand_digits", "template", "temperature", "advantage"):
        value = getattr(args, name)
        if value is not None:
            parts.append(f"--{name.replace('_', '-')} {value}")
    if args.max_new_tokens != 96:
        parts.append(f"--max-new-tokens {args.max_new_tokens}")
    if args.ks != ",".join(map(str, DEFAULT_KS)):
        parts.append(f"--ks {args.ks}")
    return " ".join(parts)


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        raise ValueError(f"non-finite number in the probe result: {x}")
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def run(args: argparse.Namespace) -> int:
    from dataclasses import asdict


    if args.threads > 0:
        torch.set_num_threads(args.threads)
    points, run_cfg, recipe, run_dir = resolve_points(args)
    cfg = _probe_config(args, run_cfg, recipe)
    specs = resolve_methods(
        args.methods.split(","),
        advantage=cfg.advantage,
        advantage_params=cfg.advantage_params,
        run_recipe=recipe,
    )
    out_json = (
        Path(args.out)
        if args.out
        else (run_dir / "probe.json" if run_dir is not None else Path("probe.json"))
    )
    result: dict[str, Any] = {
        "command": _command(args),
        "model": args.model,
        "config": asdict(cfg),
        "ks": list(cfg.ks),
        "methods": [s.name for s in specs],
        "points": [],
    }
    for p in points:
        print(f"[probe] {p.label}: loading {p.source}", file=sys.stderr)
        model, tokenizer = p.load()
        res = probe_model(
            model,
            tokenizer,
            specs,
            cfg,
            log=lambda m, lab=p.label: print(f"[probe] {lab}: {m}", file=sys.stderr),
        )
        result["points"].append({"label": p.label, "source": p.source, "step": p.step, **res})
        del model
    md = markdown_report(result)
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(_jsonable(result), indent=2) + "\n", encoding="utf-8")
    out_md = out_json.with_suffix(".md")
    out_md.write_text(md, encoding="utf-8")
    print(md)
    print(f"wrote {out_json} and {out_md}", file=sys.stderr)
    return 0

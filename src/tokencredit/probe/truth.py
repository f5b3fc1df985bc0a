"""Ground truth of the synthetic task at token level: the first wrong token and each token's label.

On the embedded arithmetic task (`tokencredit.data.synthetic`) the truth is known: in a wrong
solution the first line whose content departs from the reference holds the first wrong token
(e.g. the tens digit of a sum whose carry was dropped), and every token is either shared
boilerplate ("format"), problem-dependent arithmetic ("computed") or the boxed answer.

The checker speaks in character offsets; they are mapped to the sampled token ids by decoding
them (`token_char_spans`), so it works for any tokenizer, not only the toy's character-level one:
the first wrong token is the token whose decoded text contains the first wrong character, or the
first token after the text (EOS) when the completion stopped early.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tokencredit.data.synthetic import LABELS, check, label_chars, locate_first_error
from tokencredit.data.token_labels import TAIL_LABEL, token_char_spans, token_labels

__all__ = [
    "LABELS",
    "ProbeTruth",
    "RolloutTruth",
    "build_truth",
    "char_to_token",
    "checker_reward",
    "mixed_rows",
    "rollout_summary",
    "rollout_truth",
    "token_char_spans",
    "token_labels",
]

_LABEL_CODE = {name: i for i, name in enumerate(LABELS)}


def mixed_rows(group_ids: Tensor, scores: Tensor) -> Tensor:
    """bool [N]: rows whose group (group_ids [N]) holds different scores [N] (bool or float), i.e. a
    group advantage that is not 0 (for 0/1 rewards: both correct and wrong rollouts)."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    s = scores.double()
    low = torch.full((n_groups,), torch.inf, dtype=torch.float64).scatter_reduce(0, inv, s, "amin")
    high = torch.full((n_groups,), -torch.inf, dtype=torch.float64).scatter_reduce(0, inv, s, "amax")
    return (low < high)[inv]


def checker_reward(texts: Sequence[str], problems: Sequence[Any]) -> list[float]:
    """The synthetic task's checker as a reward function: 1.0 where `check(problem, text)` holds, else 0.0
    (the reward of the probe's rollouts and of the Monte-Carlo oracle's continuations)."""
    return [1.0 if check(p, t) else 0.0 for t, p in zip(texts, problems, strict=True)]


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
        return mixed_rows(self.group_ids, self.correct)

    @property
    def tail_mask(self) -> Tensor | None:
        """bool [N,T]: the tokens labelled `TAIL_LABEL` (every character on a toy-tail task's reward-irrelevant
        tail, the trainer's `tail_token_mask` rule); None when no token is, so a task without a tail has none."""
        on = self.labels == _LABEL_CODE[TAIL_LABEL]
        return on if bool(on.any()) else None

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

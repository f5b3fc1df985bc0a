"""Groups -> the scored rollouts and saved signals the batch builder reads (credit is computed on every group
at once, as in training)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from tokencredit.batch import RolloutBatch
from tokencredit.builder import Needs, ScoredRollouts, build_batch
from tokencredit.errors import ConfigError
from tokencredit.explain.inputs import SAVED_SIGNALS, GroupInput

__all__ = [
    "SavedCredit",
    "assemble_batch",
    "padded",
    "plain_text_ids",
    "saved_credit",
    "saved_signals",
    "scored_rollouts",
    "tokenize_completions",
]


def padded(
    rows: Sequence[Sequence[float]], value: float, dtype: torch.dtype, left: bool = False
) -> tuple[Tensor, Tensor]:
    """([n, width] rows padded with `value` on the right (or left), bool mask of the real entries); width >= 1."""
    seqs = [torch.as_tensor(list(r), dtype=dtype) for r in rows]
    lengths = torch.tensor([len(r) for r in seqs], dtype=torch.int64)
    width = max(1, int(lengths.max()) if len(seqs) else 1)
    seqs.append(torch.zeros(width, dtype=dtype))  # fixes the padded width at >= 1 (dropped below)
    side = "left" if left else "right"
    out = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=value, padding_side=side)[:-1]
    pos = torch.arange(width)[None, :]
    mask = pos >= width - lengths[:, None] if left else pos < lengths[:, None]
    return out, mask


def plain_text_ids(tokenizer: Any, text: str) -> list[int]:
    """The token ids of `text` as plain text: no special tokens added, and none parsed from the text (a literal
    "<|im_end|>" in a completion stays its characters, never the end-of-sequence token); no warning for a
    text longer than the model's context (explain cuts it to fit, `signals.prepare_tokens`)."""
    return list(
        tokenizer(text, add_special_tokens=False, split_special_tokens=True, verbose=False)["input_ids"]
    )


def tokenize_completions(groups: Sequence[GroupInput], tokenizer: Any) -> None:
    """Give every completion without token_ids the ids of its text (`plain_text_ids`), stored on the completion."""
    for g in groups:
        for i, c in enumerate(g.completions):
            if c.token_ids is None:
                if tokenizer is None:
                    raise ConfigError(
                        f"{g.where}: completions[{i}] has no token_ids and no tokenizer was given"
                    )
                c.token_ids = plain_text_ids(tokenizer, c.text)


def scored_rollouts(groups: Sequence[GroupInput], tokenizer: Any = None) -> ScoredRollouts:
    """Every completion of `groups` as right-padded scored rollouts (rows in order, group ids from the groups).

    Completions without token_ids are tokenised with `tokenizer` (`tokenize_completions`: as plain text; the
    ids are stored on the completion). Responses are padded with the tokenizer's pad id (0 without one).
    """
    tokenize_completions(groups, tokenizer)
    rows: list[list[int]] = [c.token_ids for g in groups for c in g.completions]  # type: ignore[misc]
    comps = [c for g in groups for c in g.completions]
    pad = 0 if tokenizer is None or tokenizer.pad_token_id is None else int(tokenizer.pad_token_id)
    ids, mask = padded(rows, pad, torch.int64)
    return ScoredRollouts(
        response_ids=ids,
        response_mask=mask,
        group_ids=torch.tensor([g.group_id for g in groups for _ in g.completions], dtype=torch.int64),
        scores=torch.tensor([c.score for c in comps], dtype=torch.float32),
        truncated=torch.tensor([c.truncated for c in comps], dtype=torch.bool),
    )


def saved_signals(groups: Sequence[GroupInput]) -> dict[str, Tensor]:
    """The signals saved with the rollouts (entropy, old_log_probs, an oracle / VinePPO run's Monte-Carlo
    values), [N,T] right-padded with 0, each only when every completion carries it."""
    comps = [c for g in groups for c in g.completions]
    return {
        name: padded([getattr(c, name) for c in comps], 0.0, torch.float32)[0]
        for name in SAVED_SIGNALS
        if comps and all(getattr(c, name) is not None for c in comps)
    }


class SavedCredit(NamedTuple):
    """The credit saved with the rollouts (explain's `saved` column), rows in the batch's order."""

    token_advantages: Tensor  # Â [N,T] float32, 0 off each row's tokens and on rows without one
    seq_advantages: Tensor  # A [N] float32
    present: Tensor  # bool [N]: the completion carries Â


def saved_credit(groups: Sequence[GroupInput], width: int) -> SavedCredit:
    """The Â (`token_advantages`, one per token id) and A (`advantage`; without one, the mean of the row's Â,
    what a per-token objective averages to) saved with the completions of `groups`, Â right-padded to `width`."""
    comps = [c for g in groups for c in g.completions]
    hat = torch.zeros(len(comps), width, dtype=torch.float32)
    seq = torch.zeros(len(comps), dtype=torch.float32)
    has = torch.zeros(len(comps), dtype=torch.bool)
    for i, c in enumerate(comps):
        if c.token_advantages is None:
            continue
        n = len(c.token_advantages)
        if n > width:
            raise ValueError(f"saved_credit: completion {i} has {n} token advantages for a width of {width}")
        hat[i, :n] = torch.tensor(c.token_advantages, dtype=torch.float32)
        seq[i] = c.advantage if c.advantage is not None else (sum(c.token_advantages) / n if n else 0.0)
        has[i] = True
    return SavedCredit(hat, seq, has)


def assemble_batch(
    groups: Sequence[GroupInput], tokenizer: Any = None, *, use_saved_signals: bool = True
) -> RolloutBatch:
    """The RolloutBatch of `groups` as saved (`scored_rollouts`, with `saved_signals` unless told not to),
    through the one builder, computing nothing."""
    given = saved_signals(groups) if use_saved_signals else None
    return build_batch(scored_rollouts(groups, tokenizer), Needs(), given=given, who="explain")

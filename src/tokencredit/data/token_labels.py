"""Per-token labels of a completion from a task's per-character labels, for any tokenizer.

A task's checker labels characters (`tokencredit.data.synthetic.label_chars`: format, computed, answer,
choice, free, tail); the engines that read labels per token (the probe's truth, the trainer's tail mask)
map them to the sampled token ids by decoding (`token_char_spans`), so it works for any tokenizer, not
only the toy's character-level one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["TAIL_LABEL", "tail_token_mask", "token_char_spans", "token_labels"]

TAIL_LABEL = "tail"


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
            prev = max(prev, len(os.path.commonprefix([p, text])))
            ends.append(prev)
        if ends:
            ends[-1] = len(text)
    starts = [0, *ends[:-1]]
    return text, list(zip(starts, ends))


def token_labels(char_labels: Sequence[str], spans: Sequence[tuple[int, int]]) -> list[str]:
    """One label per token from per-character labels, the first of "answer", "computed", "choice", "free"
    that any of its characters has; "tail" only if all of them are tail (a token that reaches into the
    answer is not reward-irrelevant); else "format" (tokens without text, e.g. EOS, are format)."""
    out = []
    for s, e in spans:
        chars = set(char_labels[s:e])
        if chars == {"tail"}:
            out.append("tail")
            continue
        out.append(next((lab for lab in ("answer", "computed", "choice", "free") if lab in chars), "format"))
    return out


def tail_token_mask(
    tokenizer: Any,
    token_ids: Tensor,
    mask: Tensor,
    problems: Sequence[Any],
    label_chars: Callable[[Any, str], list[str]],
) -> Tensor:
    """bool [N,T]: the valid response tokens (mask [N,T]) of token_ids [N,T] that `token_labels` labels
    `TAIL_LABEL` from `label_chars(problem, text)` (row i answers problems[i]): every character of the token
    is on the tail; a token that also holds another character (or none, as EOS) is not, so the mask never
    zeroes credit a reward could depend on."""
    n, t = token_ids.shape
    if len(problems) != n:
        raise ValueError(f"tail_token_mask: {len(problems)} problems for {n} rollouts")
    out = torch.zeros((n, t), dtype=torch.bool)
    valid = mask.bool().cpu()
    ids_cpu = token_ids.cpu()
    for i in range(n):
        cols = valid[i].nonzero().flatten().tolist()
        text, spans = token_char_spans(tokenizer, ids_cpu[i, valid[i]].tolist())
        labels = token_labels(label_chars(problems[i], text), spans)
        out[i, [c for c, lab in zip(cols, labels) if lab == TAIL_LABEL]] = True
    return out.to(token_ids.device)

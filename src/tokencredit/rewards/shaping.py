"""Reward shaping terms added to the verifier score: DAPO's overlong penalty and a format reward."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from tokencredit.rewards.extract import last_boxed

FORMAT_STYLES = ("boxed", "think-answer")


def overlong_penalty(lengths: Tensor | Sequence[int], max_len: int, cache_len: int) -> Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, Eq. 13), added to the score.

    R(L) = 0 if L <= max_len - cache_len; (max_len - cache_len - L) / cache_len inside the buffer;
    -1 if L > max_len. lengths: [N] response lengths in tokens. Returns float32 [N] in [-1, 0].
    """
    if cache_len <= 0 or cache_len > max_len:
        raise ValueError(
            f"overlong shaping needs 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}"
        )
    L = torch.as_tensor(lengths)
    if L.ndim != 1:
        raise ValueError(f"lengths must be 1-D [N], got shape {tuple(L.shape)}")
    if L.is_floating_point() or L.is_complex():
        raise ValueError(f"lengths must be integer token counts, got dtype {L.dtype}")
    if (L < 0).any():
        raise ValueError(f"lengths must be >= 0; rollout {int((L < 0).nonzero()[0])} has {int(L[L < 0][0])}")
    Lf = L.to(torch.float64)
    start = float(max_len - cache_len)
    out = ((start - Lf) / cache_len).clamp(min=-1.0, max=0.0)
    return out.to(torch.float32)


def _think_answer_ok(text: str) -> bool:
    r"""The r1-zero format, in linear time: after optional blanks and an optional ``<think>``, some
    ``</think>`` with no ``<think>`` before it is followed by blanks, ``<answer>``, at least one
    character, and a ``</answer>`` ending the text (up to blanks).

    Same verdicts as the regex ``^\s*(?:<think>)?(?:(?!<think>).)*?</think>\s*<answer>(.+?)</answer>\s*$``
    (DOTALL) it replaced (tested), which backtracked quadratically: 0.3 s for 5k spaces.
    """
    s = text.lstrip()
    if s.startswith("<think>"):
        s = s[7:]
    n = len(s.rstrip())
    if not s.endswith("</answer>", 0, n):
        return False
    first_open = s.find("<think>")
    pos = s.find("</think>")
    while pos >= 0 and (first_open < 0 or pos < first_open):
        j = pos + 8
        while j < n and s[j].isspace():
            j += 1
        if s.startswith("<answer>", j) and n - j >= 8 + 1 + 9:
            return True
        pos = s.find("</think>", pos + 1)
    return False


def format_reward(completions: Sequence[str], style: str = "boxed") -> list[float]:
    """1.0 when a completion has the expected answer format, else 0.0.

    style "boxed": a complete ``\\boxed{...}`` answer (qwen-math template).
    style "think-answer": ``... </think> <answer> ... </answer>`` with nothing after (r1-zero
    template, whose prompt already opens ``<think>``).
    """
    if style not in FORMAT_STYLES:
        raise ValueError(f"format style must be one of {FORMAT_STYLES}, got {style!r}")
    out = []
    for c in completions:
        if style == "boxed":
            ok = last_boxed(c) is not None
        else:
            ok = _think_answer_ok(c)
        out.append(1.0 if ok else 0.0)
    return out

"""The saved-rollouts JSONL: one group of rollouts per line, each completion with its tokens, score, A and
the token advantages Â it trained with. `tokencredit explain --jsonl FILE` reads it
(`tokencredit.explain.inputs`) and, through its "problem" / "answer" fields, `tokencredit probe --data
FILE`; the TRL and verl plugins write it (docs/integrations.md, "Saving rollouts for explain and probe"),
with the group fields of a dataset row read by `problem_fields`.

A line (a group): ``format_version`` (`FORMAT_VERSION`; a line without one, written before the field,
is version 1), ``step``, ``recipe``, ``credit``, ``group`` (unique in the file), the prompt as
``prompt`` (the literal text the model continued) and / or ``problem`` (the task text), optionally
``answer``, ``id`` and other per-group fields, and ``completions``: objects made by `completion_record`.
Values are rounded (Â and Monte-Carlo values to 6 decimals, entropy and log-probs to 5); a non-finite
number is an error, never written (strict JSON). The format is documented in docs/inputs.md ("Rollouts for
explain and probe"); a change that an older reader would misread raises `FORMAT_VERSION`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from torch import Tensor

from tokencredit.data.loaders import DataError, problem_from_row

__all__ = [
    "FORMAT_VERSION",
    "FORMAT_VERSION_FIELD",
    "completion_record",
    "completion_records",
    "group_record",
    "group_records",
    "jsonl_text",
    "problem_fields",
]

# the version of the lines written here; readers (`tokencredit.explain.inputs`) refuse a higher one
FORMAT_VERSION = 1
FORMAT_VERSION_FIELD = "format_version"
# decimals kept per per-token value (others: `_DECIMALS`); the old policy's signals need less
_SIGNAL_DECIMALS = {"entropy": 5, "old_log_probs": 5}
_DECIMALS = 6


def _rounded(values: Tensor | Sequence[float], decimals: int) -> list[float]:
    # "+ 0.0": -0.0 (a zero Â of a negative rollout) is written as 0.0
    return [
        round(float(x), decimals) + 0.0 for x in (values.tolist() if isinstance(values, Tensor) else values)
    ]


def completion_record(
    *,
    text: str,
    token_ids: Sequence[int],
    score: float,
    advantage: float,
    token_advantages: Tensor | Sequence[float],
    tokens: Sequence[str] | None = None,
    truncated: bool | None = None,
    correct: bool | None = None,
    signals: Mapping[str, Tensor | Sequence[float] | None] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One completion: text, token ids (and raw tokens), score, A, Â [L] over its L tokens, truncation and
    correctness when known (None: the field is left out), per-token `signals` [L] (None: not computed, written
    as null) and `extra` fields as given."""
    n = len(token_ids)
    per_token = {
        "token_advantages": token_advantages,
        **{k: v for k, v in (signals or {}).items() if v is not None},
    }
    for name, values in per_token.items():
        if len(values) != n:
            raise ValueError(f"completion_record: {name} has {len(values)} values for {n} tokens")
    if tokens is not None and len(tokens) != n:
        raise ValueError(f"completion_record: {len(tokens)} tokens for {n} token ids")
    return {
        "text": text,
        "token_ids": [int(i) for i in token_ids],
        **({"tokens": list(tokens)} if tokens is not None else {}),
        "score": float(score),
        **({"correct": bool(correct)} if correct is not None else {}),
        **extra,
        "advantage": float(advantage),
        "token_advantages": _rounded(token_advantages, _DECIMALS),
        **({"truncated": bool(truncated)} if truncated is not None else {}),
        **{
            name: None if values is None else _rounded(values, _SIGNAL_DECIMALS.get(name, _DECIMALS))
            for name, values in (signals or {}).items()
        },
    }


def completion_records(
    token_ids: Tensor,
    mask: Tensor,
    scores: Tensor,
    seq_advantages: Tensor,
    token_advantages: Tensor,
    *,
    texts: Sequence[str],
    tokens: Sequence[Sequence[str]] | None = None,
    truncated: Tensor | Sequence[bool] | None = None,
    correct: Tensor | Sequence[bool | None] | None = None,
    signals: Mapping[str, Tensor | None] | None = None,
    row_fields: Sequence[Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """`completion_record` of every row of a batch: token_ids, mask, token_advantages, signals [N,T] (a row's
    tokens are its first mask.sum() positions), scores, seq_advantages, truncated and correct [N], texts (and
    tokens) and extra `row_fields` per row."""
    lengths = mask.bool().sum(-1).tolist()
    out = []
    for i, n in enumerate(lengths):
        out.append(
            completion_record(
                text=texts[i],
                token_ids=token_ids[i, :n].tolist(),
                score=float(scores[i]),
                advantage=float(seq_advantages[i]),
                token_advantages=token_advantages[i, :n].detach().cpu(),
                tokens=None if tokens is None else tokens[i],
                truncated=None if truncated is None else bool(truncated[i]),
                correct=None if correct is None or correct[i] is None else bool(correct[i]),
                signals={
                    k: None if v is None else v[i, :n].detach().cpu() for k, v in (signals or {}).items()
                },
                **(row_fields[i] if row_fields is not None else {}),
            )
        )
    return out


def group_record(
    *,
    step: int,
    recipe: str,
    credit: str,
    group: int,
    completions: Sequence[Mapping[str, Any]],
    **fields: Any,
) -> dict[str, Any]:
    """One line: the format version, a group's completions (`completion_record`) with the step, recipe, credit
    method, group id and the group's `fields` (prompt, problem, answer, id, ...; None values are left out)."""
    if not completions:
        raise ValueError(f"group_record: group {group} has no completion")
    return {
        FORMAT_VERSION_FIELD: FORMAT_VERSION,
        "step": int(step),
        "recipe": recipe,
        "credit": credit,
        "group": int(group),
        **{k: v for k, v in fields.items() if v is not None},
        "completions": [dict(c) for c in completions],
    }


def group_records(
    *,
    step: int,
    recipe: str,
    credit: str,
    group_ids: Sequence[int] | Tensor,
    completions: Sequence[Mapping[str, Any]],
    fields: Mapping[int, Mapping[str, Any]],
    max_groups: int | None = None,
) -> list[dict[str, Any]]:
    """The lines of a batch: completions [N] (rows in batch order) grouped by group_ids [N], groups in ascending
    id (the first `max_groups` of them), each with its `fields[group id]`."""
    gids = group_ids.tolist() if isinstance(group_ids, Tensor) else list(group_ids)
    if len(gids) != len(completions):
        raise ValueError(f"group_records: {len(gids)} group ids for {len(completions)} completions")
    members: dict[int, list[Mapping[str, Any]]] = {}
    for g, c in zip(gids, completions):
        members.setdefault(int(g), []).append(c)
    order = sorted(members)[:max_groups]
    return [
        group_record(
            step=step, recipe=recipe, credit=credit, group=g, completions=members[g], **fields.get(g, {})
        )
        for g in order
    ]


def problem_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    """A dataset row's "problem" text, gold "answer" and "id" (only when the row has one) for the saved rollouts,
    read with the data loader's field mapping (`tokencredit.data.loaders`); {} when the row has no problem text
    or no answer (explain shows the prompt instead; probe cannot pose such a group again)."""
    try:
        p = problem_from_row(dict(row), default_id="", where="dataset row")
    except DataError:
        return {}
    return {"problem": p.problem, "answer": p.answer, **({"id": p.id} if p.id else {})}


def _check_finite(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"saved rollouts: {where} is {value}; the format holds finite numbers only")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_finite(v, f"{where}[{i}]")


def jsonl_text(records: Iterable[Mapping[str, Any]]) -> str:
    """The file's text: one JSON object per line. A non-finite number raises ValueError naming where it is."""
    lines = []
    for n, record in enumerate(records):
        try:
            lines.append(json.dumps(record, allow_nan=False) + "\n")
        except ValueError:
            _check_finite(dict(record), f"line {n + 1}")  # names the value
            raise
    return "".join(lines)

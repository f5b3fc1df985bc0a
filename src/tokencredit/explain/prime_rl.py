"""prime-rl's per-token exports read as explain's groups (`tokencredit explain --jsonl FILE_OR_DIR`); their
layout and how a record is recognised are `tokencredit.rollout.prime_rl`.

prime-rl's trainer, with ``enable_token_export = true``, writes one JSON object per trained sequence to
``OUTPUT_DIR/token_exports/step_<step>/rank_<rank>.jsonl`` and touches ``STABLE`` in the step's directory once
every rank has written. Schema version 1, as read from src/prime_rl/trainer/rl/token_export.py of
PrimeIntellect-ai/prime-rl at commit 559b44772e471d1538537b8805cc77f3824a5e64 (docs/inputs.md has the table):
``schema_version``, ``step``, ``rank``, ``micro_step``, ``micro_sequence_idx``, ``export_sequence_idx``,
``env_name``, and per-token lists of one length: ``token_ids``, ``position_ids``, ``loss_mask``, ``advantages``,
``inference_logprobs``, ``trainer_logprobs``, ``entropy``, ``mismatch_kl``, ``log_importance_ratio``,
``importance_ratio``, ``prob_delta``, ``is_masked``, ``is_masked_high``, ``is_masked_low``, ``rl_weights``,
``ce_weights``, ``ref_kl_weights`` (a non-finite number, or an absent stream, is null). Files written before
prime-rl's commit 86dd8e9 (June 2026) also hold ``rewards``: the rollout's reward on every token.

A record is a whole sequence, prompt and completion, with no split between them: ``loss_mask`` is true on the
tokens the model sampled. The prompt is the tokens before the first true one (kept as token ids, never
re-tokenised), the completion the run of true tokens from there; a later run (a multi-turn sample, context
between the model's turns) is left out, the completion marked truncated and a note says how many. A group is
the records of one step with the same prompt ids (the rollouts of one example share the prompt; the files of
all ranks are read, since one group's rollouts may be trained on several ranks). The reward is ``rewards`` at
the first completion token when the record has it; otherwise it is the trained sequence advantage A (the mean of
``advantages`` over the completion: GRPO's reward minus the group's mean), from which every estimator that
subtracts a group mean recomputes the same A; a note says so. ``advantages`` over the completion are the saved Â
(``--methods saved``); ``entropy`` and ``inference_logprobs`` are kept as the completion's entropy and old
log-probs. Every error is one line naming file:line and the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokencredit.errors import ConfigError
from tokencredit.explain.inputs import CompletionInput, GroupInput, data_error, finite, read_lines, short
from tokencredit.rollout.prime_rl import SCHEMA_VERSION, export_files, is_record

__all__ = ["groups_of", "load_export"]


def _list(obj: dict[str, Any], name: str, n: int | None, where: str) -> list[Any]:
    value = obj.get(name)
    if value is None:
        raise data_error(where, f"no '{name}' (a prime-rl token export record carries it)")
    if not isinstance(value, list) or (n is not None and len(value) != n):
        got = f"{len(value)} values" if isinstance(value, list) else type(value).__name__
        raise data_error(where, f"'{name}' must be a list of {n} values (one per token id), got {got}")
    return value


def _numbers(values: list[Any], start: int, end: int, where: str, name: str) -> list[float] | None:
    """values[start:end] as floats, or None when one is null (prime-rl writes a non-finite value as null)."""
    part = values[start:end]
    if any(v is None for v in part):
        return None
    return [finite(v, where, f"'{name}'[{start + k}]") for k, v in enumerate(part)]


def _record(obj: Any, where: str, notes: _Notes) -> tuple[tuple[Any, ...], CompletionInput, dict[str, Any]]:
    """(group key: step and prompt ids, the completion, the group's fields) of one record (module docstring)."""
    if not isinstance(obj, dict):
        raise data_error(where, f"expected a JSON object, got {type(obj).__name__}")
    if not is_record(obj):
        raise data_error(
            where,
            "not a prime-rl token export record (no 'token_ids' and 'loss_mask'), unlike the file's first line",
        )
    version = obj.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise data_error(
            where,
            f"'schema_version' is {short(version)}: this reader knows prime-rl's version {SCHEMA_VERSION}",
        )
    ids = _list(obj, "token_ids", None, where)
    for j, x in enumerate(ids):
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 2**63:
            raise data_error(
                where, f"'token_ids'[{j}] = {short(x)} is not a token id (a non-negative integer)"
            )
    n = len(ids)
    mask = _list(obj, "loss_mask", n, where)
    if not all(isinstance(m, bool) for m in mask):
        raise data_error(where, "'loss_mask' must be a list of true / false")
    if not any(mask):
        raise data_error(where, "'loss_mask' has no true value: no token the model sampled")
    start = mask.index(True)
    if start == 0:
        raise data_error(where, "'loss_mask' is true at token 0: no prompt before the completion")
    end = mask.index(False, start) if False in mask[start:] else n
    advantages = _list(obj, "advantages", n, where)
    for j in range(start, end):
        finite(advantages[j], where, f"'advantages'[{j}] (a completion token; null is a non-finite value)")
    hat = [float(advantages[j]) for j in range(start, end)]
    seq = sum(hat) / len(hat)
    rewards = obj.get("rewards")
    if rewards is not None:
        rewards = _list(obj, "rewards", n, where)
        score = finite(rewards[start], where, f"'rewards'[{start}] (the first completion token)")
    else:
        score = seq
        notes.no_reward += 1
    later = any(mask[end:])
    notes.multi_turn += later
    entropy, old_log_probs = (
        _numbers(_list(obj, key, n, where), start, end, where, key) if obj.get(key) is not None else None
        for key in ("entropy", "inference_logprobs")
    )
    step = obj.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise data_error(where, f"'step' must be an integer, got {short(step)}")
    completion = CompletionInput(
        text="",
        score=score,
        token_ids=ids[start:end],
        truncated=later,
        advantage=seq,
        token_advantages=hat,
        entropy=entropy,
        old_log_probs=old_log_probs,
    )
    fields = {k: obj[k] for k in ("step", "env_name") if obj.get(k) is not None}
    return (step, tuple(ids[:start])), completion, fields


class _Notes:
    """What the records had in common that the page should say (counted while reading)."""

    def __init__(self) -> None:
        self.no_reward = 0
        self.multi_turn = 0


def groups_of(files: Sequence[tuple[Path, list[tuple[int, Any]]]], notes: list[str]) -> list[GroupInput]:
    """Groups of prime-rl records ((file, its (line number, value) pairs) in order; module docstring), group ids
    in order of first appearance; what the page should say about them appended to `notes`."""
    seen = _Notes()
    groups: dict[tuple[Any, ...], GroupInput] = {}
    for path, lines in files:
        for lineno, obj in lines:
            key, completion, fields = _record(obj, f"{path}:{lineno}", seen)
            g = groups.get(key)
            if g is None:
                g = groups[key] = GroupInput(
                    group_id=len(groups),
                    completions=[],
                    where=f"{path}:{lineno}",
                    prompt_token_ids=list(key[1]),
                    extra=fields,
                )
            g.completions.append(completion)
    if not groups:
        raise ConfigError(f"--jsonl {', '.join(str(p) for p, _ in files)}: no record in the file(s)")
    n = sum(len(g.completions) for g in groups.values())
    if seen.no_reward:
        notes.append(
            f"prime-rl token export without rewards ({seen.no_reward} of {n} sequences; prime-rl stopped writing them "
            "in June 2026): each completion's reward is its trained sequence advantage A (GRPO: reward − group mean), "
            "from which grpo, dr-grpo and rloo recompute the same A; right / wrong is A > 0"
        )
    if seen.multi_turn:
        notes.append(
            f"{seen.multi_turn} of {n} prime-rl sequences are multi-turn (context between the model's turns): only "
            "their first turn is shown and scored, marked truncated"
        )
    return list(groups.values())


def load_export(path: Path, step: int | None, notes: list[str]) -> list[GroupInput]:
    """The groups of one step of a prime-rl export directory (`export_files`), every rank's file read."""
    step, files = export_files(path, step, notes)
    notes.append(f"prime-rl token export: step {step}, {len(files)} rank file(s) in {files[0].parent}")
    return groups_of([(f, read_lines(f)) for f in files], notes)

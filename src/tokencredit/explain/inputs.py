"""The groups `tokencredit explain` reads: a JSONL of prompts, completions and rewards, or a run's saved rollouts.

A JSONL file holds one group per line: ``{"prompt" | "problem": str, "completions": [str, ...],
"rewards": [float, ...], "answer": optional}``, or a line in the run-directory schema
(completions as objects with "text" / "token_ids" and "score", optionally the old policy's
"entropy" / "old_log_probs", an oracle / VinePPO run's Monte-Carlo "mc_advantages" /
"mc_step_advantages", and raw "tokens"; see `tokencredit.train.rundir.rollout_records`). A line's
"format_version" (`tokencredit.rollout.records.FORMAT_VERSION`; a line without one is version 1) above the
version this reader knows is refused. `tokencredit.explain.jsonl` reads these files and prime-rl's token
exports (`tokencredit.explain.prime_rl`), told apart by the first record's keys. Every error names the file and line. A run's saved rollouts can be read leniently (`skipped` a list):
a damaged line or group is left out, with one line there naming file:line, and the other groups are used.

What is refused, naming file:line and the field: a file that is not UTF-8 text (its encoding is not
guessed: a replaced character would change the tokens scored) or holds a NUL byte (a binary file);
JSON nested too deeply to read or with an integer too long to convert; text holding a lone surrogate
("\\ud800": not Unicode); a number that is finite in float64 but not in float32 (|x| > 3.4e38, e.g. a
reward of 1e308: credit is computed in float32); a token id or group id outside int64; a token id that is
a boolean. `check_token_ids` refuses, before any model loads, a token id outside the tokenizer's and the
model's vocabulary. `cut_completion` shortens a completion (its ids and every per-token list) to a cap.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokencredit.batch import MC_SIGNALS
from tokencredit.data.loaders import DataError, json_line_error, parse_json_line
from tokencredit.errors import ConfigError
from tokencredit.rewards.reasoning_gym import GymAnswer
from tokencredit.rollout.records import FORMAT_VERSION, FORMAT_VERSION_FIELD
from tokencredit.train.rundir import RunDir, damaged_line

__all__ = [
    "DISPLAY_SIGNALS",
    "SAVED_SIGNALS",
    "CompletionInput",
    "GroupInput",
    "check_token_ids",
    "cut_completion",
    "data_error",
    "finite",
    "groups_of_lines",
    "load_run_rollouts",
    "read_groups",
    "read_lines",
    "saved_steps",
    "short",
]

# the per-token signals a saved completion may carry (shown on the page, used when present)
DISPLAY_SIGNALS = ("entropy", "old_log_probs")
# every per-token signal a saved completion may carry: those shown, and the Monte-Carlo values an
# oracle / vineppo run sampled (used for those columns instead of sampling them again)
SAVED_SIGNALS = DISPLAY_SIGNALS + MC_SIGNALS
# every per-token list of a completion (cut together by `cut_completion`)
_PER_TOKEN = (*SAVED_SIGNALS, "tokens", "token_advantages")
_INT64 = 2**63  # token ids and group ids become int64 tensors
_FLOAT32_MAX = 3.4028234663852886e38  # rewards and per-token values become float32 tensors


@dataclass
class CompletionInput:
    text: str
    score: float
    token_ids: list[int] | None = None
    correct: bool | None = None
    truncated: bool = False
    entropy: list[float] | None = None
    old_log_probs: list[float] | None = None
    mc_advantages: list[float] | None = None
    mc_step_advantages: list[float] | None = None
    tokens: list[str] | None = None  # raw token strings as saved (display fallback without a tokenizer)
    # what the engine that saved the rollouts trained with (`tokencredit.rollout.records`): A and Â per token id
    advantage: float | None = None
    token_advantages: list[float] | None = None
    full_length: int | None = None  # tokens before `cut_completion` shortened it (None: never cut)


@dataclass
class GroupInput:
    """One prompt and its completions; `where` names the source (file:line) for error messages."""

    group_id: int
    completions: list[CompletionInput]
    where: str
    problem: str | None = None  # the task text (a template makes the prompt from it)
    prompt: str | None = None  # the literal prompt text, when given
    # the prompt's token ids as the engine fed them (a prime-rl export's): used as they are, never re-tokenised
    prompt_token_ids: list[int] | None = None
    answer: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def data_error(where: str, msg: str) -> Exception:
    return DataError(f"{where}: {msg}")


def finite(value: Any, where: str, what: str) -> float:
    """`value` as a float: a number, finite in float32 (the precision credit is computed in)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise data_error(where, f"{what} must be a finite number, got {value!r}")
    try:
        x = float(value)
    except OverflowError:  # an integer beyond float64
        x = math.inf
    if not math.isfinite(x):
        raise data_error(where, f"{what} must be a finite number, got {short(value)}")
    if abs(x) > _FLOAT32_MAX:
        raise data_error(
            where,
            f"{what} = {x!r} is finite in float64 but not in float32 (|x| > 3.4e38), which credit is "
            "computed in; rescale it",
        )
    return x


def short(value: Any) -> str:
    """repr of `value`, cut to 40 characters (a 4000-digit integer named in a one-line error)."""
    r = repr(value)
    return r if len(r) <= 40 else f"{r[:20]}...{r[-8:]} ({len(r)} characters)"


def _text(value: str, where: str, what: str) -> str:
    """`value`, refused when it is not Unicode text (a lone surrogate such as "\\ud800", which JSON escapes
    allow but no encoding, tokenizer or page can hold)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise data_error(
            where,
            f"{what} holds a lone surrogate ({value[e.start]!r} at character {e.start}), not Unicode "
            "text: fix that \\u escape in the file",
        ) from None
    return value


def _token_ids(ids: Any, where: str, what: str) -> list[int] | None:
    """A completion's token ids: None, or a list of non-negative integers that fit in int64."""
    if ids is None:
        return None
    if not isinstance(ids, list):
        raise data_error(where, f"{what} must be a list of non-negative integers, got {type(ids).__name__}")
    for j, x in enumerate(ids):
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < _INT64:
            raise data_error(
                where, f"{what}[{j}] = {short(x)} is not a token id (a non-negative integer below 2**63)"
            )
    return ids


def _float_list(value: Any, n: int, where: str, what: str) -> list[float] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != n:
        got = f"{len(value)} values" if isinstance(value, list) else type(value).__name__
        raise data_error(where, f"{what} must be a list of {n} numbers (one per token), got {got}")
    return [finite(v, where, f"{what}[{i}]") for i, v in enumerate(value)]


def _answer_text(value: Any, ref: Any = None) -> str | None:
    """The gold answer as text; with a reasoning-gym entry reference (`answer_ref`, saved by the trainer)
    the answer that names its entry, so the run's reasoning-gym reward can score continuations."""
    if value is None:
        return None
    if isinstance(value, list):
        return " | ".join(str(v) for v in value)
    if isinstance(ref, dict):
        return GymAnswer(str(value), **ref)
    return str(value)


def _completion_object(c: Any, where: str, i: int) -> CompletionInput:
    """A completion in the run-directory schema (see `tokencredit.train.rundir.rollout_records`)."""
    if not isinstance(c, dict):
        raise data_error(where, f"completions[{i}] must be an object or a string, got {type(c).__name__}")
    text = c.get("text", "")
    if not isinstance(text, str):
        raise data_error(where, f"completions[{i}].text must be a string")
    _text(text, where, f"completions[{i}].text")
    ids = _token_ids(c.get("token_ids"), where, f"completions[{i}].token_ids")
    if ids is None and "text" not in c:
        raise data_error(where, f"completions[{i}] has neither token_ids nor text")
    score = c.get("score", c.get("reward"))
    if score is None:
        raise data_error(where, f"completions[{i}] has no score")
    n = len(ids) if ids is not None else -1
    signals = {}
    for name in SAVED_SIGNALS:
        v = c.get(name)
        if v is not None and ids is None:
            raise data_error(where, f"completions[{i}].{name} needs token_ids (values are per token)")
        signals[name] = _float_list(v, n, where, f"completions[{i}].{name}")
    tokens = c.get("tokens")
    if tokens is not None and not (
        isinstance(tokens, list) and len(tokens) == n and all(isinstance(t, str) for t in tokens)
    ):
        raise data_error(where, f"completions[{i}].tokens must be a list of {n} strings")
    for j, t in enumerate(tokens or []):
        _text(t, where, f"completions[{i}].tokens[{j}]")
    if c.get("token_advantages") is not None and ids is None:
        raise data_error(where, f"completions[{i}].token_advantages needs token_ids (values are per token)")
    token_advantages = _float_list(c.get("token_advantages"), n, where, f"completions[{i}].token_advantages")
    advantage = c.get("advantage")
    advantage = None if advantage is None else finite(advantage, where, f"completions[{i}].advantage")
    correct = c.get("correct")
    if correct is not None and not isinstance(correct, bool):
        raise data_error(where, f"completions[{i}].correct must be true/false")
    return CompletionInput(
        text=text,
        score=finite(score, where, f"completions[{i}].score"),
        token_ids=ids,
        correct=correct,
        truncated=bool(c.get("truncated", False)),
        tokens=tokens,
        advantage=advantage,
        token_advantages=token_advantages,
        **signals,
    )


def _completions(obj: dict[str, Any], comps: list[Any], where: str) -> list[CompletionInput]:
    """A group's completions: strings with a parallel 'rewards' list, or objects in the run schema."""
    if all(isinstance(c, str) for c in comps):
        rewards = obj.get("rewards")
        if not isinstance(rewards, list) or len(rewards) != len(comps):
            got = f"{len(rewards)} values" if isinstance(rewards, list) else repr(rewards)
            raise data_error(
                where, f"'rewards' must be a list of {len(comps)} numbers (one per completion), got {got}"
            )
        return [
            CompletionInput(
                text=_text(c, where, f"completions[{i}]"), score=finite(r, where, f"rewards[{i}]")
            )
            for i, (c, r) in enumerate(zip(comps, rewards))
        ]
    if all(isinstance(c, dict) for c in comps):
        return [_completion_object(c, where, i) for i, c in enumerate(comps)]
    raise data_error(where, "'completions' must be all strings (with 'rewards') or all objects")


def _parse_group(obj: Any, where: str, default_id: int) -> GroupInput:
    if not isinstance(obj, dict):
        raise data_error(where, f"expected a JSON object, got {type(obj).__name__}")
    version = obj.get(FORMAT_VERSION_FIELD, 1)  # a line without one is version 1 (written before the field)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        raise data_error(
            where,
            f"'{FORMAT_VERSION_FIELD}' is {short(version)}: this tokencredit reads rollouts format versions 1 to "
            f"{FORMAT_VERSION} (a newer tokencredit wrote the file? upgrade it)",
        )
    comps = obj.get("completions")
    if not isinstance(comps, list) or not comps:
        raise data_error(where, "'completions' must be a non-empty list")
    prompt, problem = obj.get("prompt"), obj.get("problem")
    if prompt is not None and not isinstance(prompt, str):
        raise data_error(where, "'prompt' must be a string")
    if problem is not None and not isinstance(problem, str):
        raise data_error(where, "'problem' must be a string")
    for name, value in (("prompt", prompt), ("problem", problem)):
        if value is not None:
            _text(value, where, f"'{name}'")
    completions = _completions(obj, comps, where)
    gid = obj.get("group", default_id)
    if isinstance(gid, bool) or not isinstance(gid, int):
        raise data_error(where, f"'group' must be an integer, got {short(gid)}")
    if not -_INT64 <= gid < _INT64:
        raise data_error(where, f"'group' = {short(gid)} does not fit in 64 bits (a group id is an int64)")
    answer = _answer_text(obj.get("answer"), obj.get("answer_ref"))
    if answer is not None:
        _text(answer, where, "'answer'")
    return GroupInput(
        group_id=gid,
        completions=completions,
        where=where,
        problem=problem,
        prompt=prompt,
        answer=answer,
        extra={k: obj[k] for k in ("step", "recipe", "credit", "id") if k in obj},
    )


def groups_of_lines(
    lines: Iterable[tuple[int, Any]],
    path: Path,
    skipped: list[str] | None = None,
    *,
    run_schema: bool = False,
    damaged: int = 0,
) -> list[GroupInput]:
    """GroupInputs of parsed JSONL lines ((line number, value)) of `path`, in order, with unique group ids
    (and, for `run_schema`, token ids on every completion). A bad group is an error naming file:line, or
    with `skipped` a list, left out and said there; `damaged`: lines already left out as not JSON."""
    groups: list[GroupInput] = []
    ids: dict[int, str] = {}
    bad: list[tuple[int, str]] = []
    for lineno, obj in lines:
        where = f"{path}:{lineno}"
        try:
            g = _parse_group(obj, where, len(groups))
            if g.group_id in ids:
                raise data_error(where, f"group id {g.group_id} repeats the one at {ids[g.group_id]}")
            missing = [i for i, c in enumerate(g.completions) if c.token_ids is None] if run_schema else []
            if missing:
                raise data_error(
                    where, f"completions[{missing[0]}] has no token_ids (not a file written by the trainer?)"
                )
        except DataError as e:
            if skipped is None:
                raise
            bad.append((lineno, str(e).removeprefix(f"{where}: ")))
            continue
        ids[g.group_id] = where
        groups.append(g)
    if skipped is not None:
        skipped += [damaged_line(path, n, why, len(groups), what="group") for n, why in bad]
    if not groups and (bad or damaged):
        raise data_error(
            str(path),
            f"no readable group in the file ({len(bad) + damaged} damaged line(s)); explain another "
            "saved step (--step) or copy the file again",
        )
    if not groups:
        raise data_error(str(path), "no group in the file")
    return groups


def _decoded(raw: bytes, path: Path, lineno: int) -> str:
    """One line of the file as text: UTF-8 (a byte-order mark on the first line dropped), never guessed."""
    if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    if b"\x00" in raw:
        at = raw.index(b"\x00") + 1
        raise DataError(
            f"{path}:{lineno}: a NUL byte at byte {at} of the line: a binary file, not JSON lines"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at byte {e.start + 1} of the line); explain "
            "reads UTF-8 and does not guess an encoding (a replaced character would change the tokens scored): "
            "convert the file, e.g. iconv -f latin1 -t utf-8"
        ) from None


def read_lines(path: Path) -> list[tuple[int, Any]]:
    """(line number, parsed JSON value) of every non-blank line of a JSONL file (errors name file:line)."""
    lines = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            line = _decoded(raw, path, lineno)
            if not line.strip():
                continue
            try:
                lines.append((lineno, parse_json_line(line)))
            except json.JSONDecodeError as e:
                raise DataError(json_line_error(path, lineno, line.rstrip("\r\n"), e)) from None
            except RecursionError:
                raise DataError(
                    f"{path}:{lineno}: JSON nested too deeply to read; a group is one flat object"
                ) from None
            except ValueError as e:  # e.g. an integer of more than 4300 digits
                why = (str(e).splitlines() or [""])[0].split(";")[0][:160]
                raise DataError(f"{path}:{lineno}: unreadable JSON line ({why})") from None
    return lines


def read_groups(path: Path) -> list[GroupInput]:
    """Every group of a JSONL file in our rollouts format, in order; group ids must be unique (errors name
    file:line)."""
    return groups_of_lines(read_lines(path), path)


def saved_steps(run_dir: str | Path) -> list[int]:
    """The steps with saved rollouts in RUN_DIR/rollouts, ascending."""
    return RunDir(run_dir).rollout_steps()


def load_run_rollouts(
    run_dir: str | Path, step: int | None = None, skipped: list[str] | None = None
) -> tuple[int, list[GroupInput]]:
    """(step, groups) from a run's saved rollouts (the latest saved step by default). With `skipped` a
    list, damaged lines and groups are left out and said there (see the module docstring)."""
    run = RunDir(run_dir)
    if not run.path.is_dir():
        raise ConfigError(f"run directory not found: {run.path}")
    steps = run.rollout_steps()
    if not steps:
        raise ConfigError(
            f"{run.path}: no saved rollouts (rollouts/step_NNNNNN.jsonl); the trainer writes them at evaluation steps "
            "when eval.save_groups > 0"
        )
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise ConfigError(
            f"{run.path}: no rollouts saved at step {step}; saved steps: {', '.join(map(str, steps))}"
        )
    before = len(skipped) if skipped is not None else 0
    try:
        lines = run.read_rollouts(step, skipped)
    except ConfigError as e:
        raise DataError(str(e)) from None
    damaged = len(skipped) - before if skipped is not None else 0
    return step, groups_of_lines(lines, run.rollout_path(step), skipped, run_schema=True, damaged=damaged)


def check_token_ids(groups: Iterable[GroupInput], vocab_size: int, model: str) -> None:
    """DataError naming file:line, the completion and the id of the first token id outside [0, vocab_size):
    the rollouts were sampled with another model's tokenizer, or the file is damaged."""
    for g in groups:
        for j, x in enumerate(g.prompt_token_ids or ()):
            if x >= vocab_size:
                raise data_error(
                    g.where,
                    f"the prompt's token id {short(x)} (token {j}) is outside the vocabulary of {model} (ids 0 to "
                    f"{vocab_size - 1}): was this sampled with another model? (--model)",
                )
        for i, c in enumerate(g.completions):
            for j, x in enumerate(c.token_ids or ()):
                if x >= vocab_size:
                    raise data_error(
                        g.where,
                        f"completions[{i}].token_ids[{j}] = {short(x)} is outside the vocabulary of {model} "
                        f"(ids 0 to {vocab_size - 1}): were these rollouts sampled with another model? (--model)",
                    )


def cut_completion(c: CompletionInput, n: int) -> int:
    """Keep the first `n` tokens of `c` (its token ids and every per-token list), marked truncated, as a
    response that reached a length limit; returns how many tokens it had."""
    assert c.token_ids is not None
    had = len(c.token_ids)
    if had > n:
        c.full_length = c.full_length or had
        c.token_ids = c.token_ids[:n]
        for name in _PER_TOKEN:
            values = getattr(c, name)
            if values is not None:
                setattr(c, name, values[:n])
        c.truncated = True
    return had

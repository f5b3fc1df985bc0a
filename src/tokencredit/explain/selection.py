"""Which groups an explain page shows: by kind (`--select`), by index (`--group-index`), how many (`--groups`).

A completion counts as right when its saved `correct` says so (a run directory), else when its reward
is > 0. A group is "mixed" (right and wrong completions: with 0/1 rewards, the groups whose advantage
is not 0, i.e. that carry a learning signal), "all-right" or "all-wrong"; "any" takes every group.
Indices are 0-based positions among the input's groups (file order), shown in each group's header.
Credit is still computed on every group as one batch: the selection only chooses what is shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokencredit.errors import ConfigError, closest
from tokencredit.explain.inputs import CompletionInput, GroupInput

__all__ = [
    "DEFAULT_COUNT",
    "GROUP_KINDS",
    "Selection",
    "check_kind",
    "group_kind",
    "parse_indices",
    "select_groups",
]

GROUP_KINDS: dict[str, str] = {
    "any": "every group",
    "mixed": "groups with both right and wrong completions",
    "all-wrong": "groups whose every completion is wrong",
    "all-right": "groups whose every completion is right",
}
DEFAULT_COUNT = 4  # groups shown when neither --groups nor --group-index says


def _right(c: CompletionInput) -> bool:
    return c.correct if c.correct is not None else c.score > 0


def group_kind(group: GroupInput) -> str:
    """The group's kind: all-right, all-wrong or mixed (see the module docstring)."""
    right = [_right(c) for c in group.completions]
    if all(right):
        return "all-right"
    return "mixed" if any(right) else "all-wrong"


def check_kind(kind: str) -> None:
    """ConfigError naming the closest kind when `kind` is not one of `GROUP_KINDS`."""
    if kind not in GROUP_KINDS:
        raise ConfigError(
            f"--select: unknown kind {kind!r}{closest(kind, GROUP_KINDS)}; one of {', '.join(GROUP_KINDS)}"
        )


def parse_indices(spec: str | Sequence[int]) -> list[int]:
    """'3,7,12' (or a sequence of ints) -> [3, 7, 12], repeats dropped; ConfigError naming --group-index otherwise."""
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[int] = []
    for p in parts:
        text = p.strip() if isinstance(p, str) else p
        try:
            i = int(text)
        except (TypeError, ValueError):
            raise ConfigError(
                f"--group-index: {text!r} is not a group index; give 0-based indices such as 3,7,12"
            ) from None
        if i < 0:
            raise ConfigError(f"--group-index: {i} is negative; indices are 0-based positions such as 3,7,12")
        if i not in out:
            out.append(i)
    if not out:
        raise ConfigError("--group-index: no index given; give 0-based indices such as 3,7,12")
    return out


@dataclass(frozen=True)
class Selection:
    groups: list[GroupInput]  # the groups shown, in the order shown
    description: str  # what was chosen and out of what (a note on the page)


def _by_index(groups: Sequence[GroupInput], indices: Sequence[int]) -> Selection:
    n = len(groups)
    for i in indices:
        if i >= n:
            raise ConfigError(f"--group-index {i}: out of range; there are {n} groups (indices 0 to {n - 1})")
    return Selection(
        [groups[i] for i in indices], f"those at indices {', '.join(map(str, indices))} (--group-index)"
    )


def select_groups(
    groups: Sequence[GroupInput],
    *,
    kind: str = "any",
    indices: Sequence[int] | None = None,
    count: int | None = None,
) -> Selection:
    """The groups to show: those at `indices`, or the first `count` (default `DEFAULT_COUNT`) of `kind`.
    ConfigError for an unknown kind, an index out of range, or a kind no group has (the counts of each kind)."""
    if indices is not None:
        return _by_index(groups, indices)
    check_kind(kind)
    count = DEFAULT_COUNT if count is None else count
    if kind == "any":
        return Selection(list(groups[:count]), f"the first {min(count, len(groups))} of {len(groups)} groups")
    kinds = [group_kind(g) for g in groups]
    matching = [g for g, k in zip(groups, kinds) if k == kind]
    if not matching:
        counts = ", ".join(f"{k} {kinds.count(k)}" for k in GROUP_KINDS if k != "any")
        raise ConfigError(f"--select {kind}: none of the {len(groups)} groups is {kind} ({counts})")
    shown = matching[:count]
    return Selection(
        shown,
        f"the first {len(shown)} of the {len(matching)} {kind} groups of {len(groups)} (--select {kind})",
    )

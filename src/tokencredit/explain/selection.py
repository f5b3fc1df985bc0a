"""Which groups an explain page shows: by kind (`--select`), by index (`--group-index`), how many (`--groups`).

By default ("credit") the groups where some shown method's credit is non-zero, those whose rewards differ
first, each part in file order: a real run's first groups are often all wrong, and a page (or `--png`
picture) of zero credit shows nothing. Which groups carry credit is known only once it is computed:
`select_groups` orders the candidates (what is checked before the model loads: the page's size, the
saved Â) and `credited_selection` makes the choice from the computed credit (`compute.credited_groups`);
when no group carries any, the first groups are shown and the description says so.

A completion counts as right when its saved `correct` says so (a run directory), else when its reward
is > 0. A group is "mixed" (right and wrong completions: with 0/1 rewards, the groups whose advantage
is not 0, i.e. that carry a learning signal), "all-right" or "all-wrong"; "any" takes every group.
Indices are 0-based positions among the input's groups (file order), shown in each group's header.
Credit is still computed on every group as one batch: the selection only chooses what is shown.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass

from tokencredit.errors import ConfigError, closest
from tokencredit.explain.inputs import CompletionInput, GroupInput

__all__ = [
    "DEFAULT_COUNT",
    "DEFAULT_KIND",
    "GROUP_KINDS",
    "Selection",
    "check_kind",
    "credited_selection",
    "group_kind",
    "parse_indices",
    "select_groups",
]

GROUP_KINDS: dict[str, str] = {
    "credit": "groups where some method's credit is non-zero, those whose rewards differ first (the default)",
    "any": "every group, in file order",
    "mixed": "groups with both right and wrong completions",
    "all-wrong": "groups whose every completion is wrong",
    "all-right": "groups whose every completion is right",
}
DEFAULT_COUNT = 4  # groups shown when neither --groups nor --group-index says
DEFAULT_KIND = "credit"  # what explain shows when neither --select nor --group-index says


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


def rewards_differ(group: GroupInput) -> bool:
    """Whether the group's completions do not all have the same reward (a group baseline gives them credit)."""
    return len({c.score for c in group.completions}) > 1


@dataclass(frozen=True)
class Selection:
    groups: list[GroupInput]  # the groups shown, in the order shown
    description: str  # what was chosen and out of what (a note on the page)
    # the choice waits for the computed credit (`credited_selection`); `groups` are then the first candidates
    by_credit: bool = False


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
    """The groups to show: those at `indices`, or the first `count` (default `DEFAULT_COUNT`) of `kind`; for
    "credit" the first `count` candidates, those whose rewards differ first, with `by_credit` set (the choice is
    `credited_selection`'s). ConfigError for an unknown kind, an index out of range, or a kind no group has
    (the counts of each kind)."""
    if indices is not None:
        return _by_index(groups, indices)
    check_kind(kind)
    count = DEFAULT_COUNT if count is None else count
    if kind == DEFAULT_KIND:
        order = [g for g in groups if rewards_differ(g)] + [g for g in groups if not rewards_differ(g)]
        return Selection(order[:count], "chosen once the credit is computed", by_credit=True)
    if kind == "any":
        return Selection(list(groups[:count]), f"the first {min(count, len(groups))} of {len(groups)} groups")
    kinds = [group_kind(g) for g in groups]
    matching = [g for g, k in zip(groups, kinds) if k == kind]
    if not matching:
        counts = ", ".join(f"{k} {kinds.count(k)}" for k in GROUP_KINDS if k not in ("any", DEFAULT_KIND))
        raise ConfigError(f"--select {kind}: none of the {len(groups)} groups is {kind} ({counts})")
    shown = matching[:count]
    return Selection(
        shown,
        f"the first {len(shown)} of the {len(matching)} {kind} groups of {len(groups)} (--select {kind})",
    )


def credited_selection(
    groups: Sequence[GroupInput], credited: Set[int], count: int | None = None
) -> Selection:
    """The default choice: the first `count` groups whose id is in `credited` (some method's credit is non-zero
    on one of its tokens), those whose rewards differ first; the first `count` groups when none is credited."""
    count = DEFAULT_COUNT if count is None else count
    differ = [g for g in groups if rewards_differ(g) and g.group_id in credited]
    rest = [g for g in groups if not rewards_differ(g) and g.group_id in credited]
    shown = (differ + rest)[:count]
    if not shown:
        shown = list(groups[:count])
        return Selection(
            shown,
            f"the first {len(shown)} of {len(groups)} groups: no method gives any group non-zero credit (every "
            "group's rewards are equal?); --select and --group-index choose others",
        )
    n = len(differ) + len(rest)
    return Selection(
        shown,
        f"the first {len(shown)} of the {n} groups of {len(groups)} where some method's credit is non-zero "
        f"({len(differ)} of them with rewards that differ, shown first; --select any shows the first groups)",
    )

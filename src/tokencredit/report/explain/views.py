"""What the explain page shows, as plain data: `compute` fills it from a batch, `render` draws it."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["GroupView", "MethodView", "ReportData", "ResponseView"]


@dataclass
class ResponseView:
    """One completion: its batch row, display tokens and per-token signals (None when unavailable)."""

    row: int
    tokens: list[str]
    reward: float
    advantage: float
    correct: bool | None = None
    truncated: bool = False
    entropy: list[float] | None = None
    prob: list[float] | None = None
    special: list[bool] | None = None  # True for special tokens (EOS...), drawn muted


@dataclass
class GroupView:
    group_id: int
    problem: str
    responses: list[ResponseView]
    answer: str | None = None


@dataclass
class MethodView:
    """One column. credit[row] is the per-token credit shown for batch row `row` (None when skipped)."""

    name: str
    label: str
    description: str = ""
    credit: dict[int, list[float]] | None = None
    seq_advantages: dict[int, float] | None = None
    row_gini: dict[int, float | None] = field(default_factory=dict)
    diagnostics: dict[str, float | None] = field(default_factory=dict)
    scale: float = 1.0
    note: str = ""

    @property
    def skipped(self) -> bool:
        return self.credit is None


@dataclass
class ReportData:
    title: str
    groups: list[GroupView]
    methods: list[MethodView]
    correlations: dict[tuple[str, str], tuple[float | None, int]] = field(default_factory=dict)
    subtitle: str = ""
    notes: list[str] = field(default_factory=list)

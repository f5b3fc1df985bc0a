"""What the explain page shows, as plain data: `compute` fills it from a batch, `render` draws it."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["GroupView", "MethodView", "ReportData", "ResponseView", "StepCheck"]


@dataclass(frozen=True)
class StepCheck:
    """What the task's checker says of one response, where it knows the task (`marks`).

    kind: `tokencredit.data.synthetic.locate_first_error`'s (correct, wrong-step, wrong-final,
    malformed); right_answer: its outcome check (`synthetic.check`); first_wrong: index into the
    response's tokens of its first wrong token (None when correct, or when the error lies past the last
    token); line: 0-based line of the first error; expected: the reference line there (None past it).
    """

    kind: str
    right_answer: bool
    first_wrong: int | None = None
    line: int | None = None
    expected: str | None = None

    @property
    def right_answer_wrong_step(self) -> bool:
        """The boxed answer is right but a step line departs from the reference chain (`48 + 7 = 05`)."""
        return self.right_answer and self.kind == "wrong-step"


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
    byte_marks: list[bool] | None = None  # True where the token's text holds <0xNN> byte marks (`tokens`)
    check: StepCheck | None = None  # None: the task's checker does not know this task


@dataclass
class GroupView:
    group_id: int
    problem: str
    responses: list[ResponseView]
    answer: str | None = None
    index: int | None = None  # 0-based position among the input's groups (what --group-index picks)


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

"""The task checker's marks on an explain page: each shown response's first wrong token, and whether its
answer is right though a step is wrong, where the task's checker knows them.

Only the embedded synthetic task (`tokencredit.data.synthetic`, the data of toy and toy-hard) has a
checker that reads each step. For a group whose problem is of its form ("Compute 47 + 38 - 19."), the
probe's ground truth (`tokencredit.probe.truth.rollout_truth`) gives the first wrong token: the
token holding the first character where the response departs from the reference solution (EOS when it
stopped early).

A step is wrong when a step line ``a op b = c`` departs from the task's left-to-right reference chain:
a wrong operand, operator or result (`synthetic.locate_first_error`'s "wrong-step", judged at the first
departure, so a reordered but valid chain counts too). A response whose boxed answer is right
(`synthetic.check`, the task's reward) and whose first error is such a step is flagged: e.g.
``48 + 7 = 05`` then ``55 - 3 = 52`` and the answer 52. Other data, a group given only a literal prompt,
or no tokenizer: nothing is marked, and one note says why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tokencredit.batch import RolloutBatch
from tokencredit.data.synthetic import parse_problem, reference_solution
from tokencredit.explain.views import GroupView, StepCheck
from tokencredit.probe.truth import rollout_truth

__all__ = ["is_task_problem", "mark_groups", "step_check"]


def is_task_problem(problem: str | None) -> bool:
    """Whether the synthetic task's checker reads `problem` ("Compute a + b - c.")."""
    if problem is None:
        return False
    try:
        parse_problem(problem)
    except ValueError:
        return False
    return True


def step_check(problem: str, token_ids: Sequence[int], tokenizer: Any) -> StepCheck:
    """The checker's view of one response (its valid token ids) to a synthetic-task `problem`."""
    truth = rollout_truth(problem, token_ids, tokenizer)
    reference = reference_solution(problem).split("\n")
    line = truth.step
    return StepCheck(
        kind=truth.kind,
        right_answer=truth.correct,
        # for a correct response the truth's target is its first answer token, not a wrong one
        first_wrong=None if truth.kind == "correct" else truth.target,
        line=line,
        expected=reference[line] if line is not None and line < len(reference) else None,
    )


def mark_groups(
    groups: Sequence[GroupView], problems: Mapping[int, str | None], batch: RolloutBatch, tokenizer: Any
) -> str | None:
    """Set `check` on the responses of every shown group whose problem (`problems` by group id) the task's
    checker reads; returns the note saying where nothing is marked and why (None when all are marked)."""
    known = [g for g in groups if is_task_problem(problems.get(g.group_id))]
    if not known:
        return (
            "no first wrong token or wrong step marked: the task's checker knows them only on the embedded "
            "synthetic task (toy, toy-hard: 'Compute a + b - c.' problems), not on these groups"
        )
    if tokenizer is None:
        return "no first wrong token or wrong step marked: no tokenizer to map the checker's characters to tokens"
    mask = batch.mask.cpu()
    ids = batch.token_ids.cpu()
    for g in known:
        problem = problems[g.group_id]
        for r in g.responses:
            r.check = step_check(problem, ids[r.row][mask[r.row]].tolist(), tokenizer)  # type: ignore[arg-type]
    if len(known) == len(groups):
        return None
    return (
        f"first wrong token and wrong steps marked in {len(known)} of the {len(groups)} shown groups: the task's "
        "checker knows them only on the embedded synthetic task (toy, toy-hard: 'Compute a + b - c.' problems)"
    )

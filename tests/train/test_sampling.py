"""`collect` counts the verifier's timeouts of every round of a step, dropped groups included."""

import torch

from tokencredit.train.sampling import StepRollouts, collect


def _round(scores: list[list[float]], timed_out: list[list[bool]], offset: int) -> StepRollouts:
    """One round of len(scores) groups; row i of group g has score scores[g][i]."""
    n = sum(len(g) for g in scores)
    flat_to = [t for g in timed_out for t in g]
    return StepRollouts(
        problems=[None] * n,
        prompt_ids=torch.ones(n, 2, dtype=torch.long),
        prompt_mask=torch.ones(n, 2, dtype=torch.bool),
        response_ids=torch.ones(n, 3, dtype=torch.long),
        response_mask=torch.ones(n, 3, dtype=torch.bool),
        truncated=torch.zeros(n, dtype=torch.bool),
        texts=[""] * n,
        group_ids=torch.tensor([offset + g for g, grp in enumerate(scores) for _ in grp]),
        scores=torch.tensor([s for g in scores for s in g]),
        correct=torch.tensor([s > 0 for g in scores for s in g]),
        timed_out=torch.tensor(flat_to),
        verify_timeouts=sum(flat_to),
    )


def test_collect_counts_timeouts_of_every_round():
    rounds = [
        _round([[0.0, 0.0], [0.0, 1.0]], [[True, True], [False, False]], 0),  # group 0 dropped: 2 timeouts
        _round([[1.0, 0.0], [1.0, 1.0]], [[False, True], [False, False]], 2),  # group 2 kept: 1 timeout
    ]
    ro = collect(lambda r: rounds[r], groups=2, dynamic=True, max_rounds=3, pad_id=0)
    assert ro.group_ids.tolist() == [1, 1, 2, 2] and ro.rounds == 2
    assert ro.verify_timeouts == 3  # every round's, the dropped group's included
    assert ro.timed_out.tolist() == [False, False, False, True]  # per kept row
    assert collect(lambda r: rounds[r], groups=2, dynamic=False, max_rounds=3, pad_id=0).verify_timeouts == 2

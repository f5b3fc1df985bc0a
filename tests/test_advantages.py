import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokencredit import advantages
from tokencredit.batch import BatchValidationError
from tokencredit.errors import ConfigError


def _t(x):
    return torch.tensor(x, dtype=torch.float32)


def test_spec_vectors_one_group():
    s, g = _t([1, 0, 0, 1]), torch.zeros(4, dtype=torch.long)
    torch.testing.assert_close(
        advantages.grpo(s, g), _t([0.866025, -0.866025, -0.866025, 0.866025]), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(advantages.grpo(s, g, scale="none"), _t([0.5, -0.5, -0.5, 0.5]))
    torch.testing.assert_close(advantages.dr_grpo(s, g), _t([0.5, -0.5, -0.5, 0.5]))
    torch.testing.assert_close(advantages.rloo(s, g), _t([2 / 3, -2 / 3, -2 / 3, 2 / 3]), atol=1e-6, rtol=0)


def test_eps_is_used():
    s, g = _t([1, 0, 0, 1]), torch.zeros(4, dtype=torch.long)
    a = advantages.grpo(s, g, eps=1e-4)
    assert abs(a[0].item() - 0.5 / (0.5773503 + 1e-4)) < 1e-5


def test_several_groups_vectorised_and_unsorted_ids():
    s = _t([1, 0, 5, 1, 0, 7, 7])
    g = torch.tensor([3, 3, 9, 3, 3, 9, 11])
    a = advantages.grpo(s, g)
    torch.testing.assert_close(
        a[[0, 1, 3, 4]], _t([0.866025, -0.866025, 0.866025, -0.866025]), atol=1e-5, rtol=0
    )
    assert a[2] < 0 and a[5] > 0
    assert a[6] == 0  # singleton group


def test_singleton_and_zero_variance_groups_are_zero():
    s = _t([1, 1, 1, 0.3])
    g = torch.tensor([0, 0, 0, 1])
    for fn in (advantages.grpo, advantages.rloo, advantages.dr_grpo):
        assert torch.equal(fn(s, g), torch.zeros(4))


def test_batch_scale_uses_batch_std():
    s, g = _t([1, 0, 0, 1, 2, 2]), torch.tensor([0, 0, 0, 0, 1, 1])
    a = advantages.grpo(s, g, scale="batch")
    std = s.double().std().item()
    assert abs(a[0].item() - 0.5 / (std + 1e-6)) < 1e-5
    assert a[4] == 0 and a[5] == 0


def test_nonfinite_score_names_rollout():
    with pytest.raises(BatchValidationError, match="rollout 2"):
        advantages.grpo(_t([1, 0, float("nan"), 1]), torch.zeros(4, dtype=torch.long))
    with pytest.raises(BatchValidationError, match="rollout 0"):
        advantages.rloo(_t([float("inf"), 0]), torch.zeros(2, dtype=torch.long))


def test_bad_inputs():
    with pytest.raises(ConfigError):
        advantages.grpo(_t([1, 0]), torch.zeros(2, dtype=torch.long), scale="sd")
    with pytest.raises(BatchValidationError, match="shape"):
        advantages.grpo(_t([1, 0]), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ConfigError, match="closest: rloo"):
        advantages.compute("rlo", _t([1, 0]), torch.zeros(2, dtype=torch.long))


groups = st.lists(
    st.lists(st.floats(-3, 3, allow_nan=False, width=32), min_size=1, max_size=6), min_size=1, max_size=5
)


@settings(max_examples=60, deadline=None)
@given(groups, st.randoms(use_true_random=False), st.sampled_from(["grpo", "rloo", "dr-grpo", "grpo-batch"]))
def test_permuting_rollouts_within_group_permutes_advantages(gs, rnd, est):
    scores = torch.tensor([x for grp in gs for x in grp], dtype=torch.float32)
    gids = torch.tensor([i for i, grp in enumerate(gs) for _ in grp])
    perm = list(range(len(scores)))
    # shuffle inside each group only (and also shuffle group order in the batch)
    start = 0
    blocks = []
    for grp in gs:
        idx = perm[start : start + len(grp)]
        rnd.shuffle(idx)
        blocks.append(idx)
        start += len(grp)
    rnd.shuffle(blocks)
    p = torch.tensor([i for b in blocks for i in b])
    a = advantages.compute(est, scores, gids)
    ap = advantages.compute(est, scores[p], gids[p])
    torch.testing.assert_close(ap, a[p], atol=1e-5, rtol=1e-5)
    assert torch.isfinite(a).all()


@settings(max_examples=40, deadline=None)
@given(groups)
def test_grpo_matches_plain_per_group_loop(gs):
    scores = torch.tensor([x for grp in gs for x in grp], dtype=torch.float32)
    gids = torch.tensor([i for i, grp in enumerate(gs) for _ in grp])
    want = []
    for grp in gs:
        t = torch.tensor(grp, dtype=torch.float64)
        if len(grp) == 1 or t.std() == 0:
            want += [0.0] * len(grp)
        else:
            want += ((t - t.mean()) / (t.std() + 1e-6)).tolist()
    torch.testing.assert_close(
        advantages.grpo(scores, gids), torch.tensor(want, dtype=torch.float32), atol=1e-4, rtol=1e-4
    )

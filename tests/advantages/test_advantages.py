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


# ---------------------------------------------------------------------------------------------- batch estimators
def _batch(scores, groups, lengths, t=6, **fields):
    from tokencredit.batch import RolloutBatch

    mask = torch.arange(t)[None] < torch.tensor(lengths)[:, None]
    n = len(scores)
    lp = -torch.rand(n, t, generator=torch.Generator().manual_seed(0)) * mask
    sq = (lp.exp() ** 2) * mask
    return RolloutBatch(
        torch.zeros(n, t, dtype=torch.long),
        mask,
        torch.tensor(groups),
        _t(scores),
        old_log_probs=lp,
        sum_sq_probs=sq,
        **fields,
    )


def test_estimate_shapes_and_score_only_estimators_agree_with_compute():
    b = _batch([1, 0, 0, 1], [0, 0, 0, 0], [6, 3, 0, 1])
    for name in ("grpo", "dr-grpo", "rloo", "grpo-batch"):
        assert torch.equal(advantages.estimate(name, b), advantages.compute(name, b.scores, b.group_ids))
    for name in ("reinforce++", "otb"):
        a = advantages.estimate(name, b)
        assert a.shape == b.mask.shape and bool((a[~b.mask] == 0).all()) and a.dtype == torch.float32
    for name in ("reinforce++-baseline", "opo", "gpg", "grpo-passk"):
        assert advantages.estimate(name, b).shape == (4,)


def test_compute_refuses_estimators_that_read_the_batch():
    with pytest.raises(ConfigError, match="estimate"):
        advantages.compute("otb", _t([1, 0]), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ConfigError, match="closest: otb"):
        advantages.estimate("obt", _batch([1, 0], [0, 0], [2, 2]))


def test_remax_needs_the_greedy_baseline_and_subtracts_it():
    b = _batch([1, 0, 1], [0, 0, 1], [3, 2, 1])
    with pytest.raises(ConfigError, match="baseline_scores.*greedy"):
        advantages.estimate("remax", b)
    b = _batch([1, 0, 1], [0, 0, 1], [3, 2, 1], baseline_scores=_t([1, 1, 0]))
    torch.testing.assert_close(advantages.estimate("remax", b), _t([0, -1, 1]))
    with pytest.raises(BatchValidationError, match="baseline_scores.*rollout 1"):
        _batch([1, 0], [0, 0], [1, 1], baseline_scores=_t([0, float("nan")]))


def test_opo_uses_the_length_weighted_mean():
    b = _batch([1, 0, 0, 1], [0, 0, 1, 1], [3, 1, 0, 0])
    # group 0: b = (3 * 1 + 1 * 0) / 4 = 0.75; group 1: both empty -> plain mean 0.5
    torch.testing.assert_close(advantages.estimate("opo", b), _t([0.25, -0.75, -0.5, 0.5]))


def test_gpg_rescales_by_the_share_of_nonzero_rewards():
    b = _batch([1, 0, 0, 0], [0, 0, 1, 1], [1, 1, 1, 1])
    torch.testing.assert_close(advantages.estimate("gpg", b), _t([2.0, -2.0, 0, 0]))  # N / M = 4 / 1
    torch.testing.assert_close(advantages.estimate("gpg", b, f_norm=4.0), _t([0.5, -0.5, 0, 0]))


def test_grpo_passk_rewards_only_the_best_and_needs_pairs():
    b = _batch([0, 1, 0.5, 1, 1], [0, 0, 0, 1, 1], [1, 1, 1, 1, 1])
    a = advantages.estimate("grpo-passk", b, norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(a, _t([0, 0.5, 0, 0, 0]))  # a tie (group 1) gives 0
    with pytest.raises(BatchValidationError, match="at least 2"):
        advantages.estimate("grpo-passk", _batch([1, 0, 1], [0, 0, 1], [1, 1, 1]))


def test_reinforce_pp_discounts_by_valid_tokens_after_t():
    b = _batch([1, 1], [0, 1], [3, 0])
    got = advantages.estimate("reinforce++", b, gamma=0.5)
    raw = torch.tensor([0.25, 0.5, 1.0])
    want = (raw - raw.mean()) / torch.sqrt(raw.var() + 1e-8)
    torch.testing.assert_close(got[0, :3], want.float(), atol=1e-6, rtol=0)
    assert torch.equal(
        advantages.estimate("reinforce++", _batch([1], [0], [1])), torch.zeros(1, 6)
    )  # 1 token


def test_otb_needs_its_signals_and_singletons_get_zero():
    from tokencredit.batch import RolloutBatch

    bare = RolloutBatch(
        torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3), torch.tensor([0, 0]), _t([1, 0])
    )
    with pytest.raises(BatchValidationError, match="sum_sq_probs"):
        advantages.estimate("otb", bare)
    b = _batch([1, 0, 1], [0, 0, 1], [3, 2, 2])
    assert torch.equal(advantages.estimate("otb", b)[2], torch.zeros(6))


def test_bad_estimator_parameters():
    b = _batch([1, 0], [0, 0], [2, 2])
    with pytest.raises(ConfigError, match="gamma"):
        advantages.estimate("reinforce++", b, gamma=1.5)
    with pytest.raises(ConfigError, match="f_norm"):
        advantages.estimate("gpg", b, f_norm=0.0)
    with pytest.raises(ConfigError, match="closest: handle_zero_tail"):
        advantages.estimate("otb", b, handle_zero_tails=False)

"""Monte-Carlo token advantages (`tokencredit.oracle`).

A hand-made policy with known branching probabilities (`TreePolicy`: tokens a / b / EOS, the
probabilities a fixed function of the prefix) gives the exact values V(s) by enumeration, so the
estimator can be checked against the analytic A* within its standard error, and the delta bound
against the exact |A*|. The Hugging Face path is checked on a tiny random Qwen3 against values
computed from its logits, and on the shipped warm start against the checker's first wrong token.
"""

from __future__ import annotations

import functools
import hashlib
import math

import pytest
import torch

from tokencredit import oracle
from tokencredit.oracle import (
    ModelSampler,
    OracleCredit,
    SampledRewards,
    advantages_from_values,
    average_ranks,
    line_break_boundaries,
    mc_value,
    skip_positions,
    spearman,
    step_advantages,
    step_ids_from_boundaries,
    token_advantages,
    value_states,
)

A, B, EOS = 0, 1, 2


class TreePolicy:
    """Tokens a (0), b (1), EOS (2); at most `max_len` tokens (EOS included; a row that reaches the
    limit stops). pi(. | prefix) is a fixed pseudo-random distribution per prefix, with some prefixes
    made nearly deterministic (the delta skip's case) or exactly deterministic. The reward of a
    finished sequence is in [0, 1]: the share of a's among its non-EOS tokens, squared."""

    def __init__(self, max_len: int = 5, seed: int = 0) -> None:
        self.max_len, self.seed = max_len, seed

    @functools.cache  # noqa: B019 (the test policy lives for the whole module)
    def probs(self, prefix: tuple[int, ...]) -> tuple[float, float, float]:
        h = hashlib.sha256(f"{self.seed}|{prefix}".encode()).digest()
        u = [x / 255 for x in h[:4]]
        kind = h[4] % 4
        if kind == 0:  # near-deterministic: the delta rule should skip these
            top = 1.0 - 10 ** (-2 - 2 * u[3])
            rest = (1 - top) / 2
            p = [rest, rest, rest]
            p[h[5] % 2] = top
            return tuple(p)  # type: ignore[return-value]
        if kind == 1 and len(prefix) > 0:  # exactly deterministic
            return (1.0, 0.0, 0.0) if h[5] % 2 else (0.0, 1.0, 0.0)
        w = [0.2 + u[0], 0.2 + u[1], 0.05 + 0.3 * u[2] * (len(prefix) > 0)]
        s = sum(w)
        return (w[0] / s, w[1] / s, w[2] / s)

    def reward(self, seq: tuple[int, ...]) -> float:
        body = [x for x in seq if x != EOS]
        return (sum(x == A for x in body) / len(body)) ** 2 if body else 0.0

    def done(self, seq: tuple[int, ...]) -> bool:
        return (len(seq) > 0 and seq[-1] == EOS) or len(seq) >= self.max_len

    @functools.cache  # noqa: B019
    def value(self, prefix: tuple[int, ...]) -> float:
        if self.done(prefix):
            return self.reward(prefix)
        return sum(p * self.value(prefix + (y,)) for y, p in enumerate(self.probs(prefix)) if p > 0)

    def sample(self, prefix: tuple[int, ...], g: torch.Generator) -> tuple[int, ...]:
        seq = prefix
        while not self.done(seq):
            p = torch.tensor(self.probs(seq), dtype=torch.float64)
            seq = seq + (int(torch.multinomial(p, 1, generator=g)),)
        return seq


class ExactSampler:
    """K copies of each state's exact value (mean = V, standard error 0): isolates the bookkeeping."""

    def __init__(self, policy: TreePolicy, seqs: list[tuple[int, ...]]) -> None:
        self.policy, self.seqs = policy, seqs

    def __call__(self, rows, cuts, k, seed):
        v = [self.policy.value(self.seqs[r][:c]) for r, c in zip(rows.tolist(), cuts.tolist())]
        return SampledRewards(torch.tensor(v, dtype=torch.float64)[:, None].expand(-1, k), len(v), 0)


class TreeSampler:
    """`ContinuationSampler` over the rollouts `seqs` of a `TreePolicy`."""

    def __init__(self, policy: TreePolicy, seqs: list[tuple[int, ...]]) -> None:
        self.policy, self.seqs, self.calls = policy, seqs, 0

    def __call__(self, rows, cuts, k, seed):
        self.calls += 1
        g = torch.Generator().manual_seed(seed)
        out = torch.tensor(
            [
                [self.policy.reward(self.policy.sample(self.seqs[r][:c], g)) for _ in range(k)]
                for r, c in zip(rows.tolist(), cuts.tolist())
            ],
            dtype=torch.float64,
        )
        return SampledRewards(out, states=len(rows), generated_tokens=0)


def tree_batch(policy: TreePolicy, n: int, seed: int = 0):
    """(seqs, mask [N,T], log_probs [N,T], rewards [N], exact A* [N,T]) of n sampled rollouts, right-padded."""
    g = torch.Generator().manual_seed(seed)
    seqs = [policy.sample((), g) for _ in range(n)]
    t = max(len(s) for s in seqs)
    mask = torch.zeros(n, t, dtype=torch.bool)
    lp = torch.full((n, t), 123.0)  # padding must not matter
    exact = torch.zeros(n, t, dtype=torch.float64)
    for i, s in enumerate(seqs):
        mask[i, : len(s)] = True
        for j, y in enumerate(s):
            lp[i, j] = math.log(policy.probs(s[:j])[y])
            exact[i, j] = policy.value(s[: j + 1]) - policy.value(s[:j])
    rewards = torch.tensor([policy.reward(s) for s in seqs])
    return seqs, mask, lp, rewards, exact


@pytest.fixture(scope="module")
def tree():
    policy = TreePolicy(max_len=5, seed=3)
    return policy, *tree_batch(policy, 24, seed=1)


# ============================================================================ pure functions
def test_mc_value_mean_and_standard_error():
    r = torch.tensor([[0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    mean, se = mc_value(r)
    torch.testing.assert_close(mean, torch.tensor([0.5, 1.0], dtype=torch.float64))
    torch.testing.assert_close(se, torch.tensor([math.sqrt(1 / 3) / 2, 0.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="K >= 2"):
        mc_value(torch.ones(3, 1))


def test_skip_positions_are_exactly_those_with_p_at_least_1_minus_delta():
    p = torch.tensor([[0.999, 0.9989, 1.0, 0.5], [0.99901, 0.2, 0.9, 0.9]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    skip = skip_positions(p.log(), mask, 1e-3)
    assert skip.tolist() == [[True, False, True, False], [True, False, False, False]]
    # delta = 0 skips only probability-1 tokens (A* = 0 there exactly)
    assert skip_positions(p.log(), mask, 0.0).tolist() == [[False, False, True, False], [False] * 4]
    with pytest.raises(ValueError, match="delta"):
        skip_positions(p.log(), mask, 1.0)
    bad = p.log().clone()
    bad[1, 1] = float("nan")
    with pytest.raises(ValueError, match="rollout 1, token 1"):
        skip_positions(bad, mask, 1e-3)


def test_value_states_share_neighbours_and_never_sample_the_final_state():
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    skip = torch.tensor([[True, False, True, False], [True, True, False, False]])
    need = value_states(mask, skip)
    # row 0: position 1 needs states 1 and 2; position 3 needs state 3 (state 4 is the reward)
    assert need.tolist() == [[False, True, True, True, False], [False] * 5]


def test_advantages_from_values_is_the_value_difference_with_independent_errors():
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    skip = torch.tensor([[False, True, False, False]])
    values = torch.tensor([[0.5, 0.25, 0.75, 1.0, 0.0]])
    se = torch.tensor([[0.1, 0.2, 0.3, 0.0, 0.0]])
    adv, err = advantages_from_values(values, se, mask, skip)
    torch.testing.assert_close(adv, torch.tensor([[-0.25, 0.0, 0.25, 0.0]]))
    torch.testing.assert_close(err, torch.tensor([[math.sqrt(0.05), 0.0, 0.3, 0.0]]))


def test_step_ids_from_boundaries():
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    b = torch.tensor([[0, 1, 0, 1, 0, 1], [1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    assert step_ids_from_boundaries(mask, b).tolist() == [[0, 0, 1, 1, 2, -1], [0, 1, -1, -1, -1, -1]]


def test_average_ranks_and_spearman_on_hand_made_values():
    assert average_ranks(torch.tensor([3.0, 1.0, 3.0, 2.0])).tolist() == [3.5, 1.0, 3.5, 2.0]
    assert spearman(torch.tensor([1.0, 2, 3, 4]), torch.tensor([1.0, 3, 2, 4])) == pytest.approx(0.8)
    # ties: Pearson of the average ranks [1.5, 1.5, 3] and [1, 2, 3]
    assert spearman(torch.tensor([1.0, 1, 2]), torch.tensor([1.0, 2, 3])) == pytest.approx(1.5 / math.sqrt(3))
    assert spearman(torch.tensor([5.0, 5, 5]), torch.tensor([1.0, 2, 3])) is None
    assert spearman(torch.tensor([1.0]), torch.tensor([2.0])) is None


def _credit(adv, se, mask, skipped=None) -> OracleCredit:
    adv, se, mask = torch.tensor(adv), torch.tensor(se), torch.tensor(mask, dtype=torch.bool)
    n, t = adv.shape
    z = torch.zeros(n, t + 1)
    return OracleCredit(
        adv,
        se,
        mask,
        torch.zeros(n, t, dtype=torch.bool) if skipped is None else torch.tensor(skipped),
        torch.zeros(n, t),
        z,
        z,
        z.bool(),
        torch.zeros(n),
        oracle.OracleCost(),
    )


def test_fidelity_metrics_on_a_hand_made_batch():
    cr = _credit(
        adv=[[-0.8, 0.0, 0.3, 0.05], [0.6, -0.1, 0.0, 0.0]],
        se=[[0.1, 0.0, 0.1, 0.1], [0.2, 0.2, 0.0, 0.0]],
        mask=[[1, 1, 1, 1], [1, 1, 1, 0]],
        skipped=[[False, True, False, False], [False, False, True, False]],
    )
    # significant: (0,0) -0.8 > 0.2, (0,2) 0.3 > 0.2, (1,0) 0.6 > 0.4; not (0,3), (1,1) or skipped ones
    assert cr.significant().nonzero().tolist() == [[0, 0], [0, 2], [1, 0]]
    hat = torch.tensor([[-2.0, 0.5, -1.0, 0.0], [1.0, -1.0, 0.5, 9.0]])  # 9.0 sits on padding
    f = oracle.fidelity(hat, cr)
    assert f["tokens"] == 7 and f["significant_tokens"] == 3
    assert f["sign_agreement"] == pytest.approx(2 / 3)  # (0,2) has the wrong sign
    assert f["significant_share"] == pytest.approx((2 + 1 + 1) / (2 + 0.5 + 1 + 0 + 1 + 1 + 0.5))
    valid = cr.mask
    assert f["spearman"] == pytest.approx(spearman(hat[valid], cr.advantages[valid]))
    per = [spearman(hat[i][valid[i]], cr.advantages[i][valid[i]]) for i in range(2)]
    assert f["spearman_per_response"] == pytest.approx(sum(per) / 2) and f["responses"] == 2
    # Â = A* is perfect; uniform credit has no per-response correlation
    g = oracle.fidelity(cr.advantages.clone(), cr)
    assert g["spearman"] == pytest.approx(1.0) and g["sign_agreement"] == 1.0
    u = oracle.fidelity(torch.where(valid, -1.0, 0.0), cr)
    assert u["spearman_per_response"] is None and u["responses"] == 0
    # restricted to rows, and zero credit
    assert oracle.fidelity(hat, cr, rows=torch.tensor([False, True]))["tokens"] == 3
    z = oracle.fidelity(torch.zeros(2, 4), cr)
    assert z["significant_share"] is None and z["sign_agreement"] == 0.0
    with pytest.raises(ValueError, match="rollout 1, token 1"):
        oracle.fidelity(torch.tensor([[0.0] * 4, [0.0, float("nan"), 0.0, 0.0]]), cr)


def _random_credit(n: int, t: int, seed: int) -> tuple[torch.Tensor, OracleCredit]:
    g = torch.Generator().manual_seed(seed)
    adv = torch.randn(n, t, generator=g)
    se = torch.rand(n, t, generator=g) * 0.8
    lengths = torch.randint(2, t + 1, (n,), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    skipped = (torch.rand(n, t, generator=g) < 0.1) & mask
    adv = torch.where(mask & ~skipped, adv, 0.0)
    hat = adv + torch.randn(n, t, generator=g)  # a noisy method
    return hat, _credit(adv.tolist(), torch.where(mask, se, 0.0).tolist(), mask.tolist(), skipped.tolist())


def _select(cr: OracleCredit, idx: torch.Tensor) -> OracleCredit:
    return OracleCredit(
        cr.advantages[idx],
        cr.stderr[idx],
        cr.mask[idx],
        cr.skipped[idx],
        cr.bound[idx],
        cr.values[idx],
        cr.value_stderr[idx],
        cr.known[idx],
        cr.rewards[idx],
        cr.cost,
    )


def test_fidelity_stderr_is_the_group_bootstrap_of_fidelity():
    """The weighted shortcut equals resampling whole groups and calling `fidelity` on the rows drawn."""
    hat, cr = _random_credit(12, 7, seed=3)
    groups = torch.arange(12) // 3  # 4 problems x 3 rollouts
    b, seed = 30, 5
    got = oracle.fidelity_stderr(hat, cr, groups, resamples=b, seed=seed)
    draws = torch.randint(4, (b, 4), generator=torch.Generator().manual_seed(seed))
    per_draw = []
    for d in draws:
        idx = torch.cat([torch.nonzero(groups == int(k)).squeeze(1) for k in d])
        per_draw.append(oracle.fidelity(hat[idx], _select(cr, idx)))
    for key in ("spearman", "spearman_per_response", "sign_agreement", "significant_share"):
        values = torch.tensor([r[key] for r in per_draw if r[key] is not None], dtype=torch.float64)
        assert got[f"{key}_se"] == pytest.approx(float(values.std()), rel=1e-9, abs=1e-12), key
        assert got[f"{key}_se"] > 0


def test_fidelity_stderr_resamples_groups_not_rows():
    """Rollouts of one problem that are copies of each other carry no more information than one: the
    group bootstrap sees 3 problems, a row bootstrap would see 12 independent rollouts."""
    hat, cr = _random_credit(3, 6, seed=1)
    idx = torch.arange(3).repeat_interleave(4)
    hat4, cr4 = hat[idx], _select(cr, idx)
    clustered = oracle.fidelity_stderr(hat4, cr4, idx, resamples=400, seed=0)
    rows = oracle.fidelity_stderr(hat4, cr4, torch.arange(12), resamples=400, seed=0)
    assert clustered["spearman_per_response_se"] > 1.5 * rows["spearman_per_response_se"]
    # undefined: one group, no resamples, a statistic that never varies
    assert set(oracle.fidelity_stderr(hat4, cr4, torch.zeros(12, dtype=torch.long)).values()) == {None}
    assert set(oracle.fidelity_stderr(hat4, cr4, idx, resamples=0).values()) == {None}
    uniform = oracle.fidelity_stderr(-cr4.mask.float(), cr4, idx, resamples=50)
    assert uniform["spearman_per_response_se"] is None and uniform["significant_share_se"] is not None


def test_oracle_targets_need_a_significantly_negative_minimum():
    cr = _credit(
        adv=[[-0.8, -0.8, 0.3], [-0.1, 0.2, 0.0], [0.4, 0.1, 0.0]],
        se=[[0.1, 0.1, 0.1], [0.2, 0.0, 0.0], [0.1, 0.1, 0.0]],
        mask=[[1, 1, 1], [1, 1, 1], [1, 1, 0]],
    )
    assert oracle.oracle_targets(cr).tolist() == [0, -1, -1]
    assert oracle.oracle_targets(cr, z=0.1).tolist() == [0, 0, -1]


# ============================================================================ hand-made policy
def test_estimate_converges_to_the_analytic_advantage_within_its_standard_error(tree):
    policy, seqs, mask, lp, rewards, exact = tree
    errors = []
    for k in (16, 256):
        out = token_advantages(TreeSampler(policy, seqs), mask, lp, rewards, k=k, delta=0.0, seed=0)
        est = mask & ~out.skipped & (out.stderr > 0)
        assert int(est.sum()) > 40
        z = (out.advantages.double() - exact)[est] / out.stderr.double()[est]
        # calibrated standard errors: |z| rarely beyond 2, never far beyond 4
        assert float((z.abs() > 2).double().mean()) < 0.12
        assert float(z.abs().max()) < 4.5
        # se 0 (all sampled rewards agreed at both states): only ever near-deterministic states here
        agreed = mask & ~out.skipped & (out.stderr == 0)
        torch.testing.assert_close(out.advantages.double()[agreed], exact[agreed], atol=0.05, rtol=0)
        errors.append(float((out.advantages.double() - exact)[mask].abs().mean()))
    assert errors[1] < errors[0] / 2.5  # 16x the samples: about 4x smaller errors
    # the final value is the rollout's own reward: the last position's A* uses it with no error
    last = mask.sum(1) - 1
    torch.testing.assert_close(out.values[torch.arange(len(seqs)), last + 1], rewards)


def test_delta_bound_holds_and_skipped_positions_carry_it(tree):
    policy, seqs, mask, lp, rewards, exact = tree
    delta = 0.02
    out = token_advantages(TreeSampler(policy, seqs), mask, lp, rewards, k=8, delta=delta, seed=0)
    p = lp.double().exp()
    assert torch.equal(out.skipped, mask & (p >= 1 - delta))
    assert int(out.skipped.sum()) > 5 and int((mask & ~out.skipped).sum()) > 5
    s = out.skipped
    assert bool((out.advantages[s] == 0).all()) and bool((out.stderr[s] == 0).all())
    torch.testing.assert_close(out.bound[s].double(), (1 - p[s]), rtol=1e-5, atol=1e-7)
    assert bool((exact[s].abs() <= out.bound[s].double() + 1e-9).all())
    assert bool((out.bound[s] <= delta).all()) and bool((out.bound[~s] == 0).all())
    # the bound is (1 - p)|Q - Qbar|: tight when the other tokens lead to the opposite outcome
    assert out.cost.skipped == int(s.sum()) and out.cost.positions == int(mask.sum())
    # a wider reward range scales the bound
    wide = token_advantages(
        TreeSampler(policy, seqs), mask, lp, rewards, k=8, delta=delta, seed=0, reward_range=(0.0, 2.0)
    )
    torch.testing.assert_close(wide.bound, 2 * out.bound)


def test_masked_positions_are_exactly_zero_and_padding_values_do_not_matter(tree):
    policy, seqs, mask, lp, rewards, _ = tree
    out = token_advantages(TreeSampler(policy, seqs), mask, lp, rewards, k=4, delta=0.01, seed=5)
    for x in (out.advantages, out.stderr, out.bound):
        assert bool((x[~mask] == 0).all())
    assert not bool(out.skipped[~mask].any())
    lp2 = torch.where(mask, lp, torch.tensor(-7.0))
    out2 = token_advantages(TreeSampler(policy, seqs), mask, lp2, rewards, k=4, delta=0.01, seed=5)
    assert torch.equal(out.advantages, out2.advantages) and torch.equal(out.stderr, out2.stderr)


def test_deterministic_under_a_seed(tree):
    policy, seqs, mask, lp, rewards, _ = tree
    a, b, c = (
        token_advantages(TreeSampler(policy, seqs), mask, lp, rewards, k=8, delta=0.0, seed=s)
        for s in (1, 1, 2)
    )
    assert torch.equal(a.advantages, b.advantages) and torch.equal(a.stderr, b.stderr)
    assert not torch.equal(a.advantages, c.advantages)


def test_split_halves_leave_a_star_unchanged_and_average_to_it(tree):
    """A* is linear in the value means: A* of K continuations = the mean of A* of the first and of the
    last K/2, with the same states, skips (deterministic from the log-probs) and final rewards."""
    policy, seqs, mask, lp, rewards, _ = tree
    plain = token_advantages(TreeSampler(policy, seqs), mask, lp, rewards, k=8, delta=0.02, seed=3)
    out = token_advantages(
        TreeSampler(policy, seqs), mask, lp, rewards, k=8, delta=0.02, seed=3, split_halves=True
    )
    assert plain.half_advantages is None
    for name in ("advantages", "stderr", "values", "value_stderr", "known", "skipped", "bound"):
        assert torch.equal(getattr(out, name), getattr(plain, name)), name
    half = out.half_advantages
    assert half.shape == (2, *mask.shape) and half.dtype == torch.float32
    torch.testing.assert_close(half.mean(0), out.advantages, rtol=0, atol=1e-6)
    assert int(out.skipped.sum()) > 5 and not bool(half[:, ~mask | out.skipped].any())
    assert not torch.equal(half[0], half[1])  # independent halves
    # each half is the estimate from its own K/2 rewards: the last position's value after is the reward
    last = mask.sum(1) - 1
    keep = ~out.skipped[torch.arange(len(seqs)), last]
    want = rewards - out.values[torch.arange(len(seqs)), last]
    torch.testing.assert_close(
        half.mean(0)[torch.arange(len(seqs)), last][keep], want[keep], rtol=0, atol=1e-6
    )
    torch.testing.assert_close(
        oracle.half_means(torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]])),
        torch.tensor([[0.5, 0.0], [1.0, 0.5]], dtype=torch.float64),  # [2, M]: first halves, last halves
    )
    with pytest.raises(ValueError, match="even k"):
        token_advantages(TreeSampler(policy, seqs), mask, lp, rewards, k=5, split_halves=True)
    with pytest.raises(ValueError, match="K even"):
        oracle.half_means(torch.zeros(3, 5))


def test_only_states_next_to_an_unskipped_position_are_sampled(tree):
    policy, seqs, mask, lp, rewards, _ = tree

    class Recording(TreeSampler):
        def __call__(self, rows, cuts, k, seed):
            self.asked = set(zip(rows.tolist(), cuts.tolist()))
            return super().__call__(rows, cuts, k, seed)

    sampler = Recording(policy, seqs)
    out = token_advantages(sampler, mask, lp, rewards, k=2, delta=0.05, seed=0)
    keep = mask & ~out.skipped
    want = {(i, t) for i, t in keep.nonzero().tolist()} | {(i, t + 1) for i, t in keep.nonzero().tolist()}
    want -= {(i, int(mask[i].sum())) for i in range(len(seqs))}
    assert sampler.asked == want and sampler.calls == 1
    assert out.cost.states == len(want) and out.cost.continuations == 2 * len(want)


def test_known_zero_positions_are_exact_zeros_and_not_sampled(tree):
    """A toy-tail task's tail: A* = 0 exactly (se 0) where known_zero holds, no state is sampled for it
    unless a sampled position needs it, it is not counted as skipped, and elsewhere A* is unchanged."""
    policy, seqs, mask, lp, rewards, _ = tree

    class Recording(ExactSampler):
        def __call__(self, rows, cuts, k, seed):
            self.asked = set(zip(rows.tolist(), cuts.tolist()))
            return super().__call__(rows, cuts, k, seed)

    lengths = mask.sum(1)
    # the last two positions of every rollout of length >= 3 are "known" (a tail at the end, as on toy-tail)
    cols = torch.arange(mask.shape[1])[None, :]
    known = mask & (lengths[:, None] >= 3) & (cols >= lengths[:, None] - 2)
    plain = token_advantages(ExactSampler(policy, seqs), mask, lp, rewards, k=2, delta=0.0, seed=0)
    sampler = Recording(policy, seqs)
    out = token_advantages(sampler, mask, lp, rewards, k=2, delta=0.0, seed=0, known_zero=known)
    assert bool(known.any())
    assert torch.equal(out.advantages[known], torch.zeros(int(known.sum())))
    assert torch.equal(out.stderr[known], torch.zeros(int(known.sum())))
    torch.testing.assert_close(out.advantages[mask & ~known], plain.advantages[mask & ~known])
    assert not bool((out.skipped & known).any())  # exact, not skipped (delta 0 skips only p = 1 tokens)
    assert torch.equal(out.skipped, plain.skipped & ~known)
    keep = mask & ~known & ~out.skipped
    want = {(i, t) for i, t in keep.nonzero().tolist()} | {(i, t + 1) for i, t in keep.nonzero().tolist()}
    want -= {(i, int(lengths[i])) for i in range(len(seqs))}
    assert sampler.asked == want
    assert out.cost.states < plain.cost.states
    with pytest.raises(ValueError, match="known_zero has shape"):
        token_advantages(ExactSampler(policy, seqs), mask, lp, rewards, k=2, known_zero=known[:, :-1])


def test_input_errors_name_the_problem(tree):
    policy, seqs, mask, lp, rewards, _ = tree
    sampler = TreeSampler(policy, seqs)
    with pytest.raises(ValueError, match="k .* >= 2"):
        token_advantages(sampler, mask, lp, rewards, k=1)
    with pytest.raises(ValueError, match="reward 1.5 at rollout 2 is outside reward_range"):
        bad = rewards.clone()
        bad[2] = 1.5
        token_advantages(sampler, mask, lp, bad, k=2)

    class OutOfRange(TreeSampler):
        def __call__(self, rows, cuts, k, seed):
            out = super().__call__(rows, cuts, k, seed)
            out.rewards[3, 1] = -0.5
            return out

    rows, cuts = value_states(mask, skip_positions(lp, mask, 0.0)).nonzero(as_tuple=True)
    with pytest.raises(
        ValueError, match=f"rollout {int(rows[3])}, continuation 1 of the state after {int(cuts[3])}"
    ):
        token_advantages(OutOfRange(policy, seqs), mask, lp, rewards, k=2, delta=0.0)
    holes = mask.clone()
    holes[0, 1] = False
    with pytest.raises(ValueError, match="not right-padded"):
        token_advantages(sampler, holes, lp, rewards, k=2)


# ============================================================================ step level (VinePPO)
def test_step_advantages_match_the_analytic_step_values(tree):
    policy, seqs, mask, lp, rewards, _ = tree
    # steps end after every b token
    ids = torch.tensor([list(s) + [EOS] * (mask.shape[1] - len(s)) for s in seqs])
    bounds = mask & (ids == B)
    steps = step_ids_from_boundaries(mask, bounds)
    out = step_advantages(TreeSampler(policy, seqs), mask, bounds, rewards, k=400, max_steps=None, seed=0)
    assert torch.equal(out.steps, steps)
    for i, s in enumerate(seqs):
        starts = [0] + [j + 1 for j in range(len(s)) if s[j] == B]
        if starts[-1] != len(s):
            starts.append(len(s))
        for j in range(len(s)):
            st = int(steps[i, j])
            want = policy.value(s[: starts[st + 1]]) - policy.value(s[: starts[st]])
            se = float(out.stderr[i, j])
            assert abs(float(out.advantages[i, j]) - want) <= 4.5 * se + 0.005  # se 0: all 400 agreed
    assert bool((out.advantages[~mask] == 0).all())
    # every token of a step carries the same advantage
    for i in range(len(seqs)):
        for st in range(int(steps[i].max()) + 1):
            vals = out.advantages[i][steps[i] == st]
            assert bool((vals == vals[0]).all())


def test_step_advantages_cap_and_step_delta():
    policy = TreePolicy(max_len=6, seed=11)
    seqs, mask, lp, rewards, _ = tree_batch(policy, 16, seed=2)
    every = mask.clone()  # one token per step: the step level is the token level
    tok = token_advantages(ExactSampler(policy, seqs), mask, lp, rewards, k=2, delta=0.0)
    stp = step_advantages(ExactSampler(policy, seqs), mask, every, rewards, k=2, max_steps=None)
    torch.testing.assert_close(tok.advantages, stp.advantages)
    assert bool((stp.stderr == 0).all())
    # max_steps = 1: values at the prompt and after step 0 only; later steps get 0, step 1 gets R - V(s_1)
    cap = step_advantages(ExactSampler(policy, seqs), mask, every, rewards, k=2, max_steps=1)
    lengths = mask.sum(1)
    assert int(lengths.max()) > 2
    for i, s in enumerate(seqs):
        torch.testing.assert_close(
            cap.advantages[i, 0].double(),
            torch.tensor(policy.value(s[:1]) - policy.value(()), dtype=torch.float64),
        )
        if len(s) > 2:
            assert bool((cap.advantages[i, 2 : len(s)] == 0).all())
            torch.testing.assert_close(cap.advantages[i, 1], rewards[i] - cap.values[i, 1])
            torch.testing.assert_close(
                cap.values[i, 1].double(),
                torch.tensor(policy.value(s[:1]), dtype=torch.float64),
                atol=1e-6,
                rtol=0,
            )
    # the step-level delta: a step whose probability is >= 1 - delta gets 0 and the bound 1 - p_step
    sk = step_advantages(
        ExactSampler(policy, seqs), mask, every, rewards, k=2, max_steps=None, log_probs=lp, delta=0.02
    )
    p = lp.double().exp()
    assert torch.equal(sk.skipped, mask & (p >= 0.98))
    torch.testing.assert_close(sk.bound[sk.skipped].double(), 1 - p[sk.skipped], rtol=1e-5, atol=1e-7)
    kept = mask & ~sk.skipped
    torch.testing.assert_close(sk.advantages[kept], tok.advantages[kept])
    assert bool((sk.advantages[sk.skipped] == 0).all())
    with pytest.raises(ValueError, match="needs log_probs"):
        step_advantages(TreeSampler(policy, seqs), mask, every, rewards, k=6, delta=0.02)


# ============================================================================ Hugging Face path
@pytest.fixture
def one_thread():
    """Generation of a tiny model on a busy shared machine: 2 torch threads spin-wait and run many
    times slower than 1 (BENCHMARKS.md)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_lm():
    from conftest import tiny_qwen3
    from tokencredit.models import build_toy_tokenizer

    tok = build_toy_tokenizer()
    model = tiny_qwen3(len(tok), seed=7, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.eval(), tok


def _last_char_reward(texts, golds):
    """1 when the response has exactly two characters and the second is in the gold's set."""
    return [float(len(t) == 2 and t[1] in g) for t, g in zip(texts, golds)]


def test_model_sampler_values_match_the_models_own_probabilities(tiny_lm, one_thread):
    """With a 2-token budget the state after the first token has exactly one token to go, so its
    value is sum_y softmax(logits / T)[y] * r(y1 y): the sampler must follow the temperature,
    the budget and the reward."""
    from tokencredit.rollout import generate

    model, tok = tiny_lm
    temperature = 1.7
    ro = generate(model, tok, ["ab", "xyz"], 3, temperature=temperature, max_new_tokens=2, seed=0)
    golds = ["abcdefghijklmnopqrstuvwxyz"] * 6
    out = oracle.oracle_credit(
        model,
        tok,
        ro,
        golds,
        _last_char_reward,
        temperature=temperature,
        max_new_tokens=2,
        k=400,
        delta=0.0,
        seed=0,
        batch_size=800,
    )
    assert isinstance(out, OracleCredit)
    vocab_text = tok.batch_decode([[i] for i in range(len(tok))], skip_special_tokens=True)
    checked = 0
    for i in range(ro.num_rollouts):
        if int(ro.response_mask[i].sum()) != 2:
            continue
        seq = torch.cat([ro.prompt_ids[i][ro.prompt_mask[i]], ro.response_ids[i, :1]])[None]
        with torch.no_grad():
            probs = torch.softmax(model(seq).logits[0, -1].double() / temperature, -1)
        y1 = tok.decode(ro.response_ids[i, :1], skip_special_tokens=True)
        r = torch.tensor(
            _last_char_reward([y1 + v for v in vocab_text], [golds[i]] * len(tok)), dtype=torch.float64
        )
        exact = float((probs * r).sum())
        assert out.known[i, 1]
        assert abs(float(out.values[i, 1]) - exact) <= 4 * max(float(out.value_stderr[i, 1]), 0.01)
        checked += 1
    assert checked >= 3
    # the final value is each rollout's own reward
    want = torch.tensor(_last_char_reward(ro.texts, golds))
    torch.testing.assert_close(out.values[torch.arange(6), ro.response_mask.sum(1)], want)
    # identical prompts share the prompt state: 2 distinct prompt states at most
    assert out.cost.states <= 2 + 6
    assert out.cost.continuations == out.cost.states * 400


def test_model_sampler_is_deterministic_and_restores_train_mode(tiny_lm, one_thread):
    from tokencredit.rollout import generate

    model, tok = tiny_lm
    ro = generate(model, tok, ["1+1", "2+2"], 2, temperature=1.0, max_new_tokens=6, seed=3)
    golds = ["0123456789"] * 4

    def digits(texts, gs):
        return [sum(c in g for c in t) / max(1, len(t)) for t, g in zip(texts, gs)]

    model.train()
    runs = [
        oracle.oracle_credit(
            model,
            tok,
            ro,
            golds,
            digits,
            temperature=1.0,
            max_new_tokens=6,
            k=3,
            delta=0.0,
            seed=s,
            batch_size=12,
        )
        for s in (0, 0, 1)
    ]
    assert model.training
    model.eval()
    assert torch.equal(runs[0].advantages, runs[1].advantages)
    assert not torch.equal(runs[0].values, runs[2].values)
    out = runs[0]
    mask = ro.response_mask
    assert bool((out.advantages[~mask] == 0).all()) and bool((out.stderr[~mask] == 0).all())
    # every completed response starts with its state's prefix and stays within max_new_tokens
    seen: list[tuple[int, int, str]] = []

    def recording(texts, gs):
        seen.extend((len(seen) + j, 0, t) for j, t in enumerate(texts))
        return [0.5] * len(texts)

    sampler = ModelSampler(model, tok, ro, golds, recording, temperature=1.0, max_new_tokens=6, batch_size=5)
    rows, cuts = torch.tensor([0, 1, 1, 3]), torch.tensor([0, 2, 5, 4])
    res = sampler(rows, cuts, 3, seed=0)
    assert res.rewards.shape == (4, 3) and res.states == 4
    texts = [t for _, _, t in seen]
    assert len(texts) == 12
    for m, (r, c) in enumerate(zip(rows.tolist(), cuts.tolist())):
        prefix = tok.decode(ro.response_ids[r, :c], skip_special_tokens=True)
        for t in texts[3 * m : 3 * m + 3]:
            assert t.startswith(prefix) and len(t) <= 6
    assert sum(len(t) == 6 for t in texts) >= 6  # a random model rarely stops: the budget binds
    assert res.generated_tokens <= 3 * sum(6 - c for c in cuts.tolist())
    with pytest.raises(Exception, match="temperature > 0"):
        ModelSampler(model, tok, ro, golds, digits, temperature=0.0, max_new_tokens=6)
    with pytest.raises(ValueError, match="more than max_new_tokens=3"):
        ModelSampler(model, tok, ro, golds, digits, temperature=1.0, max_new_tokens=3)


def test_vine_credit_steps_end_at_line_breaks(tiny_lm, one_thread):
    model, tok = tiny_lm
    ids = torch.tensor([tok("ab\ncd\ne", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    b = line_break_boundaries(tok, ids, mask)
    assert b[0].tolist() == [False, False, True, False, False, True, False, False]
    assert step_ids_from_boundaries(mask, b)[0].tolist() == [0, 0, 0, 1, 1, 1, 2, 2]

    class Layout:
        prompt_ids = torch.tensor([tok("Q:", add_special_tokens=False)["input_ids"]])
        prompt_mask = torch.ones_like(prompt_ids, dtype=torch.bool)
        response_ids = ids
        response_mask = mask

    out = oracle.vine_credit(
        model,
        tok,
        Layout(),
        ["e"],
        lambda t, g: [float(x.endswith(y)) for x, y in zip(t, g)],
        temperature=1.0,
        max_new_tokens=12,
        k=4,
        seed=0,
    )
    # values at the prompt and after each line: states 0, 3, 6
    assert out.known[0].nonzero().flatten().tolist() == [0, 3, 6, 8]
    assert out.cost.states == 3 and out.cost.continuations == 12
    v = out.values[0]
    assert float(out.advantages[0, 0]) == pytest.approx(float(v[3] - v[0]))
    assert float(out.advantages[0, 7]) == pytest.approx(float(v[8] - v[6]))


@pytest.mark.slow
def test_oracle_blames_the_checkers_first_wrong_token_on_the_warm_start(one_thread):
    """On a warm-start batch the most negative A* of a wrong rollout is the checker's first wrong
    token far more often than chance (1 / length, about 1.6%)."""
    from tokencredit import models
    from tokencredit.data.synthetic import extract_answer, locate_first_error
    from tokencredit.data.templates import render
    from tokencredit.probe import char_to_token, token_char_spans
    from tokencredit.rollout import generate

    model, tok = models.load_model("toy")
    problems = models.toy_task(seed=1).sample(6, "heldout")
    ro = generate(
        model, tok, [render("qwen-math", p.problem, tok) for p in problems], 4, max_new_tokens=80, seed=0
    )
    rows = [problems[int(i)] for i in ro.prompt_index]

    def reward(texts, golds):
        return [float(extract_answer(t) == int(g)) for t, g in zip(texts, golds)]

    out = oracle.oracle_credit(
        model, tok, ro, [p.answer for p in rows], reward, temperature=1.0, max_new_tokens=80, k=8, seed=0
    )
    hits, lengths = [], []
    for i, p in enumerate(rows):
        ids = ro.response_ids[i, ro.response_mask[i]].tolist()
        text, spans = token_char_spans(tok, ids)
        loc = locate_first_error(p, text)
        target = char_to_token(spans, loc.start)
        if out.rewards[i] > 0 or loc.kind == "correct" or target is None:
            continue
        adv = out.advantages[i, : len(ids)]
        hits.append(int(adv.argmin()) == target and float(adv.min()) < 0)
        lengths.append(len(ids))
    assert len(hits) >= 5
    chance = sum(1 / n for n in lengths) / len(lengths)
    blame1 = sum(hits) / len(hits)
    assert blame1 > max(10 * chance, 0.3), (blame1, chance)

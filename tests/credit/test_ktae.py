"""KTAE: docs/spec/ktae.md worked-example vectors, per-group reference, Fisher p-values, degenerate inputs."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import fisher_exact

from tokencredit.batch import RolloutBatch
from tokencredit.credit import compute
from tokencredit.credit.ktae import (
    fisher_pvalue,
    fisher_pvalue_official_fp32,
    key_token_values,
    table_statistics,
)
from tokencredit.errors import ConfigError

PAD = 0
A4 = [0.866024, 0.866024, -0.866024, -0.866024]


def spec_batch(second_group: bool = True) -> RolloutBatch:
    rows = [[10, 11, 12, 15, 11], [10, 12, 12, 15, PAD], [10, 13, 11, 15, 14], [10, 13, 14, PAD, PAD]]
    mask = [[1] * 5, [1, 1, 1, 1, 0], [1] * 5, [1, 1, 1, 0, 0]]
    scores, groups = [1.0, 1.0, 0.0, 0.0], [0, 0, 0, 0]
    if second_group:
        rows += [[10, 11, 12, PAD, PAD], [13, 13, PAD, PAD, PAD]]
        mask += [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]]
        scores += [1.0, 1.0]
        groups += [7, 7]
    return RolloutBatch(
        token_ids=torch.tensor(rows),
        mask=torch.tensor(mask).bool(),
        group_ids=torch.tensor(groups),
        scores=torch.tensor(scores),
    )


# ---------------------------------------------------------------------------- worked example
K_TF = {10: 0.0, 11: 0.0, 12: 1.0, 13: -1.0, 14: -1.0, 15: 0.137231}
K_NO_TF = {10: 0.0, 11: 0.0, 12: 0.532992, 13: -0.532992, 14: -0.532992, 15: 0.061043}


@pytest.mark.parametrize("use_tf", [True, False])
@pytest.mark.parametrize("fisher", ["exact", "official-fp32"])
def test_spec_key_values(use_tf: bool, fisher: str) -> None:
    b = spec_batch()
    k = key_token_values(b.token_ids, b.mask, b.correct(), b.group_ids, use_tf=use_tf, fisher=fisher)
    table = dict(K_TF if use_tf else K_NO_TF)
    if fisher == "official-fp32" and use_tf:
        table[11] = 0.033458  # p = 0.99999988 in float32, so F = exp(-2p) instead of 0
    expected = torch.zeros(6, 5)
    for i in range(4):
        for j in range(5):
            if b.mask[i, j]:
                expected[i, j] = table[int(b.token_ids[i, j])]
    torch.testing.assert_close(k, expected, atol=1e-5, rtol=0)
    assert torch.equal(k[4:], torch.zeros(2, 5))  # all-correct group
    assert bool((k[~b.mask] == 0).all())


def test_spec_table_statistics() -> None:
    n, nt = torch.full((4,), 4), torch.full((4,), 2)
    a, bb = torch.tensor([2, 1, 2, 2]), torch.tensor([2, 1, 0, 1])
    f, ig, _ = table_statistics(n, nt, a, bb)
    torch.testing.assert_close(
        f, torch.tensor([0.0, 0.0, 0.513417, 0.0], dtype=torch.float64), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        ig, torch.tensor([0.0, 0.0, 1.0, 0.311278], dtype=torch.float64), atol=1e-6, rtol=0
    )
    p = fisher_pvalue(a, bb, nt - a, n - nt - bb)
    assert p.tolist()[:2] == [1.0, 1.0] and p[3].item() == 1.0
    assert abs(p[2].item() - 1 / 3) < 1e-12
    p32 = fisher_pvalue_official_fp32(a, bb, nt - a, n - nt - bb)
    assert p32.dtype == torch.float32
    assert p32[1].item() == pytest.approx(0.99999988, abs=1e-8) and p32[1].item() != 1.0


def test_spec_advantages_through_compute() -> None:
    b = spec_batch()
    adv = torch.tensor(A4 + [0.0, 0.0])
    out = compute("ktae", b, adv)
    expected = torch.tensor(
        [
            [0.866024, 0.866024, 1.866024, 1.003255, 0.866024],
            [0.866024, 1.866024, 1.866024, 1.003255, 0],
            [-0.866024, -1.866024, -0.866024, -0.728793, -1.866024],
            [-0.866024, -1.866024, -1.866024, 0, 0],
            [0] * 5,
            [0] * 5,
        ]
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    off = compute("ktae", b, adv, fisher="official-fp32")
    moved = torch.zeros(6, 5)
    moved[0, 1] = moved[0, 4] = moved[2, 2] = 0.033458
    torch.testing.assert_close(off - out, moved, atol=1e-5, rtol=0)
    # Ignoring id 15 (e.g. the tokenizer's EOS) removes its key value and nothing else.
    ign = compute("ktae", b, adv, ignore_token_ids=(15,))
    diff = torch.zeros(6, 5)
    diff[0, 3] = diff[1, 3] = diff[2, 3] = -0.137231
    torch.testing.assert_close(ign - out, diff, atol=1e-5, rtol=0)


def test_threshold_hyperparameter() -> None:
    b = spec_batch(second_group=False)
    b.scores = torch.tensor([1.0, 0.6, 0.2, 0.0])
    adv = torch.tensor(A4)
    # threshold 0.5 reproduces the split of docs/spec/ktae.md#worked-example; threshold 0.0 makes 3 of 4 correct.
    torch.testing.assert_close(
        compute("ktae", b, adv, threshold=0.5)[0, 2], torch.tensor(1.866024), atol=1e-5, rtol=0
    )
    k3 = key_token_values(b.token_ids, b.mask, b.scores > 0.0, b.group_ids)
    assert not torch.allclose(k3, key_token_values(b.token_ids, b.mask, b.scores > 0.5, b.group_ids))


# ---------------------------------------------------------------------------- Fisher p-values
def _all_tables(sizes):
    for n in sizes:
        for nt in range(n + 1):
            for a in range(nt + 1):
                for b in range(n - nt + 1):
                    yield a, b, nt - a, n - nt - b


def test_fisher_exact_matches_scipy_exhaustive_small() -> None:
    tables = torch.tensor(list(_all_tables([*range(1, 11), 16])))
    p = fisher_pvalue(*tables.unbind(1))
    ref = torch.tensor(
        [fisher_exact([[a, b], [c, d]]).pvalue for a, b, c, d in tables.tolist()], dtype=torch.float64
    )
    torch.testing.assert_close(p, ref, rtol=1e-9, atol=1e-12)
    assert torch.equal(p == 1.0, ref == 1.0)


def test_fisher_exact_matches_scipy_random_large() -> None:
    gen = torch.Generator().manual_seed(0)
    m = 600
    n = torch.randint(2, 129, (m,), generator=gen)
    nt = (torch.rand(m, generator=gen) * (n + 1)).long().clamp(max=n)
    a = (torch.rand(m, generator=gen) * (nt + 1)).long().clamp(max=nt)
    b = (torch.rand(m, generator=gen) * (n - nt + 1)).long().clamp(max=n - nt)
    c, d = nt - a, n - nt - b
    p = fisher_pvalue(a, b, c, d)
    ref = torch.tensor(
        [
            fisher_exact([[w, x], [y, z]]).pvalue
            for w, x, y, z in zip(a.tolist(), b.tolist(), c.tolist(), d.tolist())
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(p, ref, rtol=1e-8, atol=1e-14)


def _p_official_fp32_one(a: int, b: int, c: int, d: int) -> float:
    """The official float32 recipe for one table, grid k = 0..a+c, torch's float32 row sum."""
    t = lambda x: torch.tensor([float(x)], dtype=torch.float32)  # noqa: E731
    r1, c1, n = t(a + b), t(a + c), t(a + b + c + d)
    k = torch.arange(a + c + 1, dtype=torch.float32)

    def lc(nn: torch.Tensor, kk: torch.Tensor) -> torch.Tensor:
        return torch.lgamma(nn + 1) - torch.lgamma(kk + 1) - torch.lgamma(nn - kk + 1)

    logp = lc(c1, k) + lc(n - c1, r1 - k) - lc(n, r1)
    inside = (k >= torch.clamp(r1 + c1 - n, min=0)) & (k <= torch.minimum(r1, c1))
    pk = torch.exp(logp) * inside.float()
    p_obs = torch.exp(lc(c1, t(a)) + lc(n - c1, r1 - t(a)) - lc(n, r1))
    return torch.where((pk <= p_obs) & inside, pk, 0.0)[None].sum(1).item()


def test_fisher_official_fp32_matches_float32_recomputation() -> None:
    tables = list(_all_tables([*range(1, 11), 16]))
    p32 = fisher_pvalue_official_fp32(*torch.tensor(tables).unbind(1))
    ref = torch.tensor([_p_official_fp32_one(*tb) for tb in tables], dtype=torch.float32)
    assert torch.equal(p32, ref)
    exact = fisher_pvalue(*torch.tensor(tables).unbind(1))
    # The quirk: many tables with exact p = 1 are not 1.0 in float32 (F = 0.135 instead of 0).
    quirky = (exact == 1.0) & (p32 != 1.0)
    assert int(quirky.sum()) > 100
    # Without a tolerance, float32 rounding can also drop a tied table from the sum, so the
    # official p is never above the exact one (beyond rounding) and sometimes far below it.
    assert bool((p32.double() <= exact + 1e-5).all())
    assert float(((p32.double() - exact).abs() < 1e-5).double().mean()) > 0.95


# ---------------------------------------------------------------------------- per-group reference
def reference_key_values(ids, mask, correct, groups, use_tf, alpha, beta, top, fisher, ignore):
    """Plain per-group, per-id Python implementation of docs/spec/ktae.md (loops on purpose)."""
    n_rows, width = ids.shape
    out = torch.zeros(n_rows, width, dtype=torch.float64)
    for g in sorted(set(groups.tolist())):
        rows = [i for i in range(n_rows) if groups[i] == g]
        seqs = {i: [int(ids[i, t]) for t in range(width) if mask[i, t]] for i in rows}
        good = [i for i in rows if correct[i]]
        bad = [i for i in rows if not correct[i]]
        if not good or not bad:
            continue
        nt, nf = len(good), len(bad)
        lt = sum(len(seqs[i]) for i in good)
        lf = sum(len(seqs[i]) for i in bad)
        values = {}
        for tok in {x for s in seqs.values() for x in s}:
            a = sum(tok in seqs[i] for i in good)
            b = sum(tok in seqs[i] for i in bad)
            c, d = nt - a, nf - b
            if fisher == "exact":
                p = fisher_exact([[a, b], [c, d]]).pvalue
            else:
                p = _p_official_fp32_one(a, b, c, d)
            f_score = 0.0 if p == 1.0 else math.exp(-2 * p)

            def hb(x: float) -> float:
                return -sum(q * math.log2(q) for q in (x, 1 - x) if q > 0)

            n = nt + nf
            ig = hb(nt / n)
            if a + b:
                ig -= (a + b) / n * hb(a / (a + b))
            if c + d:
                ig -= (c + d) / n * hb(c / (c + d))
            direction = math.asin(math.sqrt(min(1.0, a / (nt + 1e-10)))) - math.asin(
                math.sqrt(min(1.0, b / (nf + 1e-10)))
            )
            if use_tf:
                lavg = (lt + lf) / 2
                cnt_t = sum(seqs[i].count(tok) for i in good)
                cnt_f = sum(seqs[i].count(tok) for i in bad)
                ft = cnt_t / lt if lt else 0.0
                ff = cnt_f / lf if lf else 0.0
                tft = ft * 3 / (ft + 2 * (0.5 + 0.5 * lt / lavg))
                tff = ff * 3 / (ff + 2 * (0.5 + 0.5 * lf / lavg))
                direction += tft / (tff + 1e-5) - tff / (tft + 1e-5)
            strength = (alpha * f_score + beta * ig) / (alpha + beta)
            values[tok] = 0.0 if tok in ignore else top * math.tanh(strength * direction / 2)
        for i in rows:
            for t in range(width):
                if mask[i, t]:
                    out[i, t] = values[int(ids[i, t])]
    return out.float()


def random_batch(seed: int, n_groups: int = 6, vocab: int = 12):
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 9, (n_groups,), generator=gen)
    n = int(sizes.sum())
    width = 9
    group_values = torch.randperm(1000, generator=gen)[:n_groups] - 500  # arbitrary, negative too
    groups = torch.repeat_interleave(group_values, sizes)
    perm = torch.randperm(n, generator=gen)  # interleave the groups
    groups = groups[perm]
    ids = torch.randint(0, vocab, (n, width), generator=gen) * 7 + 3
    lengths = torch.randint(0, width + 1, (n,), generator=gen)
    mask = torch.arange(width)[None] < lengths[:, None]
    ids = torch.where(mask, ids, torch.full_like(ids, -1))  # garbage at masked positions is ignored
    correct = torch.rand(n, generator=gen) < 0.5
    return ids, mask, correct, groups


@pytest.mark.parametrize("seed", range(12))
def test_vectorised_matches_per_group_reference(seed: int) -> None:
    ids, mask, correct, groups = random_batch(seed)
    gen = torch.Generator().manual_seed(100 + seed)
    use_tf = bool(seed % 2)
    fisher = "exact" if seed % 3 else "official-fp32"
    alpha, beta, top = [(1.0, 1.0, 1.0), (0.5, 2.0, 0.7), (1.0, 0.0, 1.0), (0.0, 1.0, 2.0)][seed % 4]
    present = sorted(set(ids[mask].tolist()))
    ignore = (
        tuple(present[i] for i in torch.randperm(len(present), generator=gen)[:2].tolist()) if present else ()
    )
    got = key_token_values(ids, mask, correct, groups, use_tf, alpha, beta, top, fisher, ignore)
    ref = reference_key_values(ids, mask, correct, groups, use_tf, alpha, beta, top, fisher, set(ignore))
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert bool((got[~mask] == 0).all())


def test_large_groups_match_reference() -> None:
    gen = torch.Generator().manual_seed(42)
    n, width = 40 + 24, 12
    groups = torch.tensor([5] * 40 + [9] * 24)
    ids = torch.randint(0, 30, (n, width), generator=gen)
    mask = torch.arange(width)[None] < torch.randint(1, width + 1, (n,), generator=gen)[:, None]
    correct = torch.rand(n, generator=gen) < 0.3
    for fisher in ("exact", "official-fp32"):
        got = key_token_values(ids, mask, correct, groups, fisher=fisher)
        ref = reference_key_values(ids, mask, correct, groups, True, 1.0, 1.0, 1.0, fisher, set())
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_permutation_equivariance_and_group_labels() -> None:
    ids, mask, correct, groups = random_batch(3, n_groups=10)
    k = key_token_values(ids, mask, correct, groups)
    perm = torch.randperm(ids.shape[0], generator=torch.Generator().manual_seed(1))
    kp = key_token_values(ids[perm], mask[perm], correct[perm], groups[perm] * 1000 + 17)
    torch.testing.assert_close(kp, k[perm], atol=0, rtol=0)


def test_cost_independent_of_vocabulary_size() -> None:
    # Ids near 2**40 would need a terabyte-sized table if anything were vocabulary-sized.
    ids, mask, correct, groups = random_batch(5, n_groups=3)
    big = ids + (1 << 40)
    torch.testing.assert_close(
        key_token_values(big, mask, correct, groups),
        key_token_values(ids, mask, correct, groups),
        atol=0,
        rtol=0,
    )


# ---------------------------------------------------------------------------- degenerate inputs
def test_one_sided_and_single_rollout_groups_are_zero() -> None:
    ids = torch.tensor([[1, 2, 3], [1, 2, 4], [5, 6, 7], [5, 6, 8], [9, 9, 9]])
    mask = torch.ones(5, 3, dtype=torch.bool)
    correct = torch.tensor([True, True, False, False, True])
    groups = torch.tensor([0, 0, 1, 1, 2])
    assert torch.equal(key_token_values(ids, mask, correct, groups), torch.zeros(5, 3))


def test_empty_responses_and_empty_batch() -> None:
    ids = torch.tensor([[1, 2], [3, 4], [5, 6]])
    mask = torch.tensor([[1, 1], [0, 0], [1, 0]]).bool()
    correct = torch.tensor([True, False, False])
    groups = torch.tensor([0, 0, 0])
    k = key_token_values(ids, mask, correct, groups)
    assert bool(torch.isfinite(k).all()) and torch.equal(k[1], torch.zeros(2)) and k[0, 0] > 0
    none = key_token_values(ids, torch.zeros(3, 2, dtype=torch.bool), correct, groups)
    assert torch.equal(none, torch.zeros(3, 2))
    empty = key_token_values(
        torch.zeros(0, 4, dtype=torch.long), torch.zeros(0, 4), torch.zeros(0).bool(), torch.zeros(0).long()
    )
    assert empty.shape == (0, 4)
    # A correct side with no valid token at all: frequencies are 0, values stay finite.
    mask2 = torch.tensor([[0, 0], [1, 1], [1, 0]]).bool()
    k2 = key_token_values(ids, mask2, correct, groups)
    assert bool(torch.isfinite(k2).all()) and bool((k2[mask2] < 0).all())


def test_bad_inputs() -> None:
    ids = torch.tensor([[1, -2]])
    with pytest.raises(ValueError, match="rollout 0, token 1"):
        key_token_values(ids, torch.ones(1, 2), torch.tensor([True]), torch.tensor([0]))
    with pytest.raises(ConfigError, match="official-fp32"):
        key_token_values(
            torch.ones(1, 2).long(),
            torch.ones(1, 2),
            torch.tensor([True]),
            torch.tensor([0]),
            fisher="official",
        )
    with pytest.raises(ConfigError):
        key_token_values(
            torch.ones(1, 2).long(),
            torch.ones(1, 2),
            torch.tensor([True]),
            torch.tensor([0]),
            alpha=0,
            beta=0,
        )
    with pytest.raises(ValueError, match="correct"):
        key_token_values(
            torch.ones(2, 2).long(), torch.ones(2, 2), torch.tensor([True]), torch.tensor([0, 0])
        )
    with pytest.raises(ConfigError, match="fisher"):
        compute("ktae", spec_batch(), torch.zeros(6), fisher="exakt")


def test_compute_output_is_masked_float32_and_detached() -> None:
    ids, mask, correct, groups = random_batch(7)
    batch = RolloutBatch(token_ids=ids.clamp(min=0), mask=mask, group_ids=groups, scores=correct.float())
    adv = torch.randn(ids.shape[0], requires_grad=True)
    out = compute("ktae", batch, adv)
    assert out.dtype == torch.float32 and not out.requires_grad
    assert bool((out[~mask] == 0).all())
    k = key_token_values(ids, mask, correct, groups)
    torch.testing.assert_close(out, torch.where(mask, adv.detach()[:, None] + k, 0.0))

import pytest
import torch

from tokencredit import credit
from tokencredit.batch import RolloutBatch
from tokencredit.credit.entropy import entropy_from_logits, keep_count, top_entropy_mask


def test_batch_scope_threshold_matches_torch_quantile():
    g = torch.Generator().manual_seed(0)
    ent = torch.rand(5, 9, generator=g)
    mask = torch.rand(5, 9, generator=g) > 0.3
    keep = top_entropy_mask(ent, mask, 0.2, "batch")
    thr = torch.quantile(ent[mask].double(), 0.8)
    assert torch.equal(keep, mask & (ent.double() >= thr))
    assert not (keep & ~mask).any()


def test_sequence_scope_and_extremes():
    ent = torch.tensor([[2.1, 0.05, 1.3, 0.02], [0.1, 0.2, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]).bool()
    keep = top_entropy_mask(ent, mask, 0.5, "sequence")
    # row 0: median of 4 values -> quantile(0.5) = (0.05+1.3)/2 -> keeps 2.1 and 1.3
    assert keep.tolist() == [[True, False, True, False], [False, True, False, False]]
    assert torch.equal(top_entropy_mask(ent, mask, 1.0, "sequence"), mask)
    empty = torch.zeros(2, 4, dtype=torch.bool)
    assert not top_entropy_mask(ent, empty, 0.2, "batch").any()
    with pytest.raises(ValueError):
        top_entropy_mask(ent, mask, 1.5)
    with pytest.raises(ValueError, match="scope"):
        top_entropy_mask(ent, mask, 0.2, "group")


def test_80_20_credit_method_zeroes_low_entropy_tokens():
    b = RolloutBatch(
        token_ids=torch.zeros(2, 5, dtype=torch.long),
        mask=torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]),
        group_ids=torch.tensor([0, 0]),
        scores=torch.tensor([1.0, 0.0]),
        entropy=torch.tensor([[0.1, 5.0, 0.2, 0.3, 0.1], [4.0, 0.1, 0.1, 9.0, 9.0]]),
    )
    A = torch.tensor([0.7, -0.7])
    out = credit.compute("entropy-80-20", b, A, keep_ratio=0.25)
    assert out.tolist()[0] == pytest.approx([0, 0.7, 0, 0, 0])
    assert out.tolist()[1] == pytest.approx([-0.7, 0, 0, 0, 0])
    u = credit.compute("uniform", b, A)
    assert u[1, 3] == 0 and u[0, 4] == pytest.approx(0.7)


def test_registry_errors():
    b = RolloutBatch(
        torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2), torch.zeros(1, dtype=torch.long), torch.ones(1)
    )
    with pytest.raises(credit.ConfigError, match="closest: uniform"):
        credit.compute("unifrom", b, torch.zeros(1))
    with pytest.raises(credit.ConfigError, match="no parameter 'keep'"):
        credit.compute("entropy-80-20", b, torch.zeros(1), keep=0.2)
    with pytest.raises(ValueError, match="entropy"):
        credit.compute("entropy-80-20", b, torch.zeros(1))


# ---------------------------------------------------------------------------------------------- ties
def _ninety_percent_zero(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """[10, 20] entropies, all valid: 2 per row are 1..20 (exact in bf16), the other 180 exactly 0."""
    ent = torch.zeros(10, 20)
    for i in range(10):
        ent[i, 3 + 7 * (i % 2)] = 2 * i + 1
        ent[i, 15 - (i % 3)] = 2 * i + 2
    return ent.to(dtype), torch.ones(10, 20, dtype=torch.bool)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ties_keep_exactly_keep_ratio_when_90_percent_are_zero(dtype):
    ent, mask = _ninety_percent_zero(dtype)
    assert (ent == 0).float().mean() == 0.9
    # the paper's threshold rule would keep everything here: the 0.8 quantile is 0
    assert torch.quantile(ent.double().flatten(), 0.8) == 0
    keep = top_entropy_mask(ent, mask, 0.2, "batch")
    assert int(keep.sum()) == 40  # ceil(0.2 * 200)
    assert keep[ent > 0].all()  # all 20 non-zero entropies
    zeros_kept = keep & (ent == 0)
    # the other 20: the zeros that come first in row-major (response, position) order
    first = torch.zeros(200, dtype=torch.bool)
    first[(ent == 0).flatten().nonzero().squeeze(-1)[:20]] = True
    assert torch.equal(zeros_kept.flatten(), first)
    seq = top_entropy_mask(ent, mask, 0.2, "sequence")
    assert seq.sum(-1).tolist() == [4] * 10  # ceil(0.2 * 20) per response
    for i in range(10):  # its two non-zero entropies, then its two earliest zeros
        assert seq[i][ent[i] > 0].all()
        assert (seq[i] & (ent[i] == 0)).nonzero().squeeze(-1).tolist() == [
            j for j in range(20) if ent[i, j] == 0
        ][:2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_80_20_method_with_ties_trains_exactly_keep_ratio(dtype):
    ent, mask = _ninety_percent_zero(dtype)
    mask[:, 17:] = False  # 170 valid tokens -> ceil(0.2 * 170) = 34 kept
    b = RolloutBatch(
        token_ids=torch.zeros(10, 20, dtype=torch.long),
        mask=mask,
        group_ids=torch.arange(10) // 5,
        scores=torch.arange(10.0) % 2,
        entropy=ent,
    )
    out = credit.compute("entropy-80-20", b, torch.full((10,), 0.5))
    assert int((out != 0).sum()) == 34 and not (out[~mask] != 0).any()


def test_keep_count_is_ceil_without_float_fuzz():
    n = torch.tensor([0, 1, 4, 5, 30, 200, 7])
    assert keep_count(n, 0.2).tolist() == [0, 1, 1, 1, 6, 40, 2]
    assert keep_count(torch.tensor([30, 10]), 0.1).tolist() == [3, 1]  # 0.1 * 30 = 3.0000000000000004
    assert keep_count(torch.tensor([7]), 0.0).tolist() == [0]


def test_tie_rule_matches_the_quantile_rule_on_distinct_entropies():
    g = torch.Generator().manual_seed(1)
    for n in range(1, 60):
        ent = torch.randperm(n, generator=g).float()[None] + 0.5
        mask = torch.ones(1, n, dtype=torch.bool)
        for ratio in (0.1, 0.2, 0.25, 0.5, 1.0):  # 1/m ratios: identical sets
            thr = torch.quantile(ent.double(), 1 - ratio)
            assert torch.equal(top_entropy_mask(ent, mask, ratio), ent.double() >= thr), (n, ratio)
    assert not top_entropy_mask(ent, mask, 0.0).any()


def test_non_finite_entropy_at_a_valid_token_is_an_error():
    ent = torch.tensor([[0.1, float("nan"), 0.3], [0.2, 0.1, float("inf")]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]]).bool()
    with pytest.raises(ValueError, match=r"response 0, position 1.*1 valid tokens"):
        top_entropy_mask(ent, mask)
    ent[0, 1] = 0.5  # the inf sits at a padding position: fine
    assert top_entropy_mask(ent, mask, 0.5).sum() == 3


# ---------------------------------------------------------------------------------------------- float32 entropy
def test_entropy_from_logits_keeps_small_entropies_of_confident_rows():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g, dtype=torch.float64) * 2
    logits[:3, 7] += torch.tensor([20.0, 26.0, 32.0], dtype=torch.float64)  # H ~ 4e-5, 3e-6, 2e-10
    ref = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    got = entropy_from_logits(logits.float(), chunk_size=4)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), ref, rtol=1e-5, atol=0)  # relative accuracy even at H ~ 2e-10

    def cancelling(z):  # logsumexp(z) - sum(softmax(z) z): verl's entropy_from_logits
        return torch.logsumexp(z, -1) - (z.softmax(-1) * z).sum(-1)

    assert cancelling(logits.float())[2] == 0 and (cancelling(logits.to(torch.bfloat16))[:3] == 0).all()
    half = entropy_from_logits(logits.to(torch.bfloat16).reshape(2, 3, 50))  # any dtype and leading shape
    assert half.shape == (2, 3) and half.dtype == torch.float32 and (half > 0).all()

import pytest
import torch

from tokencredit import credit
from tokencredit.batch import RolloutBatch
from tokencredit.credit.entropy import top_entropy_mask


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

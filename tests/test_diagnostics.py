import pytest
import torch
from scipy.stats import spearmanr

from tokencredit import diagnostics as D

M4 = torch.ones(1, 4, dtype=torch.bool)


def test_arca_spec_vectors():
    w = torch.tensor([[0.1, 0.3, 0.5, 0.1]])
    assert D.gini(w, M4).item() == pytest.approx(0.35)
    assert D.effective_token_ratio(w, M4).item() == pytest.approx(0.694444, abs=1e-6)
    w2 = torch.tensor([[0.027778, 0.25, 0.694444, 0.027778]])
    assert D.gini(w2, M4).item() == pytest.approx(0.555556, abs=1e-5)
    assert D.effective_token_ratio(w2, M4).item() == pytest.approx(0.457627, abs=1e-5)


def test_extremes_and_padding_and_unnormalised_input():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]).bool()
    w = torch.tensor([[5.0, 5.0, 5.0, 100.0], [3.0, 9, 9, 9], [1.0, 1, 1, 1], [0.0, 0.0, 7.0, 0.0]])
    g = D.gini(w, mask)
    e = D.effective_token_ratio(w, mask)
    assert g.tolist() == pytest.approx([0.0, 0.0, 0.0, 0.75])  # one-hot of 4: (n-1)/n
    assert e.tolist() == pytest.approx([1.0, 1.0, 1.0, 0.25])
    assert D.defined_rows(w, mask).tolist() == [True, False, False, True]
    with pytest.raises(ValueError, match="credit_weights"):
        D.gini(torch.tensor([[-1.0, 1.0, 1.0, 1.0]]), M4)


def test_credit_weights_and_summary():
    adv = torch.tensor([[1.0, -3.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]]).bool()
    w = D.credit_weights(adv, mask)
    torch.testing.assert_close(w, torch.tensor([[0.25, 0.75, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64))
    s = D.summary(
        adv, mask, torch.tensor([1.0, 0.0]), entropy=torch.tensor([[1.0, 2.0, 0.0], [0.1, 0.1, 0.1]])
    )
    assert s["credit_sign_flip"] == pytest.approx(0.5)
    assert s["credit_gini"] == pytest.approx(0.25)  # only row 0 defined: x=[.25,.75], (-1*.25 + 1*.75)/2
    q = {k: v for k, v in s.items() if k.startswith("credit_q_")}
    assert sum(q.values()) == pytest.approx(1.0)


def test_quadrants_and_entropy_share():
    adv = torch.tensor([[2.0, -1.0, 1.0, -4.0]])
    ent = torch.tensor([[5.0, 4.0, 0.1, 0.2]])
    q = D.quadrants(adv, ent, M4, keep_ratio=0.5)
    assert q == pytest.approx({"pos_high": 0.25, "neg_high": 0.125, "pos_low": 0.125, "neg_low": 0.5})
    s = D.entropy_share(adv, ent, M4, keep_ratio=0.5)
    assert s["high"] == pytest.approx(0.375) and s["low"] == pytest.approx(0.625)


def test_rank_correlation_matches_scipy_with_ties_and_padding():
    g = torch.Generator().manual_seed(3)
    a = torch.randint(0, 4, (6, 9), generator=g).float()
    b = a + torch.randn(6, 9, generator=g)
    lens = torch.tensor([9, 5, 3, 8, 2, 9])
    mask = torch.arange(9)[None] < lens[:, None]
    rc = D.rank_correlation(a, b, mask)
    for i in range(6):
        n = int(lens[i])
        if n < 2 or a[i, :n].unique().numel() == 1:
            assert rc[i].item() == 0.0
            continue
        want = spearmanr(a[i, :n].numpy(), b[i, :n].numpy()).statistic
        assert rc[i].item() == pytest.approx(float(want), abs=1e-9)
    const = D.rank_correlation(torch.ones(1, 4), torch.arange(4.0)[None], M4)
    assert const.item() == 0.0


def test_rank_correlation_makes_no_tensor_off_its_inputs_device():
    """On the meta device (which, like CUDA, refuses a CPU tensor beside its own) the ranks are built
    where the inputs live; tests/gpu checks every diagnostic on CUDA against the CPU."""
    x = torch.randn(3, 5, device="meta")
    mask = torch.ones(3, 5, dtype=torch.bool, device="meta")
    rho = D.rank_correlation(x, x, mask)
    assert rho.shape == (3,) and rho.device.type == "meta"

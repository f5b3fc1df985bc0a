"""Every registered credit method under random and degenerate batches (hypothesis).

Random batches include empty responses, single-token responses, all-masked rows, huge and tiny
advantages, duplicate ids and T = 1. For every method: the output is finite, masked positions
are exactly 0, nothing needs a gradient, and the documented invariants hold.
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokencredit import advantages, credit
from tokencredit.batch import REDUCED_SIGNALS, SIGNALS, RolloutBatch


@st.composite
def batches(draw):
    """(RolloutBatch with every signal of SIGNALS, GRPO advantages A [N]) over random and degenerate shapes."""
    n_groups = draw(st.integers(1, 4))
    g = draw(st.integers(1, 5))
    t = draw(st.integers(1, 9))
    n = n_groups * g
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(draw(st.lists(st.integers(0, t), min_size=n, max_size=n)))
    mask = torch.arange(t)[None] < lengths[:, None]
    vocab = draw(st.sampled_from([1, 2, 5, 151_936]))  # vocab 1: every token is the same id
    ids = torch.randint(0, vocab, (n, t), generator=gen)
    scores = torch.tensor(draw(st.lists(st.sampled_from([0.0, 1.0, 0.5, -1.0]), min_size=n, max_size=n)))
    scale = draw(st.sampled_from([1e-12, 1.0, 1e6]))
    h = draw(st.integers(1, 4))
    lp = -torch.rand(n, t, generator=gen) * 5
    sig = {
        "old_log_probs": lp,
        "ref_log_probs": lp - 0.1,
        "base_log_probs": lp + 0.3 * torch.randn(n, t, generator=gen),
        "neg_log_probs": lp - torch.rand(n, t, generator=gen),
        "entropy": torch.rand(n, t, generator=gen) * 3,
        "sum_sq_probs": lp.exp() ** 2 + torch.rand(n, t, generator=gen) * (1 - lp.exp() ** 2),
        "hidden": torch.randn(n, t, h, generator=gen) * draw(st.sampled_from([0.0, 1.0, 1e3])),
    }
    sig["base_hidden"] = sig["hidden"] + draw(st.sampled_from([0.0, 0.1])) * torch.randn(
        n, t, h, generator=gen
    )
    # Monte-Carlo advantages: any finite values, 0 where the engine skipped a state
    mc = torch.randn(n, t, generator=gen) * scale * (torch.rand(n, t, generator=gen) < 0.5)
    sig["mc_advantages"] = mc * mask
    sig["mc_step_advantages"] = mc.flip(-1) * mask
    # every signal but the reduced ones, which stand in for hidden states (tests/credit/test_reduced.py)
    assert set(sig) == set(SIGNALS) - set(REDUCED_SIGNALS)
    batch = RolloutBatch(ids, mask, torch.arange(n_groups).repeat_interleave(g), scores, **sig)
    adv = advantages.grpo(scores, batch.group_ids) * scale
    return batch, adv


# Methods whose credit may be non-zero on a rollout with A = 0: KTAE (additive key values, documented
# there) and the Monte-Carlo methods, whose credit is the sampled values' difference, not a share of A.
SIGNED_AT_ZERO_ADVANTAGE = frozenset({"ktae", "oracle", "vineppo"})


def check_credit_contract(name: str, batch: RolloutBatch, adv: torch.Tensor) -> torch.Tensor:
    """The contract every registered credit method meets on any batch of `batches()`; returns its Â.

    Â is [N,T] float32, finite, exactly 0 on padding and detached; a rollout with A = 0 gets no signed
    credit unless `name` is in SIGNED_AT_ZERO_ADVANTAGE. Also used by tests/test_extending.py.
    """
    out = credit.compute(name, batch, adv)
    assert out.shape == batch.mask.shape and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert (out[~batch.mask] == 0).all()
    assert not out.requires_grad
    if name not in SIGNED_AT_ZERO_ADVANTAGE:
        zero = (adv == 0)[:, None] & batch.mask
        assert (out[zero] == 0).all()
    return out


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches(), st.sampled_from(sorted(credit.CREDIT_METHODS)))
def test_every_method_is_finite_zero_on_padding_and_detached(data, name):
    check_credit_contract(name, *data)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@settings(max_examples=40, deadline=None)
@given(batches(), st.sampled_from(["arca", "surprisal", "entropy-reduction", "policy-divergence"]))
def test_salience_methods_keep_each_completion_mean_equal_to_A(data, name):
    batch, adv = data
    out = credit.compute(name, batch, adv).double()
    n = batch.mask.sum(-1)
    rows = n > 0
    mean = out.sum(-1)[rows] / n[rows]
    torch.testing.assert_close(
        mean, adv.double()[rows], rtol=1e-4, atol=1e-6 * max(1.0, float(adv.abs().max()))
    )


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@settings(max_examples=40, deadline=None)
@given(batches(), st.sampled_from(["delta", "gcpo"]))
def test_multiplicative_methods_keep_the_sign_of_A(data, name):
    batch, adv = data
    out = credit.compute(name, batch, adv)
    signs = torch.sign(adv)[:, None].expand_as(out)
    nz = batch.mask & (out != 0)
    assert (torch.sign(out)[nz] == signs[nz]).all()

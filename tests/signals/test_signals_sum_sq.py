"""sum_sq_probs (sum_v pi_old(v)^2, the optimal token baseline's signal) from the one chunked signals pass."""

from __future__ import annotations

import pytest
import torch
from test_signals import CountForwards, P, T, make_batch, tiny_model

from tokencredit.signals import compute_signals
from tokencredit.signals.head import _chunked_stats


def naive_sum_sq(model, seq, am, rmask, temperature):
    pos = (am.cumsum(-1) - 1).clamp(min=0) * am
    with torch.no_grad():
        logits = model(input_ids=seq, attention_mask=am, position_ids=pos).logits[:, P - 1 : -1].float()
    probs = torch.softmax(logits / temperature, -1)
    return (probs * probs).sum(-1) * rmask.float()


@pytest.mark.parametrize("chunk_size", [1, 4, 10_000])
@pytest.mark.parametrize("with_others", [False, True])
def test_sum_sq_probs_matches_the_full_softmax(chunk_size, with_others):
    model = tiny_model()
    seq, am, rm = make_batch()
    needs = {"sum_sq_probs"} | ({"old_log_probs", "entropy"} if with_others else set())
    for temperature in (1.0, 0.7):
        with CountForwards(model) as c:
            got = compute_signals(
                model, seq, am, P, rm, needs, temperature=temperature, chunk_size=chunk_size
            )
        assert c.n == 1  # one old-policy forward for all of them
        assert set(got) == needs
        v = got["sum_sq_probs"]
        assert v.dtype == torch.float32 and v.shape == (5, T) and not v.requires_grad
        torch.testing.assert_close(v, naive_sum_sq(model, seq, am, rm, temperature), atol=1e-6, rtol=1e-5)
        assert torch.equal(v[~rm], torch.zeros(int((~rm).sum())))
        # sum_v p_v^2 lies in [p_y^2, 1]
        if with_others:
            p_y = got["old_log_probs"].exp()
            assert bool((v[rm] >= p_y[rm] ** 2 - 1e-6).all()) and bool((v[rm] <= 1 + 1e-6).all())


def test_differentiable_chunk_path_agrees_with_the_inplace_one():
    torch.manual_seed(3)
    head = torch.nn.Linear(16, 97, bias=False)
    h = torch.randn(23, 16) * 3
    y = torch.randint(0, 97, (23,))
    kw = dict(temperature=1.3, with_entropy=True, with_sum_sq=True, chunk_size=5, logit_softcap=None)
    with torch.no_grad():
        lp, ent, sq = _chunked_stats(h, head, y, **kw)
    lp_g, ent_g, sq_g = _chunked_stats(h.requires_grad_(True), head, y, **kw)
    full = torch.softmax(head(h.detach()) / 1.3, -1)
    torch.testing.assert_close(sq, (full * full).sum(-1), atol=1e-6, rtol=1e-5)
    for a, b in ((lp, lp_g), (ent, ent_g), (sq, sq_g)):
        torch.testing.assert_close(a, b.detach(), atol=1e-5, rtol=1e-5)
    assert sq_g.requires_grad

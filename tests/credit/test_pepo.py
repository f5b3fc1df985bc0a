"""PEPO's proximal entropy and token weights (docs/spec/pepo.md), and the 80/20 rule's proximal frame."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tokencredit import credit
from tokencredit.batch import RolloutBatch
from tokencredit.credit.entropy import proximal_entropy, top_entropy_mask
from tokencredit.credit.pepo import proximal_weights
from tokencredit.errors import ConfigError

# docs/spec/pepo.md#test-vectors
H = [0.0, 1.0, 0.0, 2.0, 0.5]
E_W3 = [0.155362, 0.576117, 0.090031, 0.736125, 0.100368]
C_W3 = [0.468523, 1.737383, 0.271503, 2.219915, 0.302676]
C_W5 = [0.713322, 1.103400, 0.437479, 2.207346, 0.538453]
C_W3_TAU2 = [0.724755, 1.407368, 0.580322, 1.692486, 0.595069]


def _row(values: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([values]), torch.ones(1, len(values), dtype=torch.bool)


def _reference(entropy: torch.Tensor, mask: torch.Tensor, window: int, tau: float = 1.0) -> np.ndarray:
    """Eq. 6 and 7 by a loop over rows: numpy's reflect padding of each row's valid entropies."""
    out = np.zeros(entropy.shape)
    half = window // 2
    for i in range(entropy.shape[0]):
        pos = mask[i].nonzero().squeeze(-1).numpy()
        if pos.size == 0:
            continue
        h = entropy[i, pos].double().numpy() / tau
        ex = np.exp(np.pad(h, half, mode="reflect"))
        e = np.exp(h) / np.array([ex[t : t + 2 * half + 1].sum() for t in range(h.size)])
        out[i, pos] = e / e.sum() * h.size
    return out


def _batch(entropy: torch.Tensor, mask: torch.Tensor, scores: list[float]) -> RolloutBatch:
    n, t = mask.shape
    return RolloutBatch(
        token_ids=torch.zeros(n, t, dtype=torch.long),
        mask=mask,
        group_ids=torch.zeros(n, dtype=torch.long),
        scores=torch.tensor(scores),
        entropy=entropy,
    )


def test_spec_vectors():
    h, m = _row(H)
    torch.testing.assert_close(
        proximal_entropy(h, m, 3)[0], torch.tensor(E_W3, dtype=torch.float64), atol=1e-6, rtol=0
    )
    for window, tau, want in ((3, 1.0, C_W3), (5, 1.0, C_W5), (3, 2.0, C_W3_TAU2)):
        c = proximal_weights(h, m, window, tau)[0]
        torch.testing.assert_close(c, torch.tensor(want, dtype=torch.float64), atol=1e-6, rtol=0)
        assert float(c.sum()) == pytest.approx(5.0, abs=1e-12)


@pytest.mark.parametrize("window", [1, 3, 4, 7, 101])
def test_matches_a_loop_over_rows_with_ragged_lengths_and_holes(window):
    gen = torch.Generator().manual_seed(window)
    ent = torch.rand(6, 13, generator=gen) * 3
    lengths = torch.tensor([13, 9, 2, 1, 0, 6])
    mask = torch.arange(13)[None] < lengths[:, None]
    mask[0, [3, 4, 10]] = False  # holes: the window runs over the valid tokens in order
    ent[~mask] = float("nan")  # padding garbage never leaks
    got = proximal_weights(ent, mask, window)
    np.testing.assert_allclose(got.numpy(), _reference(ent, mask, window), atol=1e-12)
    assert bool((got[~mask] == 0).all())


def test_weights_ignore_padding_and_other_rows():
    gen = torch.Generator().manual_seed(3)
    ent = torch.rand(3, 8, generator=gen)
    mask = torch.arange(8)[None] < torch.tensor([[8], [5], [3]])
    wide = torch.cat([ent, torch.full((3, 4), 7.0)], 1)
    wide_mask = torch.cat([mask, torch.zeros(3, 4, dtype=torch.bool)], 1)
    c = proximal_weights(ent, mask, 5)
    torch.testing.assert_close(proximal_weights(wide, wide_mask, 5)[:, :8], c)
    torch.testing.assert_close(proximal_weights(ent[1:2], mask[1:2], 5), c[1:2])


def test_invariant_to_a_per_response_shift():
    """Proposition 1 (i): adding a constant to a response's entropies (prompt difficulty) changes nothing."""
    gen = torch.Generator().manual_seed(4)
    ent = torch.rand(3, 10, generator=gen)
    mask = torch.ones(3, 10, dtype=torch.bool)
    shifted = ent + torch.tensor([[0.0], [5.0], [-2.0]])
    torch.testing.assert_close(proximal_entropy(shifted, mask, 5), proximal_entropy(ent, mask, 5))


def test_ties_one_token_and_empty_rows():
    mask = torch.arange(4)[None] < torch.tensor([[4], [1], [0]])
    ent = torch.tensor([[0.7] * 4, [2.0, 0, 0, 0], [0.0] * 4])
    e = proximal_entropy(ent, mask, 101)
    assert e[0].tolist() == pytest.approx(
        [1 / 101] * 4
    )  # the window repeats the reflection: 101 equal values
    c = proximal_weights(ent, mask, 101)
    assert c[0].tolist() == pytest.approx([1.0] * 4) and c[1, 0].item() == pytest.approx(1.0)
    assert c[1, 1:].tolist() == [0.0] * 3 and c[2].tolist() == [0.0] * 4


def test_bf16_entropy_is_read_as_its_values():
    gen = torch.Generator().manual_seed(5)
    ent = (torch.rand(2, 9, generator=gen) * 2).bfloat16()
    mask = torch.ones(2, 9, dtype=torch.bool)
    c = proximal_weights(ent, mask, 3)
    assert c.dtype == torch.float64
    torch.testing.assert_close(c, proximal_weights(ent.float(), mask, 3))


def test_pepo_weights_positive_rollouts_only():
    ent = torch.tensor([H, H, H, H])
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[3, 2:] = False
    batch = _batch(ent, mask, [1.0, 0.0, 0.0, 1.0])
    adv = torch.tensor([0.8, -0.6, 0.0, 0.5])
    out = credit.compute("pepo", batch, adv, window=3)
    torch.testing.assert_close(out[0], 0.8 * torch.tensor(C_W3), atol=1e-6, rtol=0)
    assert out[1].tolist() == pytest.approx([-0.6] * 5)  # a failed rollout keeps the uniform A
    assert out[2].tolist() == [0.0] * 5  # A = 0 (e.g. an all-equal group) gives no credit
    assert float(out[3, :2].sum()) == pytest.approx(2 * 0.5) and out[3, 2:].tolist() == [0.0] * 3
    every = credit.compute("pepo", batch, adv, window=3, positive_only=False)
    torch.testing.assert_close(every[1], -0.6 * torch.tensor(C_W3), atol=1e-6, rtol=0)


def test_group_with_equal_rewards_gets_zero():
    from tokencredit import advantages

    batch = _batch(torch.rand(4, 6), torch.ones(4, 6, dtype=torch.bool), [1.0, 1.0, 1.0, 1.0])
    adv = advantages.grpo(batch.scores, batch.group_ids)
    assert bool((credit.compute("pepo", batch, adv) == 0).all())


def test_bad_parameters_are_one_clear_line():
    batch = _batch(torch.rand(2, 3), torch.ones(2, 3, dtype=torch.bool), [1.0, 0.0])
    adv = torch.tensor([1.0, -1.0])
    with pytest.raises(ConfigError, match="closest: window"):
        credit.compute("pepo", batch, adv, windw=5)
    with pytest.raises(ConfigError, match="closest: temperature"):
        credit.compute("pepo", batch, adv, temprature=2.0)
    with pytest.raises(ConfigError, match="closest: positive_only"):
        credit.compute("pepo", batch, adv, postive_only=False)
    for bad in ({"window": 0}, {"window": 2.5}, {"temperature": 0.0}, {"positive_only": "yes"}):
        with pytest.raises(ConfigError):
            credit.compute("pepo", batch, adv, **bad)
    ent = torch.rand(2, 3)
    ent[1, 2] = float("nan")  # RolloutBatch refuses it too; the function names the token itself
    with pytest.raises(ValueError, match=r"response 1, position 2"):
        proximal_weights(ent, torch.ones(2, 3, dtype=torch.bool))


def test_entropy_80_20_proximal_frame():
    gen = torch.Generator().manual_seed(6)
    ent = torch.rand(4, 12, generator=gen) * 2 + torch.tensor([[0.0], [3.0], [0.0], [1.0]])
    mask = torch.arange(12)[None] < torch.tensor([[12], [12], [7], [3]])
    batch = _batch(ent, mask, [1.0, 0.0, 1.0, 0.0])
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    default = credit.compute("entropy-80-20", batch, adv)
    assert torch.equal(default, credit.compute("entropy-80-20", batch, adv, frame="global"))
    prox = credit.compute("entropy-80-20", batch, adv, frame="proximal", window=5)
    keep = top_entropy_mask(proximal_entropy(ent, mask, 5), mask, 0.2)
    assert torch.equal(prox != 0, keep)
    # the global frame keeps mostly row 1 (its entropies are shifted up by 3); the proximal frame does not
    assert int((default[1] != 0).sum()) > int((prox[1] != 0).sum())
    with pytest.raises(ConfigError, match="closest: proximal"):
        credit.compute("entropy-80-20", batch, adv, frame="proximl")
    with pytest.raises(ConfigError, match="window"):
        credit.compute("entropy-80-20", batch, adv, window=-1)

"""Placebo controls (tokencredit.credit.placebo): the same update size, random placement."""

from __future__ import annotations

import pytest
import torch

from tokencredit.batch import RolloutBatch
from tokencredit.credit.placebo import PLACEBOS, apply_placebo
from tokencredit.errors import ConfigError
from tokencredit.recipes import resolve, token_credit


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    adv = torch.tensor([[1.0, 2.0, 3.0, 0.0, 0.0], [-0.5, 0.5, -2.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    seq = torch.tensor([2.0, -0.25, -1.0])
    ids = torch.arange(15).reshape(3, 5) * 7 % 11
    return adv, mask, seq, ids


def test_uniform_hand_vectors() -> None:
    adv, mask, seq, ids = _inputs()
    mean = apply_placebo("uniform-mean", adv, mask, seq, ids)
    torch.testing.assert_close(mean[0], torch.tensor([2.0, 2.0, 2.0, 0.0, 0.0]))
    torch.testing.assert_close(mean[1], torch.tensor([-0.25, -0.25, -0.25, -0.25, 0.0]))
    rms = apply_placebo("uniform-rms", adv, mask, seq, ids)
    r0 = (14 / 3) ** 0.5
    r1 = ((0.25 + 0.25 + 4 + 1) / 4) ** 0.5  # mean -0.25 < 0: negative sign
    torch.testing.assert_close(rms[0], torch.tensor([r0, r0, r0, 0.0, 0.0]))
    torch.testing.assert_close(rms[1], torch.tensor([-r1, -r1, -r1, -r1, 0.0]))
    # a row of zero credit stays zero; RMS (and the row's sum for uniform-mean) are kept
    assert rms[2].abs().sum() == 0 and mean[2].abs().sum() == 0
    torch.testing.assert_close((rms**2).sum(-1), (adv**2).sum(-1))
    torch.testing.assert_close(mean.sum(-1), adv.sum(-1))


def test_rms_sign_falls_back_to_the_sequence_advantage() -> None:
    adv = torch.tensor([[1.0, -1.0, 0.0]])
    mask = torch.tensor([[True, True, False]])
    out = apply_placebo("uniform-rms", adv, mask, torch.tensor([-3.0]), torch.tensor([[4, 5, 6]]))
    torch.testing.assert_close(out, torch.tensor([[-1.0, -1.0, 0.0]]))


def test_permute_keeps_each_rows_values_and_moves_them() -> None:
    torch.manual_seed(0)
    n, t = 64, 40
    lengths = torch.randint(1, t + 1, (n,))
    mask = torch.arange(t)[None, :] < lengths[:, None]
    adv = torch.randn(n, t) * mask
    ids = torch.randint(0, 1000, (n, t))
    out = apply_placebo("permute", adv, mask, adv.mean(-1), ids)
    assert (out[~mask] == 0).all()
    for i in range(n):
        k = int(lengths[i])
        torch.testing.assert_close(out[i, :k].sort().values, adv[i, :k].sort().values)
    moved = (out != adv)[mask].float().mean()
    assert moved > 0.8  # a random permutation fixes about one position per row
    # a function of the rows alone: the same rows in another order (another rank split) permute the same way
    perm = torch.randperm(n)
    again = apply_placebo("permute", adv[perm], mask[perm], adv.mean(-1)[perm], ids[perm])
    torch.testing.assert_close(again, out[perm])
    # bf16 values are moved, not rounded
    bf = apply_placebo("permute", adv.bfloat16(), mask, adv.mean(-1), ids)
    assert bf.dtype == torch.bfloat16
    torch.testing.assert_close(bf.float().sort(-1).values, adv.bfloat16().float().sort(-1).values)


def test_permute_is_uniform_over_positions() -> None:
    # position 0's value lands on each of the 4 positions about equally often over many rows
    n = 4000
    mask = torch.ones(n, 4, dtype=torch.bool)
    adv = torch.tensor([[1.0, 0.0, 0.0, 0.0]]).expand(n, 4)
    ids = torch.arange(n)[:, None] * 4 + torch.arange(4)
    out = apply_placebo("permute", adv, mask, torch.ones(n), ids)
    share = out.mean(0)
    assert torch.allclose(share, torch.full((4,), 0.25), atol=0.03), share


def test_outside_the_loss_tokens_nothing_changes() -> None:
    adv, mask, seq, ids = _inputs()
    loss = mask.clone()
    loss[1, 0] = False  # a valid token outside a kept set
    for name in PLACEBOS:
        out = apply_placebo(name, adv, loss, seq, ids)
        assert out[1, 0] == adv[1, 0]


def test_unknown_placebo_names_the_closest() -> None:
    adv, mask, seq, ids = _inputs()
    with pytest.raises(ConfigError, match="closest: permute"):
        apply_placebo("permut", adv, mask, seq, ids)
    with pytest.raises(ConfigError, match="placebo 'uniform'.*closest: uniform-rms|closest: uniform-mean"):
        resolve("grpo", {"placebo": "uniform"})


def _batch() -> RolloutBatch:
    torch.manual_seed(1)
    n, t = 8, 12
    lengths = torch.randint(3, t + 1, (n,))
    mask = torch.arange(t)[None, :] < lengths[:, None]
    return RolloutBatch(
        token_ids=torch.randint(0, 50, (n, t)),
        mask=mask,
        group_ids=torch.arange(n) // 4,
        scores=torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0]),
        old_log_probs=-torch.rand(n, t),
        entropy=torch.rand(n, t) * 2,
    )


def test_the_pipeline_applies_the_recipes_placebo() -> None:
    batch = _batch()
    base = token_credit(resolve("entropy-advantage"), batch)
    for name in ("permute", "uniform-rms", "uniform-mean"):
        tc = token_credit(resolve("entropy-advantage", {"placebo": name}), batch)
        want = apply_placebo(
            name, base.token_advantages, base.loss_mask, base.seq_advantages, batch.token_ids
        )
        torch.testing.assert_close(tc.token_advantages, want)
        assert not torch.equal(tc.token_advantages, base.token_advantages)
    # S-trace: its credit is in its kernel (trace weights over a kept set of high-entropy tokens); the
    # placebo moves the effective credit, kept set included, and trains it with the per-token ratio
    st = token_credit(resolve("strace"), batch)
    assert st.keep is not None and not st.keep[batch.mask].all()
    eff = st.effective()
    tc = token_credit(resolve("strace", {"placebo": "permute"}), batch)
    assert tc.recipe.kernel == "token" and tc.keep is None and torch.equal(tc.loss_mask, tc.mask)
    for i in range(batch.mask.shape[0]):
        m = batch.mask[i]
        torch.testing.assert_close(tc.token_advantages[i][m].sort().values, eff[i][m].sort().values)
    assert not torch.equal(tc.token_advantages, eff)
    # the per-token objective's effective credit of the placebo arm is the placebo itself
    torch.testing.assert_close(tc.effective(), tc.token_advantages)
    # GRPO's uniform credit is its own placebo
    grpo = token_credit(resolve("grpo"), batch)
    for name in PLACEBOS:
        torch.testing.assert_close(
            token_credit(resolve("grpo", {"placebo": name}), batch).token_advantages, grpo.token_advantages
        )

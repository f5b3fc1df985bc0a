"""Effective (on-policy) credit: docs/spec/strace.md#worked-example, per-token kernels give Â, mass conservation."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tokencredit import advantages, credit
from tokencredit.batch import RolloutBatch
from tokencredit.credit.entropy import top_entropy_mask
from tokencredit.errors import ConfigError
from tokencredit.objectives import ObjectiveArgs, effective_credit
from tokencredit.recipes import RECIPES, credit_needs, token_credit

ONE_ROW = torch.ones(1, 4, dtype=torch.bool)
ENTROPY = torch.tensor([[2.1, 0.05, 1.3, 0.02]])


def ragged_batch(seed: int = 0, n_groups: int = 3, g: int = 4, t: int = 9, h: int = 6) -> RolloutBatch:
    """A batch with every signal (random, but valid), ragged lengths, an empty row and mixed rewards."""
    gen = torch.Generator().manual_seed(seed)
    n = n_groups * g
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    lengths[0], lengths[1] = t, 0
    mask = torch.arange(t)[None, :] < lengths[:, None]
    scores = torch.randint(0, 2, (n,), generator=gen).float()
    scores[:g] = torch.tensor([1.0, 0.0, 1.0, 0.0])[:g]
    logp = -torch.rand(n, t, generator=gen) * 3 - 0.01
    return RolloutBatch(
        token_ids=torch.randint(0, 12, (n, t), generator=gen),
        mask=mask,
        group_ids=torch.arange(n_groups).repeat_interleave(g),
        scores=scores,
        old_log_probs=logp * mask,
        ref_log_probs=(logp - 0.1) * mask,
        entropy=torch.rand(n, t, generator=gen) * 3 * mask,
        hidden=torch.randn(n, t, h, generator=gen),
        base_hidden=torch.randn(n, t, h, generator=gen),
        base_log_probs=(logp - 0.2) * mask,
        neg_log_probs=(logp - 0.3) * mask,
        sum_sq_probs=(logp.exp() ** 2 + torch.rand(n, t, generator=gen) * (1 - logp.exp() ** 2)) * mask,
        truncated=torch.zeros(n, dtype=torch.bool),
        baseline_scores=torch.randint(0, 2, (n,), generator=gen).float(),
        mc_advantages=torch.randn(n, t, generator=gen) * mask,
        mc_step_advantages=torch.randn(n, t, generator=gen) * mask,
    )


def test_ptrace_worked_example():
    # docs/spec/strace.md#worked-example: on-policy credit [0.385714, 0.271429, 0.209524, 0.133333] (token-mean over T = 4), x T
    got = effective_credit(
        torch.ones(1, 4), ONE_ROW, ObjectiveArgs(kernel="ptrace", kernel_args={"lam": 0.5})
    )
    want = torch.tensor([[0.385714, 0.271429, 0.209524, 0.133333]]) * 4
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_gspo_gives_every_token_weight_one_over_length():
    got = effective_credit(torch.ones(1, 4), ONE_ROW, ObjectiveArgs(kernel="gspo"))
    torch.testing.assert_close(got, torch.ones(1, 4))


@pytest.mark.parametrize(
    ("decay", "want"), [("kept", [4 / 3, 0.0, 2 / 3, 0.0]), ("position", [1.2, 0.0, 0.8, 0.0])]
)
def test_strace_worked_example(decay, want):
    keep = top_entropy_mask(ENTROPY, ONE_ROW, 0.5, "sequence")
    assert keep.tolist() == [[True, False, True, False]]
    args = ObjectiveArgs(kernel="strace", kernel_args={"lam": 0.5, "keep": keep, "decay": decay})
    got = effective_credit(torch.ones(1, 4), ONE_ROW, args)
    # docs/spec/strace.md#worked-example: 0.666667 and 0.333333 with |M| normalisation, times |M| = 2
    torch.testing.assert_close(got, torch.tensor([want]), atol=1e-6, rtol=0)
    assert got[0, 1].item() == 0.0 and got[0, 3].item() == 0.0


@pytest.mark.parametrize(
    ("loss", "kernel", "args"),
    [
        ("ppo-clip", "token", {}),
        ("ppo-clip", "gspo-token", {}),
        ("reinforce", "token", {}),
        ("ppo-clip", "ptrace", {"lam": 0.0}),
        ("ppo-clip", "accumulating", {"lam": 0.0}),
    ],
)
def test_per_token_kernels_reproduce_the_advantages(loss, kernel, args):
    b = ragged_batch(1)
    a_hat = torch.randn(b.mask.shape, generator=torch.Generator().manual_seed(3)) * b.mask
    objective = ObjectiveArgs(loss=loss, kernel=kernel, kernel_args=args)
    got = effective_credit(a_hat, b.mask, objective, old_log_probs=b.old_log_probs)
    torch.testing.assert_close(got, a_hat, atol=1e-6, rtol=1e-6)
    assert bool((got[~b.mask] == 0).all()) and got.dtype == torch.float32 and not got.requires_grad


@pytest.mark.parametrize("name", [r.name for r in RECIPES.values() if r.per_token])
def test_recipes_with_per_token_kernels_show_their_credit_methods_advantages(name):
    recipe = RECIPES[name]
    b = ragged_batch(2)
    if (
        "values" in advantages.get_estimator(recipe.advantage).fields
    ):  # ppo, bpco: as the trainer's critic gives
        b = dataclasses.replace(
            b, values=torch.rand(b.mask.shape, generator=torch.Generator().manual_seed(3)) * b.mask
        )
    rc = token_credit(recipe, b)
    a = advantages.estimate(
        recipe.advantage, b, **recipe.advantage_params
    )  # A [N], or A [N,T] (REINFORCE++, OTB)
    want = credit.compute(recipe.credit, b, a, **recipe.credit_params)
    torch.testing.assert_close(rc.effective(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rc.token_advantages, want)
    # the shortcut TokenCredit.effective takes for per-token objectives equals the autograd path
    token_mean = dataclasses.replace(rc.objective, loss_agg_mode="token-mean")
    by_autograd = effective_credit(rc.token_advantages, rc.mask, token_mean)
    torch.testing.assert_close(rc.effective(), by_autograd, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", ["gspo", "ptrace", "strace"])
def test_trace_and_sequence_kernels_conserve_each_rows_credit(name):
    # Each kernel row e[t, .] sums to 1, so under token-mean sum_k Â_eff[k] = sum over loss tokens of Â_t.
    recipe = RECIPES[name]
    b = ragged_batch(4)
    rc = token_credit(recipe, b)
    lm = rc.loss_mask
    eff = rc.effective()
    torch.testing.assert_close(
        eff.double().sum(-1), (rc.token_advantages.double() * lm).sum(-1), atol=1e-5, rtol=1e-5
    )
    assert bool((eff[~lm] == 0).all())
    if name == "strace":
        assert bool(lm.sum() < b.mask.sum())  # only the kept (high-entropy) tokens carry credit


def test_gspo_spreads_the_row_mean():
    b = ragged_batch(5)
    a_hat = torch.randn(b.mask.shape, generator=torch.Generator().manual_seed(6)) * b.mask
    got = effective_credit(a_hat, b.mask, ObjectiveArgs(kernel="gspo"))
    mean = a_hat.sum(-1) / b.mask.sum(-1).clamp(min=1)
    torch.testing.assert_close(got, (mean[:, None] * b.mask).float(), atol=1e-6, rtol=1e-6)


def test_result_does_not_depend_on_the_point_log_probs():
    b = ragged_batch(7)
    a_hat = torch.randn(b.mask.shape, generator=torch.Generator().manual_seed(8)) * b.mask
    args = ObjectiveArgs(kernel="ptrace", kernel_args={"lam": 0.9})
    torch.testing.assert_close(
        effective_credit(a_hat, b.mask, args, old_log_probs=b.old_log_probs),
        effective_credit(a_hat, b.mask, args),
    )


def test_other_aggregations_rescale_rows():
    b = ragged_batch(9)
    a_hat = torch.randn(b.mask.shape, generator=torch.Generator().manual_seed(10)) * b.mask
    got = effective_credit(a_hat, b.mask, ObjectiveArgs(loss_agg_mode="seq-mean-token-mean"))
    lens = b.mask.sum(-1).double()
    n_seq = float((lens > 0).sum())
    want = a_hat.double() * b.mask.sum() / (n_seq * lens.clamp(min=1))[:, None]
    torch.testing.assert_close(got, want.float(), atol=1e-5, rtol=1e-5)


def test_truncated_rows_leave_the_loss_when_the_recipe_masks_them():
    b = ragged_batch(11)
    b.truncated[2] = True
    recipe = RECIPES["dapo"].with_overrides(mask_truncated=True)
    eff = token_credit(recipe, b).effective()
    assert bool((eff[2] == 0).all()) and bool(eff[0].abs().sum() > 0)


def test_needs_leave_out_the_ratio_and_kl_signals():
    assert credit_needs(RECIPES["strace"]) == {"entropy"}
    assert credit_needs(RECIPES["grpo+ktae"]) == set()
    assert credit_needs(RECIPES["delta"]) == {"hidden", "old_log_probs"}


def test_empty_loss_set_and_bad_inputs():
    m = torch.zeros(2, 3, dtype=torch.bool)
    assert bool((effective_credit(torch.ones(2, 3), m) == 0).all())
    with pytest.raises(ValueError, match="shape"):
        effective_credit(torch.ones(2, 4), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="non-finite advantage at rollout 1, token 2"):
        effective_credit(
            torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, float("nan")]]), torch.ones(2, 3, dtype=torch.bool)
        )
    with pytest.raises(ConfigError, match="keep"):
        effective_credit(torch.ones(1, 4), ONE_ROW, ObjectiveArgs(kernel="strace", kernel_args={"lam": 0.5}))

"""`ObjectiveArgs`: validated on construction, read-only, cut to micro-batches; the recipe builds it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tokencredit import objectives
from tokencredit.errors import ConfigError
from tokencredit.objectives import ObjectiveArgs, policy_loss
from tokencredit.recipes import RECIPES


def test_defaults_are_ppo_clip_with_the_per_token_ratio():
    args = ObjectiveArgs()
    assert (args.loss, args.kernel, args.loss_agg_mode, args.kl_coef, args.kl_type) == (
        "ppo-clip",
        "token",
        "token-mean",
        0.0,
        "k3",
    )
    assert (
        args.uses_ratio
        and args.keep is None
        and dict(args.loss_params) == {}
        and dict(args.kernel_args) == {}
    )


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"loss": "ppo-clp"}, "closest: ppo-clip"),
        ({"loss_params": {"eps_hgh": 0.2}}, "closest: eps_high"),
        ({"kernel": "gsp"}, "closest: gspo"),
        ({"kernel": "ptrace", "kernel_args": {"lamb": 0.5}}, "closest: lam"),
        ({"kernel": "token", "kernel_args": {"lam": 0.5}}, "no parameter 'lam'"),
        ({"loss": "reinforce", "kernel": "gspo"}, "no importance ratio"),
        ({"loss": "reinforce", "kernel_args": {"lam": 0.5}}, "no importance ratio"),
        ({"loss_agg_mode": "seq-mean"}, "unknown loss_agg_mode"),
        ({"kl_type": "k4"}, "kl_type"),
    ],
)
def test_bad_settings_are_config_errors_on_construction(fields, match):
    with pytest.raises(ConfigError, match=match):
        ObjectiveArgs(**fields)


def test_mappings_are_read_only_copies():
    params = {"eps_low": 0.1}
    args = ObjectiveArgs(loss_params=params)
    params["eps_low"] = 0.5
    assert args.loss_params["eps_low"] == 0.1
    with pytest.raises(TypeError):
        args.loss_params["eps_low"] = 0.3  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.loss = "cispo"  # type: ignore[misc]


def test_rows_cuts_the_kept_set_and_micro_batches_add_up():
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(6, 5, generator=g) > 0.2
    keep = mask & (torch.rand(6, 5, generator=g) > 0.5)
    args = ObjectiveArgs(kernel="strace", kernel_args={"lam": 0.9, "keep": keep, "decay": "kept"})
    assert args.keep is keep and args.rows(None) is args
    rows = torch.tensor([1, 4])
    cut = args.rows(rows)
    assert torch.equal(cut.keep, keep[rows]) and cut.kernel_args["lam"] == 0.9 and cut.kernel == "strace"
    assert ObjectiveArgs(kernel="ptrace", kernel_args={"lam": 0.5}).rows(rows).kernel_args["lam"] == 0.5

    old = -torch.rand(6, 5, generator=g, dtype=torch.float64)
    logp = (old + 0.1 * torch.randn(6, 5, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(6, 5, generator=g, dtype=torch.float64)
    full, _ = policy_loss(logp, old, adv, mask, args)
    n_tok = float((mask & keep).sum())
    parts = [
        policy_loss(logp[r], old[r], adv[r], mask[r], args.rows(r), global_tokens=n_tok)[0]
        for r in torch.arange(6).tensor_split(3)
    ]
    torch.testing.assert_close(sum(parts), full)


def test_the_recipe_builds_the_args():
    recipe = RECIPES["dapo"]
    args = recipe.objective_args(max_response_length=64)
    assert args.loss == recipe.loss and args.kernel == recipe.kernel
    assert dict(args.loss_params) == recipe.loss_arguments()
    assert args.loss_agg_mode == recipe.loss_agg_mode and args.kl_coef == recipe.kl_coef
    assert args.norm_constant == (recipe.norm_constant or 64)
    reinforce = RECIPES["dapo"].with_overrides(loss="reinforce", kernel="token")
    assert (
        dict(reinforce.objective_args({"lam": 0.5}).kernel_args) == {}
    )  # a loss without a ratio reads no kernel
    with pytest.raises(ConfigError, match="no parameter"):
        recipe.objective_args({"no_such_argument": 1})
    assert objectives.ObjectiveArgs is type(args)

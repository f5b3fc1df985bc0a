import pytest

from tokencredit import advantages, credit, objectives
from tokencredit.errors import ConfigError
from tokencredit.recipes import RECIPES, get_recipe, recipe_needs, requires_lora

REQUIRED = [
    "grpo", "dr-grpo", "rloo", "dapo", "gspo", "entropy-80-20", "grpo+ktae", "dapo+ktae", "delta",
    "ptrace", "strace", "arca", "surprisal", "entropy-reduction", "policy-divergence", "gcpo",
]  # fmt: skip


def test_every_named_recipe_exists_and_refers_to_registered_pieces():
    for name in REQUIRED:
        r = get_recipe(name)
        assert r.paper
        assert r.advantage in advantages.ESTIMATORS
        m = credit.get(r.credit)
        assert set(r.credit_params) <= set(m.defaults), (name, r.credit_params, m.defaults)
        assert r.loss in objectives.LOSSES and r.kernel in objectives.KERNELS
        assert r.loss_agg_mode in objectives.AGG_MODES
    assert set(REQUIRED) <= set(RECIPES)


def test_needs_and_lora_flags():
    assert recipe_needs(get_recipe("grpo")) == {"old_log_probs"}
    assert "entropy" in recipe_needs(get_recipe("strace"))
    assert "ref_log_probs" in recipe_needs(get_recipe("grpo+ktae"))
    assert {"hidden", "old_log_probs"} <= recipe_needs(get_recipe("delta"))
    assert requires_lora(get_recipe("arca")) and not requires_lora(get_recipe("dapo"))


def test_unknown_recipe_and_override():
    with pytest.raises(ConfigError, match="closest: dapo"):
        get_recipe("dapoo")
    r = get_recipe("dapo").with_overrides(eps_high=0.3)
    assert r.eps_high == 0.3 and get_recipe("dapo").eps_high == 0.28
    with pytest.raises(ConfigError, match="eps_high"):
        get_recipe("dapo").with_overrides(eps_hgh=0.3)

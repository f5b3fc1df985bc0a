import pytest

from tokencredit import advantages, credit, objectives
from tokencredit.builder import needs_of
from tokencredit.errors import ConfigError
from tokencredit.recipes import RECIPES, get_recipe, requires_lora, resolve

REQUIRED = [
    "grpo",
    "dr-grpo",
    "rloo",
    "dapo",
    "gspo",
    "entropy-80-20",
    "grpo+ktae",
    "dapo+ktae",
    "delta",
    "ptrace",
    "strace",
    "arca",
    "surprisal",
    "entropy-reduction",
    "policy-divergence",
    "gcpo",
    # issue 20: verl's and TRL's losses and estimators, GRPO(lambda), two token shapings
    "cispo",
    "sapo",
    "clip-cov",
    "kl-cov",
    "gmpo",
    "gpg",
    "dppo-kl",
    "dppo-tv",
    "reinforce++",
    "remax",
    "opo",
    "grpo-passk",
    "otb",
    "grpo-lambda",
    "entropy-advantage",
    "advantage-reweighting",
]


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
    assert needs_of(get_recipe("grpo"), objective=True).signals == {"old_log_probs"}
    assert "entropy" in needs_of(get_recipe("strace"), objective=True).signals
    assert "ref_log_probs" in needs_of(get_recipe("grpo+ktae"), objective=True).signals
    assert {"hidden", "old_log_probs"} <= needs_of(get_recipe("delta"), objective=True).signals
    assert requires_lora(get_recipe("arca")) and not requires_lora(get_recipe("dapo"))


def test_unknown_recipe_and_override():
    with pytest.raises(ConfigError, match="closest: dapo"):
        get_recipe("dapoo")
    r = get_recipe("dapo").with_overrides(eps_high=0.3)
    assert r.eps_high == 0.3 and get_recipe("dapo").eps_high == 0.28
    with pytest.raises(ConfigError, match="eps_high"):
        get_recipe("dapo").with_overrides(eps_hgh=0.3)


def test_new_pieces_declare_what_they_read():
    assert needs_of(get_recipe("otb")).signals == {
        "old_log_probs",
        "sum_sq_probs",
    }  # before the update: no fusing
    assert (
        needs_of(get_recipe("remax")).fields == {"baseline_scores"}
        and not needs_of(get_recipe("grpo")).fields
    )
    assert "entropy" in needs_of(get_recipe("entropy-advantage")).signals
    assert "old_log_probs" in needs_of(get_recipe("advantage-reweighting")).signals
    assert (
        needs_of(get_recipe("gpg"), objective=True).signals == frozenset()
    )  # REINFORCE loss: no old log-probs


def test_objective_labels_show_a_clip_only_for_losses_that_clip():
    assert (
        "clip" not in get_recipe("sapo").objective_label()
        and "clip" not in get_recipe("vespo").objective_label()
    )
    assert "clip 0.4/0.4" in get_recipe("gmpo").objective_label()
    assert get_recipe("grpo-lambda").objective_label().startswith("grpo-lambda, clip 0.2/0.2")


def test_new_recipes_validate_their_parameters():
    with pytest.raises(ConfigError, match="closest: trace"):
        resolve("grpo-lambda", {"kernel_params": {"traces": "both"}})
    with pytest.raises(ConfigError, match="closest: tau_pos"):
        resolve("sapo", {"loss_params": {"tau_po": 1.0}})
    with pytest.raises(ConfigError, match="no clip range"):
        resolve("sapo", {"eps_high": 0.3})
    with pytest.raises(ConfigError, match="token-level A"):
        resolve("reinforce++", {"credit": "delta"})
    assert resolve("reinforce++", {"credit": "entropy-advantage"}).credit == "entropy-advantage"
    # a verl loss composes with a token credit method
    assert resolve("cispo", {"credit": "ktae"}).loss == "cispo"

import tomllib

import pytest

from tokencredit.errors import ConfigError
from tokencredit.train.config import apply_set, dump_toml, load_config
from tokencredit.train.trainer import resolve_recipe


def test_defaults_toml_roundtrip(tmp_path):
    cfg = load_config(sets=["optim.lr=3e-4", "model.lora_targets=q_proj,v_proj", "run.progress=false"])
    assert (
        cfg.optim.lr == 3e-4 and cfg.model.lora_targets == ["q_proj", "v_proj"] and cfg.run.progress is False
    )
    p = tmp_path / "c.toml"
    p.write_text(dump_toml(cfg))
    again = load_config(p)
    assert again == cfg
    assert tomllib.loads(p.read_text())["optim"]["lr"] == 3e-4


def test_file_then_recipe_then_set(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[algo]\nrecipe = "grpo"\n[rollout]\ngroup_size = 4\n')
    cfg = load_config(p, sets=["rollout.group_size=6"], recipe="dapo")
    assert cfg.algo.recipe == "dapo" and cfg.rollout.group_size == 6


def test_recipe_overrides_merge_dicts():
    cfg = load_config(recipe="strace", sets=["algo.kernel_params.lam=0.9", "algo.eps_high=0.3"])
    r = resolve_recipe(cfg)
    assert r.kernel_params["lam"] == 0.9 and r.kernel_params["keep_ratio"] == 0.2 and r.eps_high == 0.3


@pytest.mark.parametrize(
    "assignment,match",
    [
        ("optim.lrr=1", r"unknown key optim.lrr \(closest: lr"),
        ("optim.learning_rate=1", r"unknown key optim.learning_rate; valid: beta1"),
        ("optimm.lr=1", r"unknown section \[optimm\] \(closest: optim\)"),
        ("optim.lr=fast", "expected a number"),
        ("rollout.group_size=2.5", "expected an integer"),
        ("run.progress=maybe", "true/false"),
        ("optim", "section.key=value"),
    ],
)
def test_bad_overrides_are_clear(assignment, match):
    with pytest.raises(ConfigError, match=match):
        apply_set(load_config(), assignment)


def test_bad_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")
    p = tmp_path / "bad.toml"
    p.write_text("[optim\nlr=1")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(p)
    p.write_text("[optim]\nlr_max = 1\n")
    with pytest.raises(ConfigError, match=str(p).replace("\\", "\\\\") + ".*optim.lr_max"):
        load_config(p)


def test_unknown_recipe_field_override():
    cfg = load_config(sets=["algo.eps_hgh=0.3"])
    with pytest.raises(ConfigError, match="eps_high"):
        resolve_recipe(cfg)

"""`tokencredit recipes`: one recipe as TOML that loads back as the same recipe, the closest name for a
typo, and tables and hyperparameters that fit an 80-column terminal (issue 31)."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest

from tokencredit import cli
from tokencredit.commands.recipes import DESCRIPTIVE, recipe_toml
from tokencredit.recipes import RECIPES, Recipe, resolve
from tokencredit.train.config import load_config

# every recipe, a credit method on its own, and one that shares its name with a recipe
NAMES = [*RECIPES, "uniform", "credit:surprisal"]


def _printed(capsys, *argv: str) -> str:
    assert cli.main(["recipes", *argv]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", NAMES)
def test_one_recipe_prints_as_toml_a_config_file_loads_back(name, capsys, tmp_path):
    text = _printed(capsys, name)
    assert tomllib.loads(text)["algo"]["recipe"] in (name, f"credit:{name}")
    path = tmp_path / "pasted.toml"
    path.write_text("[run]\nsteps = 3\n\n" + text)  # pasted into a config file of the user's
    cfg = load_config(path)
    assert cfg.run.steps == 3
    assert resolve(cfg.algo.recipe, cfg.algo.overrides) == resolve(name)


def test_every_hyperparameter_is_in_the_toml():
    strace = RECIPES["strace"]
    table = tomllib.loads(recipe_toml(strace))["algo"]["overrides"]
    fields = [f.name for f in dataclasses.fields(Recipe) if f.name not in DESCRIPTIVE]
    unset = [k for k in fields if getattr(strace, k) is None]  # TOML has no null: a comment says so
    assert sorted(table) == sorted(set(fields) - set(unset)) and unset == ["dual_clip", "norm_constant"]
    assert table["kernel_params"] == {"lam": 0.95, "keep_ratio": 0.2, "scope": "batch", "decay": "kept"}
    assert "# dual_clip = (unset)" in recipe_toml(strace)
    # REINFORCE has no clip range and no ratio: those fields are said to be unread, not written
    arca = recipe_toml(RECIPES["arca"])
    assert "# not read by policy loss 'reinforce': eps_low, eps_high, dual_clip, kernel," in arca
    assert "eps_low" not in tomllib.loads(arca)["algo"]["overrides"]


def test_an_unknown_name_names_the_closest(capsys):
    assert cli.main(["recipes", "dapo+ktea"]) == 2
    err = capsys.readouterr().err
    assert "unknown recipe or credit method 'dapo+ktea' (closest: dapo+ktae" in err


def test_the_table_fits_80_columns_and_shows_papers_when_wide(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out = _printed(capsys)
    assert all(len(line) <= 80 for line in out.splitlines())
    assert "…" not in out and "tokencredit recipes -v" in out  # nothing cut; the papers are a -v away
    assert all(name in out for name in RECIPES)
    monkeypatch.setenv("COLUMNS", "200")
    assert "Shao et al. 2024, DeepSeekMath" in _printed(capsys)


def test_verbose_lists_every_hyperparameter_as_key_value_lines(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out = _printed(capsys, "-v")
    assert all(len(line) <= 80 for line in out.splitlines())
    assert "{'" not in out  # no raw Python dict
    block = out[out.index("\ndapo  ") :].split("\n\n")[0]  # the dapo recipe's block
    assert "Yu et al. 2025, DAPO" in block and "eps_low = 0.2   eps_high = 0.28   dual_clip = 10.0" in block
    for f in dataclasses.fields(Recipe):
        if f.name not in DESCRIPTIVE:
            assert f"{f.name} = " in block, f.name

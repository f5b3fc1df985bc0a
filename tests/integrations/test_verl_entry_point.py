"""The verl.plugins entry point: a fresh process that only imports verl has tokencredit's estimators and losses.

verl 0.9 loads every entry point of the group at ``import verl`` (driver and Ray workers alike). Each
case starts a new interpreter with no VERL_USE_EXTERNAL_MODULES (unless the case sets it) whose first
PYTHONPATH entry holds a dist-info with pyproject.toml's entry points, so what is tested is what
``pip install tokencredit`` declares. The Ray-worker half is test_verl_e2e.py: its runs name no
tokencredit module in VERL_USE_EXTERNAL_MODULES, yet verl's trainer finds tc_ktae / tc_delta.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.extras  # needs tokencredit[verl]: skipped without it, run by `pytest -m extras`
pytest.importorskip(
    "verl", reason="verl is not installed (extra tokencredit[verl]; see docs/integrations.md)"
)
from tc_verl_support import PLUGIN_GROUP, child_env, declared_entry_points, entry_point_dir  # noqa: E402

import tokencredit.integrations.verl as tc_verl  # noqa: E402

CHILD = """
import json, sys, warnings
warnings.simplefilter("always")
{prelude}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import verl
from verl.trainer.ppo import core_algos
from verl.utils import import_utils
print(json.dumps({{
    "trl_check": getattr(import_utils.is_trl_available, "tokencredit_hook", False),
    "estimators": sorted(k for k in core_algos.ADV_ESTIMATOR_REGISTRY if k.startswith("tc_")),
    "losses": sorted(k for k in core_algos.POLICY_LOSS_REGISTRY if k.startswith("tc_")),
    "plugin_loaded": "tokencredit.integrations.verl" in sys.modules,
    "warnings": [str(w.message) for w in caught if "tokencredit" in str(w.message)],
}}))
"""


def test_pyproject_declares_the_plugin_entry_point():
    assert declared_entry_points()[PLUGIN_GROUP] == {"tokencredit": "tokencredit.integrations.verl.plugin"}


def _child(tmp_path, prelude: str = "", **env: str) -> dict:
    path = entry_point_dir(tmp_path / "ep")
    res = subprocess.run(
        [sys.executable, "-c", CHILD.format(prelude=prelude)],
        env=child_env(
            pythonpath=[path], drop=("VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS"), **env
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("external", ["", "tokencredit.integrations.verl"])
def test_a_fresh_process_that_imports_verl_has_every_estimator_and_loss(tmp_path, external):
    got = _child(tmp_path, **({"VERL_USE_EXTERNAL_MODULES": external} if external else {}))
    assert got["plugin_loaded"] and not got["warnings"] and got["trl_check"]
    assert got["estimators"] == sorted(
        tc_verl.ESTIMATORS
    )  # the documented variable and the entry point agree
    assert got["losses"] == sorted(tc_verl.LOSSES)


def test_a_plugin_that_cannot_load_says_why(tmp_path):
    # verl swallows an entry point's exception; ours turns an ImportError into a visible warning.
    got = _child(tmp_path, prelude="sys.modules['tokencredit.integrations.verl.register'] = None")
    assert got["estimators"] == [] and len(got["warnings"]) == 1
    assert "tokencredit's verl plugin is not loaded" in got["warnings"][0]

"""The documented verl launch (examples/verl/run_qwen_math.sh) names only keys verl 0.9's trainer
config has: every override without a leading '+' must exist in verl's composed ppo_trainer config,
so a typo or a key verl renamed fails here rather than at hour zero of a GPU job."""

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.extras  # needs tokencredit[verl]: skipped without it, run by `pytest -m extras`
verl = pytest.importorskip(
    "verl", reason="verl is not installed (extra tokencredit[verl], then pip install --no-deps verl)"
)
yaml = pytest.importorskip("yaml")

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "verl" / "run_qwen_math.sh"


def _overrides(text: str) -> list[str]:
    """key=value overrides of the main_ppo command and of the EXTRA arrays, without the shell parts."""
    body = text[text.index("python -m verl.trainer.main_ppo") :]
    found = re.findall(r"^\s+([+\w.]+)=", body, flags=re.M)
    for arr in re.findall(r"EXTRA(?:\+)?=\((.*?)\)", text, flags=re.S):
        found += [tok.split("=", 1)[0] for tok in arr.split() if "=" in tok]
    return found


def _has(cfg: dict, dotted: str) -> bool:
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_launch_overrides_exist_in_verl_config():
    cfg = yaml.safe_load(
        (Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml").read_text()
    )
    keys = _overrides(SCRIPT.read_text())
    assert len(keys) > 30 and "algorithm.adv_estimator" in keys and "trainer.use_v1" in keys
    missing = [k for k in keys if not k.startswith("+") and not _has(cfg, k)]
    assert not missing, f"{SCRIPT.name}: keys verl {verl.__version__} does not have: {missing}"


def test_key_check_catches_a_typo():
    cfg = yaml.safe_load(
        (Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml").read_text()
    )
    assert _has(cfg, "actor_rollout_ref.actor.optim.lr")
    assert not _has(cfg, "actor_rollout_ref.actor.optim.learning_rate")

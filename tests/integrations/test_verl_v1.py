"""verl's v1 trainer route (hook 2) on verl's real code: PPOTrainerSync._compute_advantage + TransferQueue.

verl 0.9's default trainer (``trainer.use_v1=True``) keeps the batch in TransferQueue and builds the
advantage DataProto from a fixed field list without ``responses`` or ``entropy``; the plugin's hook
fetches them for its estimators. Here the child process (this file run as a script) starts a local
Ray instance (2 CPUs: TransferQueue's controller and storage unit are actors) and a real
TransferQueue with one storage unit, stores a fixture batch the way verl's agent loop and
old-log-prob step store it (jagged fields, keys ``{uid}_{session}_{index}``), and calls verl's own
``_compute_advantage`` with ``algorithm.adv_estimator=tc_strace`` (needs the response ids and the
entropy); the advantages it writes back to TransferQueue must equal the core's exactly.

Importing ``verl.trainer.ppo.v1.trainer_base`` needs TransferQueue, aiohttp (verl's reward loop) and
hydra (verl's agent loop). hydra-core cannot be installed next to tokencredit (its antlr 4.9 pin
breaks math-verify's antlr 4.13), and the advantage step never calls it, so the child registers an
empty ``hydra`` module when the real one does not import; TransferQueue itself requires hydra-core,
so install it with ``pip install --no-deps transferqueue pyzmq msgspec``. The test skips, naming what
is missing, when TransferQueue or aiohttp is not installed; the stand-in version in test_verl.py
covers the hook's logic everywhere.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.extras  # needs tokencredit[verl]: skipped without it, run by `pytest -m extras`
pytest.importorskip(
    "verl", reason="verl is not installed (extra tokencredit[verl]; see docs/integrations.md)"
)
MISSING = [m for m in ("transfer_queue", "aiohttp") if importlib.util.find_spec(m) is None]

N_PROMPTS, G, T = 3, 4, 7


def _fixture() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    n = N_PROMPTS * G
    lengths = torch.tensor([7, 5, 3, 6, 2, 7, 4, 4, 5, 1, 6, 3])
    return {
        "lengths": lengths,
        "responses": torch.randint(0, 9, (n, T), generator=g),
        "entropy": torch.rand(n, T, generator=g) * 3,
        "old_log_probs": -torch.rand(n, T, generator=g) * 2,
        "scores": torch.tensor([1.0, 0, 0, 1, 1, 1, 0, 1, 0, 0, 0, 0]),
    }


@pytest.mark.slow
@pytest.mark.skipif(
    bool(MISSING),
    reason=f"verl's v1 trainer needs {' and '.join(MISSING)} (pip install --no-deps transferqueue pyzmq msgspec; "
    "pip install aiohttp)",
)
def test_v1_trainer_compute_advantage_with_transfer_queue(tmp_path):
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "RAY_AUTH_MODE": "disabled"}
    res = subprocess.run(
        [sys.executable, __file__, str(out)], env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0 and out.exists(), (res.stdout[-3000:], res.stderr[-6000:])
    result = json.loads(out.read_text())
    assert result["adv_err"] == 0.0, result
    assert result["fetched"] == ["responses", "entropy"]
    assert result["kept_fraction"] < 0.5  # S-trace's kept set: Â is 0 outside the top-entropy tokens


# ---------------------------------------------------------------------------------------------- child process
def _core(fx: dict[str, torch.Tensor]) -> torch.Tensor:
    from tokencredit import advantages, credit
    from tokencredit.batch import RolloutBatch
    from tokencredit.credit.entropy import top_entropy_mask
    from tokencredit.recipes import RECIPES

    mask = torch.arange(T)[None, :] < fx["lengths"][:, None]
    gids = torch.arange(N_PROMPTS * G) // G
    recipe = RECIPES["strace"]
    rb = RolloutBatch(
        fx["responses"],
        mask,
        gids,
        fx["scores"],
        entropy=fx["entropy"] * mask,
        old_log_probs=fx["old_log_probs"] * mask,
    )
    seq = advantages.compute(recipe.advantage, fx["scores"], gids, **recipe.advantage_params)
    tok = credit.compute(recipe.credit, rb, seq, **recipe.credit_params)
    return tok * top_entropy_mask(rb.entropy, mask, recipe.kernel_params["keep_ratio"], "batch")


def _child(out: Path) -> None:
    try:
        import hydra  # noqa: F401
    except Exception:  # not installed, or its grammar rejects the antlr runtime math-verify needs
        sys.modules["hydra"] = types.ModuleType("hydra")
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    import tokencredit.integrations.verl as tc_verl

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    from verl.trainer.ppo.v1 import trainer_base, trainer_sync

    assert getattr(trainer_base.PPOTrainer._compute_advantage, "tokencredit_hook", False)
    fx = _fixture()
    rows, keys = [], []
    for i in range(N_PROMPTS * G):
        r = int(fx["lengths"][i])
        reward = torch.zeros(r)
        reward[-1] = fx["scores"][i]
        uid = f"prompt{i // G}"
        keys.append(f"{uid}_{i % G}_0")
        rows.append(
            {
                "uid": uid,
                "responses": fx["responses"][i, :r],
                "response_mask": torch.ones(r, dtype=torch.int64),
                "rm_scores": reward,
                "entropy": fx["entropy"][i, :r],
                "old_log_probs": fx["old_log_probs"][i, :r],
            }
        )
    batch = tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(rows))

    fetched: list[str] = []
    get = tq.kv_batch_get

    def kv_batch_get(*args, **kwargs):
        fetched.extend(kwargs.get("select_fields") or [])
        return get(*args, **kwargs)

    trainer = trainer_sync.PPOTrainerSync.__new__(trainer_sync.PPOTrainerSync)  # the synchronous v1 trainer
    trainer.tokenizer = None
    trainer.config = OmegaConf.create(
        {
            "algorithm": {
                "adv_estimator": "tc_strace",
                "use_kl_in_reward": False,
                "gamma": 1.0,
                "lam": 1.0,
                "norm_adv_by_std_in_grpo": True,
                "rollout_correction": None,
            },
            "actor_rollout_ref": {"rollout": {"n": G}, "actor": {"policy_loss": {"loss_mode": "tc_strace"}}},
        }
    )
    trainer_base.tq.kv_batch_get = kv_batch_get  # only to record which fields were read
    try:
        trainer._compute_advantage(batch, metrics={})
    finally:
        trainer_base.tq.kv_batch_get = get
    adv = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["advantages"])["advantages"]
    adv = torch.nested.to_padded_tensor(adv, 0.0, output_size=(len(keys), T))
    want = _core(fx)
    tq.close()
    ray.shutdown()
    first = fetched.index("uid")  # verl's own field list comes first; the hook's fetch after it
    out.write_text(
        json.dumps(
            {
                "adv_err": float((adv - want).abs().max()),
                "fetched": [f for f in fetched[first:] if f in ("responses", "entropy")],
                "kept_fraction": float((want != 0).float().mean()),
                "plugin": tc_verl.__name__,
            }
        )
    )


if __name__ == "__main__":
    _child(Path(sys.argv[1]))

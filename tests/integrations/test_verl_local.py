"""tokencredit.integrations.verl.local: the CPU platform, the hf rollout backend and the launcher, in-process.

verl's whole trainer on these pieces runs in test_verl_e2e.py; here each piece is checked on its own.
Importing verl.local selects the CPU platform for this process; the fixture puts verl's platform
singleton and VERL_ENGINE_DEVICE back afterwards, so later tests see verl as they would without it.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.extras  # needs tokencredit[verl]: skipped without it, run by `pytest -m extras`
verl = pytest.importorskip(
    "verl", reason="verl is not installed (extra tokencredit[verl]; see docs/integrations.md)"
)
yaml = pytest.importorskip("yaml")
from verl.plugin.platform import platform_manager  # noqa: E402

from tokencredit.errors import ConfigError  # noqa: E402
from tokencredit.models import build_toy_model, build_toy_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def local():
    saved_platform = platform_manager._current_platform
    saved_env = os.environ.get("VERL_ENGINE_DEVICE")
    import tokencredit.integrations.verl.local as local

    local.install()  # idempotent: a no-op when an earlier test already imported it
    yield local
    platform_manager._current_platform = saved_platform
    if saved_env is None:
        os.environ.pop("VERL_ENGINE_DEVICE", None)
    else:
        os.environ["VERL_ENGINE_DEVICE"] = saved_env


# ---------------------------------------------------------------------------------------------- platform
def test_cpu_platform_is_selected_and_registered(local):
    from verl.utils import device

    from tokencredit.integrations.verl.local.platform import PLATFORM_NAME, PlatformCPU

    assert isinstance(platform_manager.get_platform(), PlatformCPU)
    assert platform_manager.PlatformRegistry.get(PLATFORM_NAME) is PlatformCPU
    assert not PlatformCPU().is_platform_available(use_smi_check=True)  # chosen explicitly, never detected
    assert (device.get_device_name(), device.get_nccl_backend(), device.get_resource_name()) == (
        "cpu",
        "gloo",
        "GPU",
    )
    assert torch.zeros(2).to(device.get_device_id()).device.type == "cpu"
    assert os.environ["VERL_ENGINE_DEVICE"] == local.ENGINE_DEVICE
    mod = device.get_torch_device()
    free, total = mod.mem_get_info()
    assert 0 < free <= total
    assert mod.memory_allocated() == 0 and mod.max_memory_reserved() == 0 and mod.device_count() == 1
    mod.synchronize(), mod.empty_cache()
    assert mod.current_stream() is not None and mod.is_available()
    state = mod.get_rng_state()
    a = torch.rand(3)
    mod.set_rng_state(state)
    assert torch.equal(a, torch.rand(3))


def test_gloo_is_the_default_backend_only_on_the_cpu_platform(local):
    from verl.utils import distributed

    from tokencredit.integrations.verl.local.hooks import _default_gloo

    calls = []
    wrapped = _default_gloo(lambda timeout_second=None, backend=None: calls.append(backend))
    wrapped(), wrapped(backend="cpu:gloo")
    saved = platform_manager._current_platform
    platform_manager.set_platform(platform_manager.PlatformRegistry.get("nvidia")())
    try:
        wrapped()
    finally:
        platform_manager._current_platform = saved
    assert calls == ["gloo", "cpu:gloo", None]  # None: verl's own default on other platforms
    assert getattr(distributed.initialize_global_process_group_ray, "tokencredit_hook", False)


def test_is_trl_available_asks_for_the_value_head_class(local):
    from verl.utils import import_utils, model

    fn = import_utils.is_trl_available
    assert getattr(
        model.is_trl_available, "tokencredit_hook", False
    )  # a module holding the name is fixed too
    assert getattr(fn, "tokencredit_hook", False)
    try:
        import trl
    except ImportError:
        assert fn() is False
        return
    has = hasattr(trl, "AutoModelForCausalLMWithValueHead")
    assert fn() is has  # TRL 1.x removed the class verl 0.9.1 imports: False there


def test_hf_backend_is_registered_in_both_of_verls_registries(local):
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class

    from tokencredit.integrations.verl.local.rollout import HFReplica, HFServerAdapter

    assert get_rollout_replica_class("hf") is HFReplica
    assert get_rollout_class("hf", "async") is HFServerAdapter


def test_version_gate_matches_the_plugin(local):
    import tokencredit.integrations.verl as tc_verl

    assert local.SUPPORTED_VERSIONS == tc_verl.SUPPORTED_VERSIONS
    assert local.check_version("0.9.1") == "0.9.1"
    with pytest.raises(ImportError, match="supports verl >=0.9,<0.10"):
        local.check_version("0.10.0")


# ---------------------------------------------------------------------------------------------- sampling
def test_filter_logits_top_k_and_top_p():
    from tokencredit.integrations.verl.local.sampling import filter_logits

    z = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert torch.isinf(filter_logits(z, 2, 1.0)).tolist() == [False, False, True, True]
    assert torch.isinf(filter_logits(z, -1, 0.7)).tolist() == [False, False, True, True]  # 0.5 < 0.7 <= 0.8
    assert torch.isinf(filter_logits(z, -1, 0.5)).tolist() == [False, True, True, True]
    assert not torch.isinf(filter_logits(z, 0, 1.0)).any()


@pytest.fixture(scope="module")
def toy():
    tok = build_toy_tokenizer()
    model = build_toy_model(tokenizer=tok, seed=1).eval()
    prompt = tok("Compute 12 + 7.", add_special_tokens=False)["input_ids"]
    return model, tok, prompt


def test_sample_greedy_matches_a_full_forward(toy):
    from tokencredit.integrations.verl.local.sampling import sample

    model, tok, prompt = toy
    ids, lps, stopped = sample(model, prompt, 12, temperature=0.0, stop_ids=())
    assert len(ids) == 12 and not stopped
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
    assert ids == logits.argmax(-1).tolist()  # the KV-cached steps equal one full forward
    want = logits.log_softmax(-1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(lps), want, atol=1e-5)
    ids2, _, stopped2 = sample(model, prompt, 12, temperature=0.0, stop_ids={ids[3]})
    assert stopped2 and ids2 == ids[: ids.index(ids[3]) + 1]  # the stop id is kept, as vLLM keeps EOS


def test_sample_with_temperature_is_seeded_and_reports_processed_log_probs(toy):
    from tokencredit.integrations.verl.local.sampling import sample

    model, _, prompt = toy

    def run(**kw):
        return sample(model, prompt, 8, temperature=0.7, generator=torch.Generator().manual_seed(3), **kw)

    assert run()[0] == run()[0]
    ids, lps, _ = run(top_k=1)
    assert lps == [0.0] * 8  # top-1: the drawn token had probability 1 under the processed distribution
    _, raw, _ = run(top_k=1, logprobs_mode="raw_logprobs")
    assert all(lp < 0 for lp in raw)
    with pytest.raises(ValueError, match="logprobs_mode"):
        run(logprobs_mode="nope")


# ---------------------------------------------------------------------------------------------- server
def _server(tmp_path: Path, toy, **config):
    from tokencredit.integrations.verl.local.rollout import HFRolloutServer

    model, tok, _ = toy
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    cfg = {"dtype": "float32", "prompt_length": 32, "response_length": 6, "seed": 0, **config}
    return HFRolloutServer(cfg, {"path": str(tmp_path)}, replica_rank=0)


def test_server_generate_follows_verls_contract(tmp_path, toy, local):
    server = _server(tmp_path, toy)
    _, tok, prompt = toy
    greedy = {"temperature": 0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    out = asyncio.run(server.generate(prompt, dict(greedy), "r0"))
    assert 1 <= len(out.token_ids) <= 6 and len(out.log_probs) == len(out.token_ids)
    assert out.extra_fields == {"global_steps": None} and out.stop_reason == "completed"
    assert tok.eos_token_id in server.stop_ids
    no_lp = asyncio.run(server.generate(prompt, {**greedy, "logprobs": False, "max_tokens": 2}, "r1"))
    assert no_lp.log_probs is None and len(no_lp.token_ids) <= 2
    # new weights: the next answer comes from them, tagged with their step
    state = {
        k: torch.zeros_like(v) for k, v in server.model.state_dict().items() if k.endswith("norm.weight")
    }
    asyncio.run(server.update_weights(state, global_steps=7))
    after = asyncio.run(server.generate(prompt, dict(greedy), "r2"))
    assert after.extra_fields["global_steps"] == 7
    with pytest.raises(ConfigError, match="closest: top_p"):
        asyncio.run(server.generate(prompt, {**greedy, "top_pp": 0.9}, "r3"))
    with pytest.raises(ConfigError, match="text-only"):
        asyncio.run(server.generate(prompt, dict(greedy), "r4", image_data=[object()]))
    with pytest.raises(ConfigError, match="leaves no room"):
        asyncio.run(server.generate(list(range(3, 45)), dict(greedy), "r5"))
    with pytest.raises(ConfigError, match="lora.merge=True"):
        asyncio.run(server.update_weights({"base_model.model.lora_A.weight": torch.zeros(1)}))


# ---------------------------------------------------------------------------------------------- launcher and toy task
def test_launch_command_puts_cpu_keys_first_and_lets_overrides_win(tmp_path, local):
    from tokencredit.integrations.verl.local.__main__ import CPU_KEYS, MODULE, command, environment

    cmd = command(
        ["+ray_kwargs.ray_init.num_gpus=2", "trainer.n_gpus_per_node=2", "algorithm.adv_estimator=tc_ktae"],
        tmp_path,
    )
    assert cmd[-3:] == [
        "+ray_kwargs.ray_init.num_gpus=2",
        "trainer.n_gpus_per_node=2",
        "algorithm.adv_estimator=tc_ktae",
    ]
    assert "+ray_kwargs.ray_init.num_gpus=1" not in cmd and "trainer.n_gpus_per_node=1" not in cmd
    assert (
        "actor_rollout_ref.rollout.name=hf" in cmd and f"data.train_files={tmp_path / 'train.parquet'}" in cmd
    )
    assert len(command([])) == len(CPU_KEYS)
    env = environment({"VERL_USE_EXTERNAL_MODULES": f"my_mod,{MODULE}"})
    assert env["VERL_USE_EXTERNAL_MODULES"] == f"{MODULE},my_mod" and env["VERL_ENGINE_DEVICE"] == "cuda"


def test_launch_keys_exist_in_verls_config(tmp_path, local):
    from tokencredit.integrations.verl.local.__main__ import CPU_KEYS, toy_keys

    cfg = yaml.safe_load(
        (Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml").read_text()
    )

    def has(dotted: str) -> bool:
        node = cfg
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    keys = [*CPU_KEYS, *toy_keys(tmp_path)]
    assert not [k for k in keys if not k.startswith("+") and not has(k)]
    assert not [k for k in keys if k.startswith("+") and has(k[1:])]  # a "+" key verl has would fail in hydra


def test_toy_data_and_reward(tmp_path):
    import pyarrow.parquet as pq

    from tokencredit.data.synthetic import reference_solution
    from tokencredit.integrations.verl.local.toy import compute_score, write_parquet

    train, val = write_parquet(tmp_path, n_train=5, n_val=3)
    rows = pq.read_table(train).to_pylist()
    assert len(rows) == 5 and len(pq.read_table(val).to_pylist()) == 3
    row = rows[0]
    problem = row["prompt"][-1]["content"]
    gold = row["reward_model"]["ground_truth"]
    assert compute_score(row["data_source"], reference_solution(problem), gold) == 1.0
    assert compute_score(row["data_source"], "The answer is \\boxed{-1}.", gold) == 0.0
    assert compute_score(row["data_source"], "no answer", gold) == 0.0

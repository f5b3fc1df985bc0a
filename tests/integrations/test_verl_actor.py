"""verl actor extension (TOKENCREDIT_VERL_ACTOR_SIGNALS=1): verl's real old-log-prob path -> exactly the core's Â.

The end-to-end test runs in a child process (this file run as a script) because it initialises a
torch.distributed process group (gloo, world size 1) and selects verl's hardware platform before any
verl module reads it. What runs there is verl's own code, from the legacy trainer down to the model:

    RayPPOTrainer._compute_old_log_prob   (hooked: asks for the estimator's signals or reductions, sends
                                           DelTA's sequence advantages, collects the results)
      -> ActorRolloutRefWorker.compute_log_prob -> TrainingWorker.infer_batch
      -> FSDPEngineWithLMHead.infer_batch (hooked: DelTA's coefficients) / forward_backward_batch /
         forward_step (hooked: hidden states captured, ARCA's residual norms, extra passes)
         on a FSDP2-wrapped toy Qwen3 with a LoRA adapter loaded by verl (lora_adapter_path)
    ray_trainer.compute_advantage (hooked) with algorithm.adv_estimator = tc_delta / tc_arca /
      tc_policy_divergence / tc_gcpo

and the advantages must equal the core's: tokencredit.signals.compute_signals on the same model,
adapter and sequences, then advantages.grpo + credit.compute; what the workers return (DelTA's
coefficients, ARCA's residual norms, the log-prob signals) must equal the core's functions on those
signals, and no hidden state may come back. Three stand-ins, each for what a CPU
machine lacks, not for verl logic: (1) Ray's RPC from the worker group to the worker is a direct
call (one worker, so dispatch and collect are the identity); (2) verl has no CPU platform, so a
minimal one is registered through verl's own `set_platform` hook (VERL_ENGINE_DEVICE=cuda picks the
FSDP engine registered for CUDA); (3) verl 0.9.1's monkey patch imports TRL's value-head model,
which TRL 1.x moved, so `is_trl_available` is answered False (it only patches a value-head class).
Both of verl's input layouts run: padded (use_remove_padding=False) and packed (True; on GPU that is
flash-attn's varlen path, here transformers' eager attention, which separates the packed sequences
by their restarting position ids). Micro-batches come from verl's dynamic batch size (token budget
160), so verl's reordering of rows is exercised too.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.extras  # needs tokencredit[verl]: skipped without it, run by `pytest -m extras`
pytest.importorskip(
    "verl", reason="verl is not installed (extra tokencredit[verl]; see docs/integrations.md)"
)
pytest.importorskip("peft", reason="peft is not installed")
from verl import DataProto  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo import ray_trainer  # noqa: E402

import tokencredit.integrations.verl as tc_verl  # noqa: E402
from tokencredit.errors import ConfigError  # noqa: E402
from tokencredit.integrations.verl import actor as tc_actor  # noqa: E402
from tokencredit.recipes import credit_needs  # noqa: E402

ACTOR_ESTIMATORS = {  # estimator -> (credit method, what the workers compute for it)
    "tc_delta": ("delta", ("delta_coef",)),
    "tc_arca": ("arca", ("adapter_residual",)),
    "tc_policy_divergence": ("policy-divergence", ("base_log_probs",)),
    "tc_gcpo": ("gcpo", ("neg_log_probs",)),
}
RETURNED = {  # estimator -> the batch keys the old-log-prob step adds
    "tc_delta": ["tc_delta_coef", "tc_seq_adv"],
    "tc_arca": ["tc_adapter_residual"],
    "tc_policy_divergence": ["tc_base_log_probs"],
    "tc_gcpo": ["tc_neg_log_probs"],
}
TEMPERATURE = 0.8
GROUPS, G = 3, 4


# ---------------------------------------------------------------------------------------------- in-process tests
def _plain_dataproto() -> DataProto:
    n, t = GROUPS * G, 5
    mask = torch.ones(n, t, dtype=torch.long)
    rewards = torch.zeros(n, t)
    rewards[::2, -1] = 1.0
    return DataProto.from_dict(
        tensors={
            "responses": torch.randint(3, 9, (n, t)),
            "response_mask": mask,
            "token_level_rewards": rewards,
            "old_log_probs": -torch.rand(n, t),
        },
        non_tensors={"uid": np.array([f"p{i // G}" for i in range(n)], dtype=object)},
    )


@pytest.mark.parametrize("name", sorted(ACTOR_ESTIMATORS))
def test_without_the_extension_the_error_names_the_switch(name, monkeypatch):
    monkeypatch.delenv(tc_actor.SWITCH, raising=False)
    with pytest.raises(ConfigError, match=f"{tc_actor.SWITCH}=1.*trainer.use_v1=False"):
        ray_trainer.compute_advantage(
            _plain_dataproto(), adv_estimator=name, config=AlgoConfig(adv_estimator=name)
        )


def test_switch_and_requests(monkeypatch):
    monkeypatch.delenv(tc_actor.SWITCH, raising=False)
    assert not tc_actor.enabled()
    assert (
        "verl.workers.engine.fsdp.transformer_impl" not in tc_verl.install_hooks()
    )  # off: verl's engine untouched
    monkeypatch.setenv(tc_actor.SWITCH, "1")
    assert tc_actor.enabled()
    for name, (_, extra) in ACTOR_ESTIMATORS.items():
        spec = tc_verl.estimator_spec(name)
        assert tc_actor.requested(spec.credit, credit_needs(spec)) == extra
    for name in ("tc_ktae", "tc_entropy_80_20", "tc_strace", "tc_grpo"):  # stock verl covers these
        spec = tc_verl.estimator_spec(name)
        assert tc_actor.requested(spec.credit, credit_needs(spec)) == ()
    # hidden states never leave a worker: a method that reads them without a reduction is refused
    with pytest.raises(ConfigError, match="do not send hidden states"):
        tc_actor.requested("my-hidden-method", {"hidden", "old_log_probs"})


def test_version_mismatch_of_a_wrapped_method_is_refused():
    def forward_step(self, micro_batch, loss_function):  # a verl whose signature changed
        return None

    with pytest.raises(ImportError, match="verl 0.9.x"):
        tc_actor.wrap_forward_step(forward_step)


def test_actor_signals_are_dropped_after_the_advantage_step():
    data = _plain_dataproto()
    h = torch.randn(len(data), 5, 3)
    data.batch["tc_hidden"] = h
    ray_trainer.compute_advantage(data, adv_estimator="tc_ktae", config=AlgoConfig(adv_estimator="tc_ktae"))
    assert "tc_hidden" not in data.batch.keys() and "advantages" in data.batch.keys()


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["padded", "packed"])  # verl's use_remove_padding False / True
def test_actor_extension_through_verl_old_log_prob_path(tmp_path, layout):
    out = tmp_path / "result.json"
    # The switch is set before the child imports anything, as a launch sets it before `import verl`.
    env = {**os.environ, tc_actor.SWITCH: "1", "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [sys.executable, __file__, str(out), layout], env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0 and out.exists(), (res.stdout[-3000:], res.stderr[-6000:])
    result = json.loads(out.read_text())
    assert set(result) == set(ACTOR_ESTIMATORS)
    for name, r in result.items():
        # exactly what the estimator needs came back, [bs, T] or [bs] each: never a hidden state
        assert r["returned"] == RETURNED[name], name
        assert r["max_dim"] <= 2, name
        assert r["dropped"], name  # and they were removed from the batch after the advantage step
        for signal, err in r["signal_err"].items():
            assert err < 1e-5, (name, signal, err)
        assert r["adv_err"] < 5e-5, (name, r["adv_err"])  # |Â| ~ 0.8: float32 rounding of two forwards
        assert r["adv_abs_mean"] > 1e-3 and r["nonuniform"], name  # a non-trivial comparison
        assert r["padding_zero"], name


# ---------------------------------------------------------------------------------------------- child process
def _free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_platform() -> None:
    """Register a minimal CPU platform through verl's set_platform (verl ships CUDA / NPU / ROCm only)."""
    from verl.plugin.platform import platform_manager
    from verl.plugin.platform.platform_base import PlatformBase

    cpu_module = types.SimpleNamespace(
        max_memory_allocated=lambda *a: 0,
        max_memory_reserved=lambda *a: 0,
        empty_cache=lambda: None,
        synchronize=lambda *a: None,
        is_available=lambda: True,
        current_device=lambda: "cpu",
        manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed,
        device_count=lambda: 1,
        set_device=lambda *a: None,
        memory_allocated=lambda *a: 0,
        memory_reserved=lambda *a: 0,
        mem_get_info=lambda *a: (0, 0),
        get_device_name=lambda *a: "cpu",
    )

    class PlatformCPU(PlatformBase):
        device_name = "cpu"
        vendor_name = "cpu"
        device_module = cpu_module

        def is_available(self) -> bool:
            return True

        def current_device(self) -> str:
            return "cpu"

        def device_count(self) -> int:
            return 1

        def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
            return (None, None)

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "TC_CPU_VISIBLE_DEVICES"

        def nvtx_range(self, msg: str) -> contextlib.AbstractContextManager:
            return contextlib.nullcontext()

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        manual_seed_all = manual_seed

        def _noop(self, *args: object) -> None:
            return None

        set_device = synchronize = set_allocator_settings = empty_cache = _noop
        profiler_start = profiler_stop = cudart = _noop

    platform_manager.set_platform(PlatformCPU())


def _toy_dirs(root: Path) -> Any:
    """The toy Qwen3 and tokenizer saved as a HF model dir, and a LoRA adapter with non-zero B."""
    from peft import LoraConfig, get_peft_model

    from tokencredit.models import build_toy_model, build_toy_tokenizer

    tok = build_toy_tokenizer()
    model = build_toy_model(tokenizer=tok, seed=3)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    peft_model = get_peft_model(
        build_toy_model(tokenizer=tok, seed=3),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], task_type="CAUSAL_LM"),
    )
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:  # B = 0 at init would make the adapter-free pass identical
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    peft_model.save_pretrained(root / "adapter")
    return tok


def _rollouts(tok: Any) -> tuple[DataProto, torch.Tensor, torch.Tensor, list[list[dict[str, str]]]]:
    """A verl legacy-trainer batch (left-padded prompts, right-padded responses), its token-level rewards,
    scores and chats (one per prompt group)."""
    from tokencredit.data.synthetic import ArithmeticTask

    # 1-, 2- and 4-step problems: prompts of different lengths, so the left padding matters
    problems = [ArithmeticTask(difficulty=d, seed=5).sample(1)[0].problem for d in (1, 2, 4)]
    chats = [[{"role": "user", "content": problem}] for problem in problems]
    prompt_ids = [
        tok(tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False), add_special_tokens=False)[
            "input_ids"
        ]
        for c in chats
    ]
    g = torch.Generator().manual_seed(2)
    n = GROUPS * G
    p_len = max(len(p) for p in prompt_ids)
    lengths = torch.tensor([9, 4, 7, 1, 9, 6, 3, 8, 5, 9, 2, 7])
    t_len = int(lengths.max())
    special = set(tok.all_special_ids)
    ordinary = torch.tensor([i for i in range(len(tok)) if i not in special])
    prompts = torch.full((n, p_len), tok.pad_token_id)
    responses = torch.full((n, t_len), tok.pad_token_id)
    attention = torch.zeros(n, p_len + t_len, dtype=torch.long)
    for i in range(n):
        ids = torch.tensor(prompt_ids[i // G])
        prompts[i, p_len - len(ids) :] = ids
        attention[i, p_len - len(ids) : p_len] = 1
        responses[i, : lengths[i]] = ordinary[torch.randint(len(ordinary), (int(lengths[i]),), generator=g)]
        attention[i, p_len : p_len + lengths[i]] = 1
    input_ids = torch.cat([prompts, responses], 1)
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0) * attention
    scores = torch.tensor([1.0, 0, 0, 1, 0, 1, 1, 1, 0, 0, 1, 0])
    rewards = torch.zeros(n, t_len).scatter(1, (lengths - 1)[:, None], scores[:, None])
    batch = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": input_ids,
            "attention_mask": attention,
            "position_ids": position_ids,
            "response_mask": attention[:, p_len:].clone(),
        },
        non_tensors={
            "uid": np.array([f"u{i // G}" for i in range(n)], dtype=object),
            # a 1-D object array of message lists (the trailing None stops numpy nesting them)
            "raw_prompt": np.array([chats[i // G] for i in range(n)] + [None], dtype=object)[:-1],
        },
        meta_info={"temperature": TEMPERATURE, "global_token_num": attention.sum(-1).tolist()},
    )
    return batch, rewards, scores, chats


def _core_advantages(
    tok: Any,
    root: Path,
    batch: DataProto,
    scores: torch.Tensor,
    chats: list,
    method: str,
    needs: frozenset[str],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The core's Â: compute_signals on the same model + adapter and sequences, then grpo + credit; and the
    core's value of each batch key the workers return (by key)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from tokencredit import advantages, credit
    from tokencredit.batch import RolloutBatch
    from tokencredit.credit.gcpo import negative_prompt
    from tokencredit.integrations.verl.batch import group_ids_from_labels
    from tokencredit.signals import compute_signals

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(root / "model"), root / "adapter")
    b = batch.batch
    p_len = b["prompts"].shape[1]
    kw = {}
    if "neg_log_probs" in needs:
        neg = []
        for chat in chats:
            msgs = [{**m, "content": negative_prompt(m["content"])} for m in chat]
            text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
            neg.append(tok(text, add_special_tokens=False)["input_ids"])
        n_len = max(len(x) for x in neg)
        rows = [neg[i // G] for i in range(len(batch))]
        neg_prompt = torch.tensor([[tok.pad_token_id] * (n_len - len(x)) + x for x in rows])
        neg_mask = torch.tensor([[0] * (n_len - len(x)) + [1] * len(x) for x in rows])
        kw = dict(
            neg_sequences=torch.cat([neg_prompt, b["responses"]], 1),
            neg_attention_mask=torch.cat([neg_mask, b["attention_mask"][:, p_len:]], 1),
            neg_prompt_len=n_len,
        )
    signals = compute_signals(
        model,
        b["input_ids"],
        b["attention_mask"],
        p_len,
        b["response_mask"],
        needs,
        temperature=TEMPERATURE,
        **kw,
    )
    gids = group_ids_from_labels(batch.non_tensor_batch["uid"])
    mask = b["response_mask"].bool()
    rb = RolloutBatch(b["responses"], mask, gids, scores, **signals)
    seq = advantages.grpo(scores, gids)
    by_key = {
        tc_actor.BATCH_KEYS[s]: v for s, v in signals.items() if s in ("base_log_probs", "neg_log_probs")
    }
    if method == "delta":
        from tokencredit.credit.delta import discriminate

        scale = (-torch.expm1(signals["old_log_probs"])).clamp(0, 1)
        by_key["tc_delta_coef"] = discriminate(signals["hidden"], scale, seq, mask).coefficients
        by_key["tc_seq_adv"] = seq
    if method == "arca":
        from tokencredit.credit.arca import residual_norm

        by_key["tc_adapter_residual"] = residual_norm(signals["hidden"], signals["base_hidden"], mask)
    return credit.compute(method, rb, seq), by_key


def _child(out: Path, packed: bool) -> None:
    if not tc_actor.enabled():
        raise SystemExit(f"run with {tc_actor.SWITCH}=1 in the environment")
    os.environ.update(
        {
            "VERL_ENGINE_DEVICE": "cuda",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_free_port()),
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
        }
    )
    torch.set_num_threads(1)
    _cpu_platform()
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    import verl.models.transformers.monkey_patch as verl_monkey_patch
    from omegaconf import OmegaConf
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig, TrainingWorkerConfig
    from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

    verl_monkey_patch.is_trl_available = lambda: False
    root = out.parent / "models"  # inside the parent test's tmp_path
    root.mkdir(exist_ok=True)
    tok = _toy_dirs(root)
    model_config = HFModelConfig(
        path=str(root / "model"),
        lora_rank=4,
        lora_alpha=8,
        lora_adapter_path=str(root / "adapter"),
        use_remove_padding=packed,
        override_config={"attn_implementation": "eager"},
    )
    engine_config = FSDPEngineConfig(
        strategy="fsdp2",
        model_dtype="fp32",
        use_torch_compile=False,
        use_dynamic_bsz=True,
        infer_max_token_len_per_gpu=160,
        mixed_precision={"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
    )
    worker = TrainingWorker(
        TrainingWorkerConfig(
            model_type="language_model",
            model_config=model_config,
            engine_config=engine_config,
            optimizer_config=FSDPOptimizerConfig(lr=1e-6, total_training_steps=1),
            checkpoint_config=CheckpointConfig(),
        )
    )
    worker.reset()
    actor = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)
    actor.actor, actor.enable_routing_replay = worker, False

    trainer = ray_trainer.RayPPOTrainer.__new__(ray_trainer.RayPPOTrainer)
    trainer.tokenizer = tok
    trainer.actor_rollout_wg = types.SimpleNamespace(
        compute_log_prob=lambda data: ActorRolloutRefWorker.compute_log_prob(
            actor, data
        )  # Ray RPC, one worker
    )
    batch, rewards, scores, chats = _rollouts(tok)
    mask = batch.batch["response_mask"].bool()
    result = {}
    for name, (method, _) in ACTOR_ESTIMATORS.items():
        trainer.config = OmegaConf.create(
            {"algorithm": {"adv_estimator": name}, "actor_rollout_ref": {"actor": {}}, "data": {}}
        )
        step = DataProto.from_dict(
            # rm_scores: the rewards, known before the old-log-prob step (fit's extract_reward reads them)
            tensors={**dict(batch.batch.items()), "rm_scores": rewards},
            non_tensors=dict(batch.non_tensor_batch),
            meta_info=dict(batch.meta_info),
        )
        old, _ = trainer._compute_old_log_prob(step)
        returned = sorted(k for k in old.batch.keys() if k in tc_actor.ADDED_KEYS)
        max_dim = max(old.batch[k].dim() for k in returned)
        step = step.union(old)
        step.batch["token_level_rewards"] = rewards
        signals_verl = {k: step.batch[k].clone() for k in returned}
        step = ray_trainer.compute_advantage(step, adv_estimator=name, config=AlgoConfig(adv_estimator=name))
        adv = step.batch["advantages"]
        needs = credit_needs(tc_verl.estimator_spec(name))
        want, by_key = _core_advantages(tok, root, batch, scores, chats, method, needs)
        result[name] = {
            "returned": returned,
            "max_dim": max_dim,
            "dropped": not any(k in step.batch.keys() for k in tc_actor.ADDED_KEYS),
            "signal_err": {k: float((signals_verl[k].float() - by_key[k]).abs().max()) for k in returned},
            "adv_err": float((adv - want).abs().max()),
            "adv_abs_mean": float(adv[mask].abs().mean()),
            "nonuniform": any(row[m].unique().numel() > 1 for row, m in zip(adv, mask)),
            "padding_zero": bool((adv[~mask] == 0).all()),
        }
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    _child(Path(sys.argv[1]), packed=sys.argv[2] == "packed")

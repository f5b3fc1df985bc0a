"""``python -m tokencredit.integrations.verl.local [--toy DIR] [--print] [verl overrides...]``: verl's
``main_ppo`` on a CPU.

Runs ``verl.trainer.main_ppo`` (hydra) with `CPU_KEYS` first, then your overrides, which win; with
``--toy DIR`` also `toy_keys` (the embedded toy model on toy arithmetic written to DIR, 2 steps).
It puts this module in ``VERL_USE_EXTERNAL_MODULES`` (the driver and the local Ray cluster's workers
inherit it) and sets ``VERL_ENGINE_DEVICE``. ``--print`` prints the environment and command instead.
"""

from __future__ import annotations

import argparse
import os
import runpy
import shlex
import sys
from pathlib import Path

from tokencredit.integrations.verl.local import ENGINE_DEVICE, toy
from tokencredit.models import TOY_ASSET_DIR

__all__ = ["CPU_KEYS", "MODULE", "command", "environment", "main", "toy_keys"]

MODULE = "tokencredit.integrations.verl.local"

# What a CPU needs, each key with why. The "+" keys are not in verl's config schema.
CPU_KEYS: dict[str, str] = {
    "trainer.device": "cpu",
    "trainer.nnodes": "1",
    "trainer.n_gpus_per_node": "1",  # one FSDP worker
    "+ray_kwargs.ray_init.num_gpus": "1",  # its logical Ray GPU (platform.PlatformCPU)
    "ray_kwargs.ray_init.num_cpus": "16",  # logical: verl starts more single-CPU actors than a laptop has cores
    "transfer_queue.backend.SimpleStorage.num_data_storage_units": "1",  # 8 storage actors hang a 2-core node
    "actor_rollout_ref.rollout.agent.num_workers": "1",  # agent-loop workers (Ray start-up time)
    "reward.num_workers": "1",
    "data.dataloader_num_workers": "0",
    "actor_rollout_ref.rollout.name": "hf",  # rollout.HFReplica
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "1",  # one model per process
    "actor_rollout_ref.actor.strategy": "fsdp2",
    "actor_rollout_ref.ref.strategy": "fsdp2",
    "actor_rollout_ref.actor.fsdp_config.model_dtype": "fp32",
    "actor_rollout_ref.ref.fsdp_config.model_dtype": "fp32",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile": "False",
    "actor_rollout_ref.ref.fsdp_config.use_torch_compile": "False",
    "actor_rollout_ref.model.use_remove_padding": "False",  # packed sequences need flash-attn
    "+actor_rollout_ref.model.override_config.attn_implementation": "eager",
    "trainer.logger": '["console"]',
}


def toy_keys(data_dir: Path) -> dict[str, str]:
    """The toy model on the toy task in `data_dir` (written by `toy.write_parquet`): 2 steps of 4 prompts x 4."""
    return {
        "data.train_files": str(data_dir / "train.parquet"),
        "data.val_files": str(data_dir / "val.parquet"),
        "data.train_batch_size": "4",
        "data.max_prompt_length": "192",
        "data.max_response_length": "96",
        "actor_rollout_ref.model.path": str(TOY_ASSET_DIR),
        "actor_rollout_ref.rollout.n": "4",
        "actor_rollout_ref.rollout.dtype": "float32",
        "actor_rollout_ref.actor.optim.lr": "1e-5",
        "actor_rollout_ref.actor.ppo_mini_batch_size": "4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "16",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "16",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "16",
        "reward.custom_reward_function.path": toy.__file__,
        "reward.custom_reward_function.name": "compute_score",
        "trainer.total_training_steps": "2",
        "trainer.val_before_train": "False",
        "trainer.test_freq": "-1",
        "trainer.save_freq": "-1",
    }


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def command(overrides: list[str], toy_dir: Path | None = None) -> list[str]:
    """main_ppo's arguments: CPU_KEYS (+ toy keys), then `overrides`; a default the overrides set is dropped."""
    defaults = dict(CPU_KEYS)
    if toy_dir is not None:
        defaults.update(toy_keys(toy_dir))
    given = {_key(o) for o in overrides}
    return [f"{k}={v}" for k, v in defaults.items() if k.lstrip("+") not in given] + list(overrides)


def environment(env: dict[str, str]) -> dict[str, str]:
    """`env` with this module first in VERL_USE_EXTERNAL_MODULES and VERL_ENGINE_DEVICE set."""
    modules = [m for m in env.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m and m != MODULE]
    return {
        **env,
        "VERL_USE_EXTERNAL_MODULES": ",".join([MODULE, *modules]),
        "VERL_ENGINE_DEVICE": ENGINE_DEVICE,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--toy", type=Path, metavar="DIR", help="write the toy task to DIR and train the toy model"
    )
    parser.add_argument("--print", action="store_true", help="print the command instead of running it")
    args, overrides = parser.parse_known_args(argv)
    if args.toy is not None:
        toy.write_parquet(args.toy)
    cmd = command(overrides, args.toy)
    env = environment(dict(os.environ))
    if args.print:
        print(
            f"VERL_USE_EXTERNAL_MODULES={env['VERL_USE_EXTERNAL_MODULES']} VERL_ENGINE_DEVICE={ENGINE_DEVICE} "
            f"python -m verl.trainer.main_ppo {shlex.join(cmd)}"
        )
        return 0
    os.environ.update(env)
    sys.argv = ["verl.trainer.main_ppo", *cmd]
    runpy.run_module("verl.trainer.main_ppo", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

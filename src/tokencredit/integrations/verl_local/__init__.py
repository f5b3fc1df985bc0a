"""Run verl's real trainer on a CPU: a dry run of a verl launch before the cluster, and tokencredit's CI.

Stock verl 0.9 cannot train without a GPU: it has no CPU platform (it falls back to CUDA and nccl)
and no rollout backend that runs on a CPU (vLLM, SGLang and TensorRT-LLM only). Importing this module
in every verl process, which ``VERL_USE_EXTERNAL_MODULES=tokencredit.integrations.verl_local`` does
at ``import verl`` (the variable reaches a local Ray cluster's workers through the environment),
provides both through verl's own extension points, without editing verl:

- the CPU platform (`platform.PlatformCPU`), registered in verl's ``PlatformRegistry`` as
  ``tc_cpu`` and selected with ``set_platform``: device "cpu", gloo, logical Ray GPUs;
- the ``hf`` rollout backend (`rollout`): a Hugging Face model in a Ray actor serving verl's
  token-in / token-out ``generate``, registered in ``RolloutReplicaRegistry`` and in the rollout
  registry of ``verl.workers.rollout.base`` (``actor_rollout_ref.rollout.name=hf``);
- three fixes for verl 0.9.1 on this stack: gloo as the default backend of
  ``initialize_global_process_group_ray`` (its default ``cpu:gloo,<device>:<backend>`` names the CPU
  twice), ``is_trl_available`` answering whether TRL still has the value-head class verl imports
  (TRL 1.x removed it; `tokencredit.integrations._verl_compat`, which the entry-point plugin
  applies too), and ``VERL_ENGINE_DEVICE=cuda`` so that verl finds its FSDP engine, which it
  registers for CUDA only.

``python -m tokencredit.integrations.verl_local [overrides]`` (``__main__``) runs
``verl.trainer.main_ppo`` with the keys a CPU run needs (``__main__.CPU_KEYS``) and, with
``--toy DIR``, the embedded toy model on toy arithmetic data (`toy`). What it is for: checking
that a launch configuration, a reward function or a tokencredit estimator runs through verl's whole
trainer (Ray, FSDP2, agent loop, reward loop, TransferQueue) for a step or two. What it is not for:
speed or results: rollouts are served one request at a time and training is FSDP2 over gloo. See
docs/integrations.md ("Dry run on a CPU").
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

from tokencredit.integrations._common import VERL_VERSIONS, check_supported
from tokencredit.integrations._import_hooks import when_imported

try:
    import verl
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "tokencredit.integrations.verl_local needs verl: pip install 'tokencredit[verl]' and then "
        "pip install --no-deps 'verl>=0.9,<0.10' (see docs/integrations.md)"
    ) from err

__all__ = ["ENGINE_DEVICE", "SUPPORTED_VERSIONS", "check_version", "install"]

SUPPORTED_VERSIONS = VERL_VERSIONS  # the verl plugin's range (`integrations._common`)
ENGINE_DEVICE = "cuda"  # verl registers its FSDP engine for "cuda" (and "npu") only


def check_version(version: str | None = None) -> str:
    """Raise ImportError unless verl's version is in SUPPORTED_VERSIONS (tested with 0.9.1)."""
    return check_supported(
        "tokencredit.integrations.verl_local",
        "verl",
        verl.__version__ if version is None else version,
        SUPPORTED_VERSIONS,
        "0.9.1",
        "It implements verl-internal interfaces (platform, rollout replica and "
        "adapter) that change between releases.",
    )


check_version()


def _default_gloo(fn: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(fn, "tokencredit_hook", False):
        return fn

    @functools.wraps(fn)
    def initialize_global_process_group_ray(timeout_second: Any = None, backend: str | None = None) -> Any:
        # verl is optional: these modules import it, so they load only when verl calls this hook
        from verl.plugin.platform import get_platform

        from tokencredit.integrations.verl_local.platform import PlatformCPU

        if backend is None and isinstance(get_platform(), PlatformCPU):
            backend = "gloo"  # verl's default, "cpu:gloo,cpu:gloo", names the CPU twice
        return fn(timeout_second=timeout_second, backend=backend)

    initialize_global_process_group_ray.tokencredit_hook = True  # type: ignore[attr-defined]
    return initialize_global_process_group_ray


def _register_rollout(module: Any) -> None:
    if module.__name__ == "verl.workers.rollout.replica":
        module.RolloutReplicaRegistry.register("hf", _load_replica)
    else:  # verl.workers.rollout.base
        module._ROLLOUT_REGISTRY[("hf", "async")] = (
            "tokencredit.integrations.verl_local.rollout.HFServerAdapter"
        )


def _load_replica() -> type:
    # verl is optional: rollout.py subclasses verl's classes, loaded when verl asks for the "hf" backend
    from tokencredit.integrations.verl_local.rollout import HFReplica

    return HFReplica


def install() -> None:
    """Select the CPU platform and register the hf rollout backend and the fixes (module docstring); idempotent."""
    # verl is optional: install() is the one entry that needs it (and the modules built on it)
    from verl.plugin.platform import platform_manager
    from verl.utils import distributed

    from tokencredit.integrations._verl_compat import install_trl_value_head_check
    from tokencredit.integrations.verl_local.platform import PlatformCPU

    os.environ["VERL_ENGINE_DEVICE"] = ENGINE_DEVICE
    if not isinstance(platform_manager._current_platform, PlatformCPU):
        platform_manager.set_platform(PlatformCPU())
    distributed.initialize_global_process_group_ray = _default_gloo(
        distributed.initialize_global_process_group_ray
    )
    workers = sys.modules.get("verl.workers.engine_workers")  # imported the name before this ran
    if workers is not None:
        workers.initialize_global_process_group_ray = _default_gloo(
            workers.initialize_global_process_group_ray
        )
    install_trl_value_head_check()
    when_imported("verl.workers.rollout.replica", _register_rollout)
    when_imported("verl.workers.rollout.base", _register_rollout)


install()

"""What importing `tokencredit.integrations.verl.local` installs in a verl process (`install`, run once at
import; idempotent): the version check (`check_version`), the CPU platform selected (`platform.PlatformCPU`),
the ``hf`` rollout backend registered in verl's two rollout registries (`rollout`) right after each is first
imported, and the fixes for verl 0.9.1 on this stack (gloo as the default process-group backend, verl's
``is_trl_available`` patched by `tokencredit.integrations.verl.compat`, ``VERL_ENGINE_DEVICE=cuda``).
The package's docstring says why each is needed.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

from tokencredit.integrations.engines import check_supported
from tokencredit.integrations.verl.compat import VERL_VERSIONS, install_trl_value_head_check
from tokencredit.integrations.verl.import_hooks import when_imported

try:
    import verl
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "tokencredit.integrations.verl.local needs verl: pip install 'tokencredit[verl]' and then "
        "pip install --no-deps 'verl>=0.9,<0.10' (see docs/integrations.md)"
    ) from err

__all__ = ["ENGINE_DEVICE", "SUPPORTED_VERSIONS", "check_version", "install"]

SUPPORTED_VERSIONS = VERL_VERSIONS  # the verl plugin's range (`tokencredit.integrations.verl.compat`)
ENGINE_DEVICE = "cuda"  # verl registers its FSDP engine for "cuda" (and "npu") only


def check_version(version: str | None = None) -> str:
    """Raise ImportError unless verl's version is in SUPPORTED_VERSIONS (tested with 0.9.1)."""
    return check_supported(
        "tokencredit.integrations.verl.local",
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

        from tokencredit.integrations.verl.local.platform import PlatformCPU

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
            "tokencredit.integrations.verl.local.rollout.HFServerAdapter"
        )


def _load_replica() -> type:
    # verl is optional: rollout.py subclasses verl's classes, loaded when verl asks for the "hf" backend
    from tokencredit.integrations.verl.local.rollout import HFReplica

    return HFReplica


def install() -> None:
    """Select the CPU platform and register the hf rollout backend and the fixes (module docstring); idempotent."""
    # verl is optional: install() is the one entry that needs it (and the modules built on it)
    from verl.plugin.platform import platform_manager
    from verl.utils import distributed

    from tokencredit.integrations.verl.local.platform import PlatformCPU

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

"""A CPU platform for verl 0.9 (verl ships CUDA, NPU and ROCm platforms only).

verl reaches the hardware through one object, ``verl.plugin.platform.get_platform()``: the device
name tensors are moved to, the ``torch.<device>`` module it calls for memory and streams, the
collective backend and the Ray resource its workers ask for. With no accelerator present, verl 0.9
falls back to CUDA (nccl, ``torch.cuda``), which fails on a CPU machine. `PlatformCPU` answers those
questions for the CPU: device "cpu", backend gloo, and `CPU_DEVICE_MODULE` in place of ``torch.cuda``.

The Ray resource stays "GPU": verl's resource pools, placement groups and worker groups are written
for one accelerator per worker, so each worker still reserves one *logical* GPU. A CPU-only Ray node
has none; the launch declares them with ``+ray_kwargs.ray_init.num_gpus=<workers>`` (Ray then sets
``CUDA_VISIBLE_DEVICES`` for the workers, which a CPU run ignores).
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Iterator
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

__all__ = ["CPU_DEVICE_MODULE", "PLATFORM_NAME", "PlatformCPU"]

PLATFORM_NAME = "tc_cpu"  # the name in verl's PlatformRegistry (also valid for VERL_PLATFORM)


def _mem_get_info(*_: Any) -> tuple[int, int]:
    """(free, total) bytes of host memory, as torch.cuda.mem_get_info reports device memory."""
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def _zero(*_: Any, **__: Any) -> int:
    return 0


def _nothing(*_: Any, **__: Any) -> None:
    return None


class _CPUDeviceModule(types.ModuleType):
    """``torch.cpu`` (streams, events, synchronize, device count) plus the ``torch.cuda`` functions
    verl calls that ``torch.cpu`` lacks: the caching-allocator statistics (0: the CPU has no device
    allocator), host-memory info, and the RNG state of the default CPU generator."""

    empty_cache = staticmethod(_nothing)
    ipc_collect = staticmethod(_nothing)
    set_per_process_memory_fraction = staticmethod(_nothing)
    memory_allocated = staticmethod(_zero)
    memory_reserved = staticmethod(_zero)
    max_memory_allocated = staticmethod(_zero)
    max_memory_reserved = staticmethod(_zero)
    reset_peak_memory_stats = staticmethod(_nothing)
    mem_get_info = staticmethod(_mem_get_info)
    get_rng_state = staticmethod(lambda *_: torch.get_rng_state())
    set_rng_state = staticmethod(lambda state, *_: torch.set_rng_state(state))
    manual_seed = staticmethod(torch.manual_seed)
    manual_seed_all = staticmethod(torch.manual_seed)

    @staticmethod
    def get_device_name(*_: Any) -> str:
        return "cpu"

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)


CPU_DEVICE_MODULE = _CPUDeviceModule("tokencredit_cpu_device")


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl's hardware platform answered for the CPU (see the module docstring)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return CPU_DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: the CPU platform is chosen explicitly (tokencredit.integrations.verl.local).
        return False

    def current_device(self) -> str:  # type: ignore[override]
        # verl moves batches with .to(get_device_id()): the index 0 would mean cuda:0.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # what Ray sets for the logical "GPU" resource

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> None:
        return None

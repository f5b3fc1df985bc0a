"""The device the tests under tests/gpu run on: CUDA by default, the CPU with TOKENCREDIT_TEST_DEVICE=cpu.

Every module there sets ``pytestmark = MARKS``: marked ``cuda`` (``pytest -m cuda`` selects them) and
skipped when the chosen device is CUDA and this machine has none, so the suite passes on a CPU-only
machine while TOKENCREDIT_TEST_DEVICE=cpu still runs the same checks on the CPU.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch

ENV = "TOKENCREDIT_TEST_DEVICE"


def _chosen() -> str:
    name = os.environ.get(ENV, "").strip().lower() or "cuda"
    if name not in ("cuda", "cpu"):
        raise pytest.UsageError(f"{ENV} must be 'cuda' or 'cpu', got {name!r}")
    return name


NAME = _chosen()
DEVICE = torch.device(NAME)
BACKEND = "nccl" if NAME == "cuda" else "gloo"  # the backend torch.distributed uses on that device
AVAILABLE = NAME == "cpu" or torch.cuda.is_available()
MARKS = [
    pytest.mark.cuda,
    pytest.mark.skipif(not AVAILABLE, reason=f"no CUDA device ({ENV}=cpu runs these tests on the CPU)"),
]


def free_port() -> int:
    """A TCP port nothing listens on now (for a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

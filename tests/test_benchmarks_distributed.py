"""Smoke test of benchmarks/distributed_stats.py (issue 29): two gloo ranks on a tiny batch.

The script's sharded DelTA must equal the whole batch's on one process, its counted passes over h
and collectives must match the formulas its --plan prints (and docs/integrations.md quotes),
--plan must run without starting a process group, and --device cuda on a machine without a GPU
stops with one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "distributed_stats.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=ROOT
    )


def test_plan_prints_the_per_step_bytes():
    proc = _run("--plan", "128,8,1024,1536,8")
    assert proc.returncode == 0, proc.stderr
    assert "3.22 GB" in proc.stdout  # bs T H x 2 B, the hidden states the driver receives today
    assert "8 calls, 49.3 kB" in proc.stdout  # all-reduced per DelTA call at H = 1536, K = 1


@pytest.mark.slow
def test_two_ranks_match_the_whole_batch_and_the_formulas(tmp_path):
    out = tmp_path / "stats.json"
    h, k = 16, 2
    proc = _run(
        *("--world", "2", "--n", "4", "--T", "24", "--H", str(h), "--refine-iters", str(k)),
        *("--repeats", "1", "--roofline-mib", "4", "--json", str(out)),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (ranks,) = json.loads(out.read_text())["results"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        d = r["delta"]
        assert d["check_max_abs_err"] < 1e-5
        assert d["passes"] == 2 * (k + 1) and d["passes_source"] == "counted"
        assert d["bytes_read"] == d["passes"] * 4 * 24 * h * 2  # bf16
        assert (d["allreduce_calls"], d["allreduce_bytes"]) == (
            d["allreduce_calls_formula"],
            d["allreduce_bytes_formula"],
        )
        assert r["arca"]["median_s"] > 0 and r["roofline"]["read_gbps"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_without_a_gpu_is_one_clear_line():
    proc = _run("--device", "cuda", "--world", "1")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith("--device cuda: no CUDA device here"), proc.stderr

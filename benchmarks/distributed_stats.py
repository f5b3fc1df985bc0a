"""Per-rank cost of the hidden-state statistics that stay in verl's workers (issue 29): DelTA and ARCA.

With the statistics in the workers, each data-parallel rank holds only its own rollouts' final hidden
states [n, T, H] and computes, per call:

- DelTA: `tokencredit.credit.delta.discriminate` on its rows; with `tokencredit.distributed.Shard`
  the batch-wide sums (centroid sums, counts, denominators, margin moments, the final normaliser) are
  all-reduced over the process group, so every rank gets the coefficients of the whole batch's
  statistics. Only c~ [n, T] float32 leaves the worker.
- ARCA: `tokencredit.credit.arca.residual_norm`, ||h - h_base|| per token, no collective. Only
  [n, T] float32 leaves the worker.

The script starts --world processes with torch.multiprocessing (gloo on CPU, nccl on CUDA, one GPU per
rank), gives every rank the same per-rank shape (random data, seeded per rank) and prints, per rank:
median / min / max seconds per call over --repeats timed calls (after a warm-up call), the bytes of
hidden state read per call (the number of passes over h times n T H times the dtype's size; DelTA's
passes are counted by wrapping its pass helper during one call), the achieved GB/s, the memory-bandwidth
roofline measured on the same device by the same ranks at the same time (a large float32 `sum`, which
only reads, and a `copy_`, counted as read + write), and achieved / roofline. For DelTA it also counts
the collectives of one call (calls and bytes of `torch.distributed.all_reduce` and friends).

    python benchmarks/distributed_stats.py                               # world 1 and 2, CPU, bf16
    python benchmarks/distributed_stats.py --world 2 --n 64 --T 1024 --H 1536 --dtype fp32
    python benchmarks/distributed_stats.py --device cuda --world 1 --n 128 --T 1024 --H 1536
    python benchmarks/distributed_stats.py --plan 128,8,1024,1536,8      # bytes per step, computed

`--plan PROMPTS,G,T,H,RANKS` starts no process: it prints what crosses Ray and what each rank holds per
step before and after the change (bf16 hidden states), and the statistics time computed from an
assumed bandwidth (--assume-gbps, default 3350: an H100 SXM's HBM3 peak).
"""

from __future__ import annotations

import os

# Before torch loads (also in the spawned ranks, which re-import this module): OpenMP threads sleep
# instead of spin-waiting (docs/experiments/credit-cost.md#machine-and-two-environment-effects).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from _common import load_average  # noqa: E402

from tokencredit.credit import arca, delta  # noqa: E402
from tokencredit.distributed import Shard  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Collectives whose calls and sent bytes are counted, with the position of the tensor a rank sends.
COLLECTIVES = {
    "all_reduce": 0,
    "broadcast": 0,
    "all_gather": 1,
    "all_gather_into_tensor": 1,
    "reduce_scatter_tensor": 1,
}
GB = 1e9


# ---------------------------------------------------------------------------- helpers
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], repeats: int, device: torch.device, barrier: bool) -> list[float]:
    """Wall seconds of `repeats` calls after one warm-up call; with `barrier`, all ranks start each call together."""
    fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        if barrier:
            dist.barrier(device_ids=[device.index or 0] if device.type == "cuda" else None)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times


def _summary(times: list[float]) -> dict[str, float]:
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}


@contextlib.contextmanager
def _counting_collectives() -> Iterator[dict[str, int]]:
    """Counts calls and sent tensor bytes of torch.distributed's collectives inside the block.

    Patched in torch.distributed and, where it imported them by name, in tokencredit.distributed.
    """
    counts = {"calls": 0, "bytes": 0}
    modules: list[Any] = [dist]
    with contextlib.suppress(ImportError):
        import tokencredit.distributed as tc_dist

        modules.append(tc_dist)
    saved = []
    for module in modules:
        for name, index in COLLECTIVES.items():
            fn = getattr(module, name, None)
            if fn is None:
                continue

            def wrapper(*args: Any, _fn: Callable[..., Any] = fn, _i: int = index, **kwargs: Any) -> Any:
                counts["calls"] += 1
                sent = args[_i] if len(args) > _i else next(iter(kwargs.values()), None)
                if isinstance(sent, list | tuple):
                    sent = sent[0] if sent else None
                if isinstance(sent, torch.Tensor):
                    counts["bytes"] += sent.numel() * sent.element_size()
                return _fn(*args, **kwargs)

            saved.append((module, name, fn))
            setattr(module, name, wrapper)
    try:
        yield counts
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)


@contextlib.contextmanager
def _counting_passes() -> Iterator[dict[str, int]]:
    """Counts DelTA's passes over h: each call of delta._row_blocks iterates h once."""
    counts = {"passes": 0}
    original = getattr(delta, "_row_blocks", None)
    if original is None:
        yield counts
        return

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        counts["passes"] += 1
        return original(*args, **kwargs)

    delta._row_blocks = wrapper
    try:
        yield counts
    finally:
        delta._row_blocks = original


def make_inputs(
    n: int, t: int, h: int, dtype: torch.dtype, seed: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """One rank's rollouts, drawn on `device` one row at a time (no [n,T,H] float32 temporary):
    hidden and base hidden [n,T,H] in `dtype` (0 on padding, as verl's driver pads them), 1 - p_old
    [n,T], A [n] (both signs on every rank, every 8th rollout 0) and the mask [n,T]."""
    g = torch.Generator(device=device).manual_seed(seed)
    lengths = torch.randint(t // 2, t + 1, (n,), generator=g, device=device)
    mask = torch.arange(t, device=device)[None, :] < lengths[:, None]
    hidden = torch.empty(n, t, h, dtype=dtype, device=device)
    base = torch.empty_like(hidden)
    for i in range(n):
        row = torch.randn(t, h, generator=g, device=device).mul_(mask[i, :, None])
        hidden[i] = row
        base[i] = row.add_(torch.randn(t, h, generator=g, device=device).mul_(0.05 * mask[i, :, None]))
    adv = torch.randn(n, generator=g, device=device)
    adv[torch.arange(n, device=device) % 8 == 7] = 0.0
    adv[0], adv[min(1, n - 1)] = 1.0, -1.0
    scale = torch.rand(n, t, generator=g, device=device) * mask
    return {"hidden": hidden, "base": base, "scale": scale, "adv": adv, "mask": mask}


def roofline(device: torch.device, mib: int, repeats: int, barrier: bool) -> dict[str, float]:
    """Memory bandwidth of the device in GB/s: float32 sum (reads) and copy (read + write) of a `mib` MiB tensor."""
    x = torch.ones(mib * 2**20 // 4, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    nbytes = x.numel() * 4
    t_sum = statistics.median(_timed(lambda: x.sum(), repeats, device, barrier))
    t_copy = statistics.median(_timed(lambda: y.copy_(x), repeats, device, barrier))
    return {"read_gbps": nbytes / t_sum / GB, "copy_gbps": 2 * nbytes / t_copy / GB}


def delta_working_bytes(n: int, t: int, h: int, dtype: torch.dtype) -> int:
    """DelTA's working memory besides h, from the code: the float32 block that upcasts h (delta._row_blocks,
    only for a non-float32 h) and about ten [n,T] float32 tensors (weights, margins, sigmoids, ...)."""
    block = 0
    if dtype != torch.float32:
        block = max(1, min(n, delta._CHUNK_ELEMS // max(1, t * h))) * t * h * 4
    return block + 10 * n * t * 4


# ---------------------------------------------------------------------------- one rank
def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: Any) -> None:
    device = torch.device(args.device if args.device == "cpu" else f"cuda:{rank}")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(args.threads)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        out.put(_measure(rank, world, device, args))
    finally:
        dist.destroy_process_group()


def _measure(rank: int, world: int, device: torch.device, args: argparse.Namespace) -> dict[str, Any]:
    dtype = DTYPES[args.dtype]
    n, t, h, k = args.n, args.T, args.H, args.refine_iters
    x = make_inputs(n, t, h, dtype, args.seed + rank, device)
    group = dist.group.WORLD
    with _counting_collectives() as setup:
        shard = Shard.split(n, group)

    def run_delta() -> Any:
        return delta.discriminate(x["hidden"], x["scale"], x["adv"], x["mask"], 0.8, 1.2, k, shard=shard)

    def run_arca() -> Any:
        return arca.residual_norm(x["hidden"], x["base"], x["mask"])

    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        held = torch.cuda.memory_allocated(device)
    with _counting_passes() as passes, _counting_collectives() as coll:
        terms = run_delta()
    _sync(device)
    # Measured on CUDA (the caching allocator's peak); on CPU there is no allocator statistic.
    extra = torch.cuda.max_memory_allocated(device) - held if device.type == "cuda" else None
    counted = passes["passes"]
    delta_passes = counted if counted else 2 * (k + 1)
    h_bytes = n * t * h * x["hidden"].element_size()

    t_delta = _timed(run_delta, args.repeats, device, barrier=world > 1)
    t_arca = _timed(run_arca, args.repeats, device, barrier=world > 1)
    roof = roofline(device, args.roofline_mib, args.repeats, barrier=world > 1)

    check = None
    if world > 1 and not args.no_check:
        # The whole batch on one process, non-sharded: this rank's rows must get the same coefficients.
        parts = [make_inputs(n, t, h, dtype, args.seed + r, device) for r in range(world)]
        whole = delta.discriminate(
            torch.cat([p["hidden"] for p in parts]),
            torch.cat([p["scale"] for p in parts]),
            torch.cat([p["adv"] for p in parts]),
            torch.cat([p["mask"] for p in parts]),
            0.8,
            1.2,
            k,
        ).coefficients
        check = float((whole[rank * n : (rank + 1) * n] - terms.coefficients).abs().max())
        del parts, whole

    mask_valid = int(x["mask"].sum())
    res = {
        "rank": rank,
        "world": world,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "threads": torch.get_num_threads(),
        "valid_tokens": mask_valid,
        "delta": {
            **_summary(t_delta),
            "passes": delta_passes,
            "passes_source": "counted" if counted else "formula 2(K+1)",
            "bytes_read": delta_passes * h_bytes,
            "allreduce_calls": coll["calls"],
            "allreduce_bytes": coll["bytes"],
            "allreduce_calls_formula": allreduce_calls(k),
            "allreduce_bytes_formula": allreduce_bytes(h, k),
            "shard_setup_calls": setup["calls"],
            "shard_setup_bytes": setup["bytes"],
            "extra_memory_bytes": extra,
            "working_bytes_from_code": delta_working_bytes(n, t, h, dtype),
            "check_max_abs_err": check,
        },
        "arca": {**_summary(t_arca), "passes": 2, "bytes_read": 2 * h_bytes},
        "roofline": roof,
        "hidden_bytes": h_bytes,
    }
    for name in ("delta", "arca"):
        r = res[name]
        r["gbps"] = r["bytes_read"] / r["median_s"] / GB
        r["of_roofline"] = r["gbps"] / roof["read_gbps"]
    return res


# ---------------------------------------------------------------------------- driver
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(world: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(
        _rank, args=(world, _free_port(), args, out), nprocs=world, join=True, start_method="spawn"
    )
    results = [out.get() for _ in range(world)]
    return sorted(results, key=lambda r: r["rank"])


def _fmt_bytes(b: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= size:
            return f"{b / size:.3g} {unit}"
    return f"{b:.0f} B"


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    r0 = results[0]
    print(
        f"\nworld {r0['world']}, device {r0['device']}, {r0['threads']} thread(s) per rank, "
        f"per rank [n={args.n}, T={args.T}, H={args.H}] {args.dtype} = {_fmt_bytes(r0['hidden_bytes'])} "
        f"per hidden tensor, K={args.refine_iters}, load {load_average()}"
    )
    print(
        "rank | statistic | median s (min-max) | h read per call | GB/s | roofline read / copy GB/s | "
        "of roofline (read)"
    )
    for r in results:
        roof = r["roofline"]
        for name, what in (("delta", "DelTA discriminate"), ("arca", "ARCA residual_norm")):
            s = r[name]
            print(
                f"{r['rank']} | {what} | {s['median_s']:.4f} ({s['min_s']:.4f}-{s['max_s']:.4f}) | "
                f"{s['passes']} x {_fmt_bytes(r['hidden_bytes'])} = {_fmt_bytes(s['bytes_read'])} | "
                f"{s['gbps']:.2f} | {roof['read_gbps']:.2f} / {roof['copy_gbps']:.2f} | {s['of_roofline']:.2f}"
            )
    for r in results:
        d = r["delta"]
        extra = f"from the code {_fmt_bytes(d['working_bytes_from_code'])}"
        if d["extra_memory_bytes"] is not None:
            extra += f", measured peak {_fmt_bytes(d['extra_memory_bytes'])}"
        check = (
            ""
            if d["check_max_abs_err"] is None
            else f", max |c~ - whole-batch c~| = {d['check_max_abs_err']:.2e}"
        )
        print(
            f"rank {r['rank']}: DelTA passes over h {d['passes']} ({d['passes_source']}); collectives per call "
            f"{d['allreduce_calls']}, {_fmt_bytes(d['allreduce_bytes'])} (formula {d['allreduce_calls_formula']}, "
            f"{_fmt_bytes(d['allreduce_bytes_formula'])}; shard set-up {d['shard_setup_calls']}, "
            f"{_fmt_bytes(d['shard_setup_bytes'])}); working memory besides h: {extra}{check}"
        )
    n, t, h = args.n, args.T, args.H
    size = DTYPES[args.dtype].itemsize
    print(
        f"per rank to the driver: after c~ [n,T] float32 = {_fmt_bytes(4 * n * t)}; before hidden [n,T,H] "
        f"{args.dtype} = {_fmt_bytes(n * t * h * size)} (DelTA), twice that (ARCA)"
    )


# ---------------------------------------------------------------------------- --plan: computed, not measured
def allreduce_calls(k: int) -> int:
    """All-reduces per sharded DelTA call, from delta.py: the side token counts, K + 1 centroid stages,
    K + 1 margin-moment stages of two calls (sums, then squared deviations), the normaliser."""
    return 1 + (k + 1) + 2 * (k + 1) + 1


def allreduce_bytes(h: int, k: int) -> int:
    """Bytes each rank all-reduces per sharded DelTA call, from delta.py (float64 throughout): side
    counts [2]; per centroid stage the two sides' sums and denominators [2, H + 1]; per margin-moment
    stage [2] twice; the normaliser [2] (valid-token count and sum of c)."""
    return 16 + (k + 1) * 16 * (h + 1) + (k + 1) * 2 * 16 + 16


def plan(spec: str, k: int, dtype: str, assume_gbps: float) -> None:
    """Prints the per-step bytes of the design before and after issue 29, computed (nothing is run)."""
    prompts, g, t, h, ranks = (int(v) for v in spec.split(","))
    size = DTYPES[dtype].itemsize
    bs = prompts * g
    n = -(-bs // ranks)  # rollouts per rank (ceil)
    hid, rank_hid = bs * t * h * size, n * t * h * size
    passes = 2 * (k + 1)
    ms = 1e3 / (assume_gbps * GB)
    f = _fmt_bytes
    print(
        f"plan: {prompts} prompts x {g} responses = bs {bs}, T {t}, H {h}, {dtype}, {ranks} ranks: n {n} per rank"
    )
    print(f"  hidden [bs,T,H] {f(hid)} (per rank [n,T,H] {f(rank_hid)}); ARCA has a second one (base)")
    print("  before (hidden states to the driver, at most: the workers send valid tokens only):")
    print(f"    Ray per step: DelTA {f(hid)}, ARCA {f(2 * hid)}; per rank {f(rank_hid)} / {f(2 * rank_hid)}")
    print(
        f"    driver: DelTA {f(hid)} + its float32 copy {f(hid * 4 // size)} = {f(hid + hid * 4 // size)}; "
        f"ARCA {f(2 * hid)} + float32 copies {f(2 * hid * 4 // size)} = {f(2 * hid + 2 * hid * 4 // size)}"
    )
    print("  after (statistics in the workers):")
    print(
        f"    Ray per step: A [bs] float32 to the workers {f(4 * bs)}; c~ (DelTA) or alpha (ARCA) [bs,T] "
        f"float32 to the driver {f(4 * bs * t)}, per rank {f(4 * n * t)}"
    )
    print(
        f"    all-reduced per rank per DelTA call (K={k}): {allreduce_calls(k)} calls, {f(allreduce_bytes(h, k))}"
    )
    print(f"    driver: [bs,T] float32 {f(4 * bs * t)}")
    print(
        f"    per rank during the statistics: h {f(rank_hid)} (ARCA + base {f(2 * rank_hid)}); DelTA's working "
        f"memory {f(delta_working_bytes(n, t, h, DTYPES[dtype]))}"
    )
    for name, p, up in (("DelTA", passes, 4 + 4), ("ARCA", 2, 0)):
        b = p * rank_hid
        line = f"    {name}: reads h {p} x {f(rank_hid)} = {f(b)} per rank, >= {b * ms:.3g} ms at {assume_gbps:g} GB/s"
        if up and size != 4:
            # each pass also writes and reads the float32 block it upcasts h into (delta._row_blocks)
            b_up = p * n * t * h * (size + up)
            line += f"; with the float32 upcast traffic {f(b_up)}, {b_up * ms:.3g} ms"
        print(line + " (computed, not measured)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", default="1,2", help="comma-separated process counts, run one after another")
    p.add_argument("--n", type=int, default=32, help="rollouts per rank")
    p.add_argument("--T", type=int, default=1024, help="response length (padded)")
    p.add_argument("--H", type=int, default=1024, help="hidden size")
    p.add_argument(
        "--dtype", choices=sorted(DTYPES), default="bf16", help="hidden-state dtype (verl: the model's)"
    )
    p.add_argument("--refine-iters", type=int, default=1, help="DelTA's K (the recipe's default is 1)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch threads per rank on CPU (0: cores / world)")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per statistic (after one warm-up)")
    p.add_argument("--roofline-mib", type=int, default=0, help="roofline tensor size (0: 256 CPU, 2048 CUDA)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-check", action="store_true", help="skip the sharded-vs-whole-batch comparison")
    p.add_argument("--json", help="also write every rank's figures to this file")
    p.add_argument("--plan", metavar="PROMPTS,G,T,H,RANKS", help="print computed bytes per step and exit")
    p.add_argument("--assume-gbps", type=float, default=3350.0, help="bandwidth for --plan's times (GB/s)")
    args = p.parse_args(argv)
    if args.plan:
        plan(args.plan, args.refine_iters, args.dtype, args.assume_gbps)
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here")
    if not args.roofline_mib:
        args.roofline_mib = 2048 if args.device == "cuda" else 256
    worlds = [int(w) for w in args.world.split(",")]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    print(f"torch {torch.__version__}, {cores} cores")
    everything = []
    for world in worlds:
        if args.device == "cuda" and world > torch.cuda.device_count():
            print(
                f"\nworld {world}: skipped, {torch.cuda.device_count()} CUDA device(s) (nccl needs one per rank)"
            )
            continue
        wargs = argparse.Namespace(**vars(args))
        wargs.threads = args.threads or max(1, cores // world)
        results = run_world(world, wargs)
        report(results, wargs)
        everything.append(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": everything}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

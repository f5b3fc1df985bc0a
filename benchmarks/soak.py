"""Soak test (issue 10): memory stays flat over a long run of the embedded task on CPU.

Runs `tokencredit train`'s default job (the shipped toy model, the default recipe, math-verify
rewards, checkpoints) in this process for `--steps` RL steps and samples the resident set size
(VmRSS from /proc/self/status; `resource.getrusage` peak elsewhere) after the garbage collector
has run and glibc's `malloc_trim` has returned free heap pages (the raw figure is printed too), at
step 10, every `--every` steps and at the last step. The verifier's worker processes
are measured too (their RSS is not the trainer's). Exits 1 when the trainer's RSS grew by more
than `--max-growth-mb` from step 10 to the last step. Not collected by pytest (benchmarks/ is not
in testpaths): it takes minutes.

    python benchmarks/soak.py                                       # 200 steps of the default job
    python benchmarks/soak.py --steps 200 --every 20 --set rollout.prompts_per_step=4 --out runs/soak

Evaluation is off except the trainer's final one (after the last sample); any config key can be
changed with --set (as for `tokencredit train`). Results: printed, and `soak.json` in --out.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Before torch loads: no OpenMP spin-waiting on a shared machine (see benchmarks/bench_credit.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

BASELINE_STEP = 10


def rss_mb(pid: int | str = "self") -> float | None:
    """Resident set size of a process in MiB (VmRSS), or None where /proc is unavailable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (VmHWM, else getrusage)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 / (1024 if sys.platform == "darwin" else 1)  # bytes on macOS, KiB on Linux


def malloc_trim() -> bool:
    """Ask glibc to return freed heap pages to the OS (True if it could be called).

    Without it RSS also counts memory that is free inside the allocator, which moves by tens of MB
    from step to step with the lengths of the batch; after it, RSS is close to live memory, the
    quantity a leak makes grow.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
        return True
    except (OSError, AttributeError):
        return False


def slope_per_100(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs, per 100 steps."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return 100 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0


def current_rss_mb() -> float:
    now = rss_mb()
    return now if now is not None else peak_rss_mb()  # without /proc only the peak is known


def workers_rss_mb(trainer: Any) -> float:
    """Summed RSS of the math-verify worker processes (0 for a custom reward function)."""
    verifier = getattr(trainer.reward_fn, "verifier", None)
    if verifier is None:
        return 0.0
    return sum(rss_mb(w.proc.pid) or 0.0 for w in list(verifier.pool._workers) if w.proc.poll() is None)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200, help="RL steps (default 200)")
    p.add_argument("--every", type=int, default=10, help="sample RSS every N steps (default 10)")
    p.add_argument(
        "--out", default=None, help="directory for the run and soak.json (default: a temporary one)"
    )
    p.add_argument(
        "--max-growth-mb",
        type=float,
        default=50.0,
        help=f"fail when RSS grows more than this from step {BASELINE_STEP} to the end (default 50)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=20,
        help="checkpoint.every (default 20, as `tokencredit train`)",
    )
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)"
    )
    args = p.parse_args(argv)
    if args.steps <= BASELINE_STEP:
        p.error(f"--steps must be above {BASELINE_STEP} (the baseline sample)")
    if args.every < 1:
        p.error("--every must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from tokencredit.train.config import load_config
    from tokencredit.train.trainer import Trainer

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tokencredit-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    sets = [
        f"run.steps={args.steps}",
        "run.progress=false",
        "eval.every=0",
        "eval.at_start=false",
        "eval.samples=0",
        "data.eval_size=20",
        f"checkpoint.every={args.checkpoint_every}",
        *args.set,
    ]
    cfg = load_config(sets=sets)
    trainer = Trainer(cfg, out / "run")
    samples: list[dict[str, float]] = []
    t_start = time.perf_counter()
    cpu_start = time.process_time()
    real_step = trainer.step

    def step_and_sample(i: int) -> Any:
        result = real_step(i)
        done = i + 1
        if done == BASELINE_STEP or done % args.every == 0 or done == args.steps:
            gc.collect()  # count live memory, not garbage the collector has yet to free
            raw = current_rss_mb()
            trimmed = current_rss_mb() if malloc_trim() else raw
            s = {
                "step": done,
                "rss_raw_mb": round(raw, 1),
                "rss_mb": round(trimmed, 1),
                "peak_rss_mb": round(peak_rss_mb(), 1),
                "workers_rss_mb": round(workers_rss_mb(trainer), 1),
                "wall_s": round(time.perf_counter() - t_start, 1),
                "cpu_s": round(time.process_time() - cpu_start, 1),
            }
            samples.append(s)
            print(
                f"step {done:4d}  rss {s['rss_mb']:7.1f} MB (before malloc_trim {s['rss_raw_mb']:7.1f})  "
                f"peak {s['peak_rss_mb']:7.1f} MB  "
                f"verifier workers {s['workers_rss_mb']:6.1f} MB  wall {s['wall_s']:6.0f} s  cpu {s['cpu_s']:6.0f} s",
                flush=True,
            )
        return result

    trainer.step = step_and_sample  # type: ignore[method-assign]
    print(
        f"soak: {args.steps} steps of recipe {cfg.algo.recipe} on model {cfg.model.name!r} "
        f"({cfg.rollout.prompts_per_step} x {cfg.rollout.group_size} rollouts, <= {cfg.rollout.max_new_tokens} tokens), "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); run dir {out / 'run'}",
        flush=True,
    )
    trainer.fit()

    base = next(s for s in samples if s["step"] == BASELINE_STEP)
    last = samples[-1]
    growth = last["rss_mb"] - base["rss_mb"]
    after = [s for s in samples if s["step"] >= BASELINE_STEP]
    # A leak is a trend: the least-squares slope over all samples is robust to one noisy endpoint.
    slope = slope_per_100([s["step"] for s in after], [s["rss_mb"] for s in after])
    rss = [s["rss_mb"] for s in after]
    result = {
        "command": " ".join([sys.executable, *sys.argv]),
        "steps": args.steps,
        "config": sets,
        "samples": samples,
        "rss_at_baseline_mb": base["rss_mb"],
        "rss_at_end_mb": last["rss_mb"],
        "growth_mb": round(growth, 1),
        "growth_pct": round(100 * growth / base["rss_mb"], 2),
        "raw_rss_growth_mb": round(last["rss_raw_mb"] - base["rss_raw_mb"], 1),
        "raw_rss_range_mb": [min(s["rss_raw_mb"] for s in after), max(s["rss_raw_mb"] for s in after)],
        "slope_mb_per_100_steps": round(slope, 2),
        "rss_range_mb": [min(rss), max(rss)],
        "malloc_trim": malloc_trim(),
        "workers_rss_growth_mb": round(last["workers_rss_mb"] - base["workers_rss_mb"], 1),
        "max_growth_mb": args.max_growth_mb,
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    result["passed"] = growth <= args.max_growth_mb
    (out / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"RSS step {BASELINE_STEP}: {base['rss_mb']:.1f} MB, step {last['step']}: {last['rss_mb']:.1f} MB, "
        f"growth {growth:+.1f} MB ({result['growth_pct']:+.2f}%), trend {slope:+.2f} MB / 100 steps, "
        f"range {min(rss):.1f}-{max(rss):.1f} MB (before malloc_trim: {base['rss_raw_mb']:.1f} -> {last['rss_raw_mb']:.1f} MB, "
        f"range {result['raw_rss_range_mb'][0]:.1f}-{result['raw_rss_range_mb'][1]:.1f}); "
        f"verifier workers {base['workers_rss_mb']:.1f} -> {last['workers_rss_mb']:.1f} MB; "
        f"{'PASS' if result['passed'] else 'FAIL'} (limit {args.max_growth_mb:.0f} MB). {out / 'soak.json'}"
    )
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

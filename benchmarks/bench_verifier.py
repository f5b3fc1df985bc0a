"""Verifier start-up and first-answer latency (issue 22), idle and with every core busy.

A fresh `MathVerifier` is started (`start(wait=True)`: until every worker is ready), then judges
issue 22's answer (`x^2+2x+1` against `(x+1)^2`: a fresh worker's first symbolic comparison) alone,
then the other equivalence cases of tests/rewards/test_verifier.py that need a worker, in one call.
Printed per trial: the pool's start-up time, the first answer's time, the second call's time, and
the false zeros of both (right answers scored 0: here, timeouts). With `--busy N`, N CPU-bound
neighbour processes spin during the trials (N = the CPU count by default).

Run it against two trees to compare (only `start` and `score`, which every version has, are used):

    python benchmarks/bench_verifier.py --trials 3                 # this tree
    python benchmarks/bench_verifier.py --trials 3 --busy 0        # idle machine
    PYTHONPATH=OLD_TREE/src python benchmarks/bench_verifier.py    # e.g. a checkout before the warm-up

`--timeout` is the per-answer limit of the first call; answers judged wrong that should be right
(false zeros) are counted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from _common import load_average

from tokencredit.rewards import MathVerifier

# (gold, answer): each must verify (tests/rewards/test_verifier.py's EQUIVALENT, not its fast-path cases).
FIRST = ("(x+1)^2", "x^2+2x+1")
CASES = [
    ("\\frac12", "1/2"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\pi/2)"),
    ("\\{1,2,3\\}", "\\{3,2,1\\}"),
    ("1,2,3", "3,2,1"),
    ("\\frac{\\sqrt{3}}{2}", "\\sqrt{3}/2"),
    ("x^2+1", "1+x^2"),
]
BUSY_LOOP = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


def trial(timeout: float, workers: int | None) -> tuple[float, float, float, int]:
    """(start-up, first answer, second call seconds, false zeros) of one fresh verifier."""
    with MathVerifier(timeout, num_workers=workers) as v:
        t0 = time.perf_counter()
        v.start(wait=True)
        t1 = time.perf_counter()
        scores = v.score([f"$\\boxed{{{FIRST[1]}}}$"], [FIRST[0]])
        t2 = time.perf_counter()
        scores += v.score([f"$\\boxed{{{a}}}$" for _, a in CASES], [g for g, _ in CASES])
        t3 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2, sum(s == 0.0 for s in scores)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=5.0, help="per-answer limit of the first call")
    ap.add_argument("--workers", type=int, default=None, help="worker processes (default: the verifier's)")
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="CPU-bound neighbour processes")
    args = ap.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP.format(seconds=600)]) for _ in range(args.busy)]
    try:
        time.sleep(0.5 if busy else 0.0)
        print(
            f"{args.busy} busy neighbours, {os.cpu_count()} CPUs, load average {load_average()}, "
            f"1 + {len(CASES)} answers, limit {args.timeout:g} s"
        )
        rows = [trial(args.timeout, args.workers) for _ in range(args.trials)]
    finally:
        for p in busy:
            p.kill()
            p.wait()
    for i, (start, first, rest, wrong) in enumerate(rows):
        print(
            f"trial {i + 1}: start-up {start:.2f} s   first answer {first:.2f} s   next {len(CASES)} {rest:.2f} s   "
            f"false zeros {wrong}"
        )
    med = [statistics.median(r[k] for r in rows) for k in range(3)]
    print(
        f"median: start-up {med[0]:.2f} s   first answer {med[1]:.2f} s   next {len(CASES)} {med[2]:.2f} s   "
        f"false zeros {sum(r[3] for r in rows)} in all"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

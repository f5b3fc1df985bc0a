"""Wall time of KTAE key values and DelTA coefficients on a GRPO-sized batch.

Setting (defaults): 256 groups x 16 rollouts, responses right-padded to T = 1024 with random
lengths in [50%, 100%] of T, token ids uniform over a 151,936-id vocabulary (Qwen's; uniform ids
are the worst case for KTAE: almost every (group, id) pair is distinct), scores 0/1 at random,
GRPO advantages. DelTA gets a float32 final hidden state [N, T, H], H = 1024, and old
log-probs, and runs the registered method's path (proxy (1 - p) h, never materialised).

Reported: median wall seconds over --repeats runs (after one warm-up run), valid tokens / s,
the median process CPU seconds per run (all threads; on a busy machine, CPU / threads is the
better estimate of the unloaded wall time) and the 1-minute load average.
DelTA's hidden state alone is N x T x H x 4 bytes (17.2 GB at the defaults); when the machine
lacks the memory (or --delta-groups asks for fewer), the DelTA part runs on fewer groups (the
largest count that fits) and also prints the time scaled linearly to the requested size (the cost is a fixed number of passes
over the hidden states, so it is linear in N x T x H). DelTA reads the hidden states
2 (K + 1) times; the printed GB/s is that traffic divided by the time (a memory-bandwidth bound).

    python benchmarks/bench_ktae_delta.py                      # both, 2 threads
    python benchmarks/bench_ktae_delta.py --which ktae --threads 4
    python benchmarks/bench_ktae_delta.py --which delta --groups 64 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from _common import load_average, mem_available_bytes

from tokencredit.advantages import grpo
from tokencredit.credit.delta import coefficients_from_hidden
from tokencredit.credit.ktae import key_token_values


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _time(fn, repeats: int, device: torch.device) -> tuple[list[float], float]:
    """Wall seconds of each run, and the median process CPU seconds (all threads) per run."""
    fn()  # warm-up
    _sync(device)
    times, cpu = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return times, statistics.median(cpu)


def _rollouts(
    groups: int, size: int, max_len: int, min_frac: float, vocab: int, seed: int, device: torch.device
):
    g = torch.Generator().manual_seed(seed)
    n = groups * size
    lo = int(round(min_frac * max_len))
    lengths = torch.randint(lo, max_len + 1, (n,), generator=g)
    mask = torch.arange(max_len)[None, :] < lengths[:, None]
    ids = torch.randint(0, vocab, (n, max_len), generator=g)
    scores = (torch.rand(n, generator=g) < 0.5).float()
    group_ids = torch.arange(groups).repeat_interleave(size)
    return ids.to(device), mask.to(device), scores.to(device), group_ids.to(device)


def bench_ktae(args: argparse.Namespace, device: torch.device) -> None:
    ids, mask, scores, group_ids = _rollouts(
        args.groups, args.group_size, args.max_len, args.min_frac, args.vocab, args.seed, device
    )
    correct = scores > 0
    tokens = int(mask.sum())
    for fisher in ("exact", "official-fp32"):
        times, cpu = _time(
            lambda fisher=fisher: key_token_values(ids, mask, correct, group_ids, fisher=fisher),
            args.repeats,
            device,
        )
        med = statistics.median(times)
        print(
            f"KTAE  fisher={fisher:<13} N={ids.shape[0]} T={args.max_len} valid tokens={tokens:,}: "
            f"median {med:.3f} s ({', '.join(f'{t:.3f}' for t in times)}), {tokens / med:,.0f} tokens/s, "
            f"CPU {cpu:.2f} s, load {load_average()}"
        )


def bench_delta(args: argparse.Namespace, device: torch.device) -> None:
    per_group = args.group_size * args.max_len * args.hidden * 4
    groups = args.delta_groups or args.groups
    if device.type == "cpu":
        avail = mem_available_bytes()
        if avail is not None:
            fits = max(1, int((avail - args.mem_margin_gb * 2**30) // per_group))
            if fits < groups:
                print(
                    f"DelTA: hidden states for {groups} groups need {groups * per_group / 2**30:.1f} GiB, "
                    f"MemAvailable is {avail / 2**30:.1f} GiB: running {fits} groups and scaling linearly"
                )
                groups = fits
    _, mask, scores, group_ids = _rollouts(
        groups, args.group_size, args.max_len, args.min_frac, args.vocab, args.seed, device
    )
    n = mask.shape[0]
    gen = torch.Generator(device=device).manual_seed(args.seed + 1)
    hidden = torch.empty(n, args.max_len, args.hidden, device=device).uniform_(-1.0, 1.0, generator=gen)
    old_logp = -torch.empty(n, args.max_len, device=device).exponential_(generator=gen)
    adv = grpo(scores, group_ids)
    scale = -torch.expm1(old_logp)
    tokens = int(mask.sum())
    times, cpu = _time(
        lambda: coefficients_from_hidden(hidden, scale, adv, mask, refine_iters=args.refine_iters),
        args.repeats,
        device,
    )
    med = statistics.median(times)
    # Roofline: one plain read of the hidden states, the floor for each of DelTA's passes.
    read, _ = _time(lambda: hidden.sum(), args.repeats, device)
    read_s = statistics.median(read)
    passes = 2 * (args.refine_iters + 1)
    gb = passes * hidden.numel() * 4 / 1e9
    print(
        f"DelTA K={args.refine_iters} N={n} T={args.max_len} H={args.hidden} float32, valid tokens={tokens:,}: "
        f"median {med:.3f} s ({', '.join(f'{t:.3f}' for t in times)}), {tokens / med:,.0f} tokens/s, "
        f"{gb / med:.1f} GB/s over {passes} passes, CPU {cpu:.2f} s, load {load_average()}"
    )
    print(
        f"DelTA roofline: one read of the hidden states takes {read_s:.3f} s "
        f"({hidden.numel() * 4 / 1e9 / read_s:.1f} GB/s), so {passes} passes need >= {passes * read_s:.3f} s"
    )
    if groups != args.groups:
        print(
            f"DelTA scaled to {args.groups} groups ({args.groups * args.group_size} rollouts): "
            f"~{med * args.groups / groups:.2f} s (roofline >= {passes * read_s * args.groups / groups:.2f} s)"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--which", choices=("both", "ktae", "delta"), default="both")
    p.add_argument("--groups", type=int, default=256)
    p.add_argument("--group-size", type=int, default=16)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--min-frac", type=float, default=0.5, help="shortest response as a fraction of --max-len")
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--refine-iters", type=int, default=1)
    p.add_argument(
        "--delta-groups",
        type=int,
        default=0,
        help="run DelTA on this many groups and scale the time linearly to --groups (0: --groups)",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--mem-margin-gb", type=float, default=3.0, help="memory left free when sizing DelTA's batch"
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {device}")
    with torch.no_grad():
        if args.which in ("both", "ktae"):
            bench_ktae(args, device)
        if args.which in ("both", "delta"):
            bench_delta(args, device)


if __name__ == "__main__":
    main()

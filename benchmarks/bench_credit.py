"""Cost of every registered credit method and ratio kernel on a GRPO-sized batch, next to its signals pass.

Standard batch (defaults): 256 groups x 16 rollouts, responses right-padded to T = 1024 with random
lengths in [50%, 100%] of T (3.16M valid tokens), token ids uniform over a 151,936-id vocabulary,
0/1 scores at random, GRPO advantages. Each method gets the signals it declares (`needs`), random:
old / ref / base / negative-prompt log-probs (-Exp(1) and perturbations of it), entropy U(0, 5), and
float32 hidden states [N, T, 1024] U(-1, 1) for the hidden-state methods (delta, arca).

Measured:
- every method in `tokencredit.credit.CREDIT_METHODS` through `credit.compute` (what the trainer and
  the plugins call: signal check, the method, masking, finiteness check);
- the statistics-only pieces named by the targets on their own: `ktae.key_token_values`,
  `entropy.top_entropy_mask`, `traces.trace_log_weights` (P-trace; S-trace over the top-20%),
  `gcpo.rank_power_weights`, `arca.normalize_scores`, `delta.coefficients_from_hidden`;
- every ratio kernel in `tokencredit.objectives.KERNELS`: forward + backward of `policy_loss`
  (S-trace with the top-20% entropy mask as its kept set);
- the signals pass each method needs: the LM-head part of it (`tokencredit.signals.chunked_log_probs`
  at V = 151,936, H = 1024, with / without entropy), timed on `--signal-tokens` tokens and scaled
  linearly to the batch. It is a lower bound: the decoder forward comes on top and depends on the
  model; hidden states come free with the old-policy forward, base_hidden needs an adapter-disabled
  forward (decoder only, not timed here).

Hidden states at full size take N x T x H x 4 B = 17.2 GB each (ARCA needs two). The hidden-state
methods therefore run on a fraction `--hidden-scale` of the batch (default: the largest power-of-two
fraction whose tensors fit in MemAvailable with a margin) and their time is also given scaled linearly
to the full batch (their cost is a fixed number of passes over the hidden states).

Times: median wall seconds of `--repeats` runs after one warm-up, valid tokens / s, median process CPU
seconds (all threads; on a loaded machine CPU / threads estimates the unloaded wall time), the
1-minute load average at the time. Scaling: every method at 1/16, 1/4 and 1 of its batch (groups
scaled, T fixed); time / token should stay flat. Plot: `--plot` (default benchmarks/credit_scaling.png).

OpenMP: unless OMP_WAIT_POLICY is already set, this script sets it to PASSIVE before torch loads. On a
2-core machine shared with other processes, libgomp's default spin-waiting at every parallel region
made medium-sized ops 10-20x slower with 2 threads (KTAE on 16 groups: 1.35 s vs 0.066 s PASSIVE, 0.057 s
with 1 thread; load ~5.5): the figures then measure the neighbours, not the code. On a dedicated machine
the default policy is fine: run `OMP_WAIT_POLICY=ACTIVE python benchmarks/...` to keep it.

    python benchmarks/bench_credit.py                          # full batch, 2 threads
    python benchmarks/bench_credit.py --scale 0.25 --hidden-scale 0.0625 --repeats 1
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# Before torch loads (see the module docstring): libgomp reads this once, at start-up.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from _common import mem_available_bytes

from tokencredit import credit, objectives
from tokencredit.advantages import grpo
from tokencredit.batch import RolloutBatch
from tokencredit.credit import arca, delta, entropy, gcpo, ktae
from tokencredit.objectives import traces

HIDDEN_SIGNALS = frozenset({"hidden", "base_hidden"})
TARGET_S = 3.0
SCALING = (1 / 16, 1 / 4, 1.0)


def eval_fraction(text: str) -> float:
    """'1/16' -> 0.0625, '4' -> 4.0."""
    num, _, den = text.strip().partition("/")
    return float(num) / float(den or 1)


def _load() -> float:
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return float("nan")


@dataclass
class Timing:
    seconds: float  # median wall
    runs: list[float]
    cpu: float  # median process CPU seconds
    load: float
    tokens: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def timeit(fn: Callable[[], object], repeats: int, tokens: int, warmup: bool = True) -> Timing:
    if warmup:
        fn()
    wall, cpu = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return Timing(statistics.median(wall), wall, statistics.median(cpu), _load(), tokens)


# ---------------------------------------------------------------------------- inputs
@dataclass
class Inputs:
    batch: RolloutBatch
    adv: torch.Tensor
    tokens: int
    groups: int
    extra: dict[str, torch.Tensor] = field(default_factory=dict)


def make_inputs(args: argparse.Namespace, groups: int, with_hidden: bool) -> Inputs:
    """A random batch of `groups` groups with every [N,T] signal (and hidden states when asked)."""
    g = torch.Generator().manual_seed(args.seed)
    n, t = groups * args.group_size, args.max_len
    lengths = torch.randint(int(round(args.min_frac * t)), t + 1, (n,), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    ids = torch.randint(0, args.vocab, (n, t), generator=g)
    scores = (torch.rand(n, generator=g) < 0.5).float()
    group_ids = torch.arange(groups).repeat_interleave(args.group_size)
    old = -torch.empty(n, t).exponential_(generator=g)
    sig = {
        "old_log_probs": old,
        "ref_log_probs": (old + 0.05 * torch.randn(n, t, generator=g)).clamp(max=0.0),
        "base_log_probs": (old + 0.1 * torch.randn(n, t, generator=g)).clamp(max=0.0),
        "neg_log_probs": (old + 0.5 * torch.randn(n, t, generator=g)).clamp(max=0.0),
        "entropy": 5.0 * torch.rand(n, t, generator=g),
    }
    batch = RolloutBatch(ids, mask, group_ids, scores, **sig)
    if with_hidden:
        # Set after validation: RolloutBatch's finiteness check on [N,T,H] costs more than the
        # methods at this size (timed on its own by `validation_cost`).
        batch.hidden = torch.empty(n, t, args.hidden).uniform_(-1.0, 1.0, generator=g)
        batch.base_hidden = torch.empty(n, t, args.hidden).uniform_(-1.0, 1.0, generator=g)
    return Inputs(batch, grpo(scores, group_ids), int(mask.sum()), groups)


def validation_cost(x: Inputs, groups: int = 4) -> float:
    """Seconds per GB that `RolloutBatch` validation of one hidden tensor takes, timed on `groups` groups of `x`."""
    b = x.batch
    rows = min(b.num_rollouts, groups * int((b.group_ids == b.group_ids[0]).sum()))
    hid = b.hidden[:rows]
    t0 = time.perf_counter()
    RolloutBatch(b.token_ids[:rows], b.mask[:rows], b.group_ids[:rows], b.scores[:rows], hidden=hid)
    seconds = time.perf_counter() - t0
    gb = hid.numel() * 4 / 1e9
    t1 = time.perf_counter()
    finite = torch.isfinite(hid.amax(-1)) & torch.isfinite(
        hid.amin(-1)
    )  # NaN / inf propagate through amax/amin
    alt = time.perf_counter() - t1
    assert bool(finite.all())
    print(
        f"   RolloutBatch(..., hidden=[{', '.join(map(str, hid.shape))}]) validation: {seconds:.2f} s for {gb:.2f} GB "
        f"({gb / seconds:.2f} GB/s; ~{seconds / gb * 17.18:.0f} s per hidden tensor of the standard batch); "
        f"an amax/amin finiteness check takes {alt:.3f} s ({gb / alt:.1f} GB/s); load {_load():.2f}"
    )
    return seconds / gb


def roofline(x: Inputs, repeats: int) -> None:
    """One plain read of the hidden states: the floor for each of DelTA's 2 (K + 1) passes."""
    h = x.batch.hidden
    t = timeit(lambda: h.sum(), repeats, x.tokens)
    gb = h.numel() * 4 / 1e9
    print(
        f"   roofline: one read of hidden ({gb:.2f} GB) takes {t.seconds:.3f} s ({gb / t.seconds:.1f} GB/s): DelTA "
        f"(K=1, 4 passes) >= {4 * t.seconds:.3f} s here, ARCA's residual norm (2 tensors) >= {2 * t.seconds:.3f} s"
    )


def hidden_fraction(args: argparse.Namespace) -> float:
    """Largest power-of-two fraction of --scale whose two hidden tensors (+ validation temporaries) fit."""
    if args.hidden_scale > 0:
        return args.hidden_scale
    per_group = args.group_size * args.max_len * args.hidden * 4
    budget = (mem_available_bytes() or 0) - args.mem_margin_gb * 2**30
    frac = 1.0
    while frac > 1 / 1024:
        groups = max(1, round(args.groups * args.scale * frac))
        # two float32 [N,T,H] tensors, the batch's finiteness check (bool temporaries, 1/4 each) and
        # ~25% headroom for the methods' own buffers
        if 2.75 * groups * per_group <= budget:
            return args.scale * frac
        frac /= 2
    return args.scale * frac


# ---------------------------------------------------------------------------- what is measured
@dataclass
class Case:
    name: str
    kind: str  # "credit" | "statistic" | "kernel"
    hidden: bool
    needs: frozenset[str]
    build: Callable[[Inputs], Callable[[], object]]
    target: bool = False  # one of the statistics-only pieces with the <= 3 s target


def _credit_case(name: str) -> Case:
    m = credit.get(name)

    def build(x: Inputs) -> Callable[[], object]:
        return lambda: credit.compute(name, x.batch, x.adv)

    return Case(name, "credit", bool(m.needs & HIDDEN_SIGNALS), m.needs, build)


def _kernel_case(name: str) -> Case:
    k = objectives.get_kernel(name)

    def build(x: Inputs) -> Callable[[], object]:
        b = x.batch
        lp0 = (
            b.old_log_probs
            + 0.01 * torch.randn(b.old_log_probs.shape, generator=torch.Generator().manual_seed(1))
        ).clamp(max=0.0)
        kw = {"keep": entropy.top_entropy_mask(b.entropy, b.mask, 0.2)} if k.uses_keep else {}
        args = objectives.ObjectiveArgs(kernel=name, kernel_args=kw)
        adv_hat = x.adv[:, None] * b.mask

        def run() -> object:
            lp = lp0.clone().requires_grad_(True)
            loss, _ = objectives.policy_loss(lp, b.old_log_probs, adv_hat, b.mask, args)
            loss.backward()
            return lp.grad

        return run

    return Case(f"kernel:{name}", "kernel", False, k.needs | {"old_log_probs"}, build)


def _stat_cases() -> list[Case]:
    def k_values(x: Inputs):
        b = x.batch
        return lambda: ktae.key_token_values(b.token_ids, b.mask, b.correct(), b.group_ids)

    def ent_mask(x: Inputs):
        return lambda: entropy.top_entropy_mask(x.batch.entropy, x.batch.mask, 0.2)

    def ptrace(x: Inputs):
        lr = x.batch.old_log_probs - x.batch.ref_log_probs
        return lambda: traces.trace_log_weights(lr, x.batch.mask, 0.95)

    def strace(x: Inputs):
        lr = x.batch.old_log_probs - x.batch.ref_log_probs
        keep = entropy.top_entropy_mask(x.batch.entropy, x.batch.mask, 0.2)
        return lambda: traces.trace_log_weights(lr, x.batch.mask, 0.95, keep=keep)

    def gcpo_w(x: Inputs):
        b = x.batch
        return lambda: gcpo.rank_power_weights(b.old_log_probs, b.neg_log_probs, b.mask)

    def arca_norm(x: Inputs):
        b = x.batch
        alpha = (b.old_log_probs - b.base_log_probs).abs()  # any non-negative [N,T] salience
        return lambda: arca.normalize_scores(alpha, b.mask)

    def delta_coef(x: Inputs):
        b = x.batch
        scale = (-torch.expm1(b.old_log_probs)).clamp(0.0, 1.0)
        return lambda: delta.coefficients_from_hidden(b.hidden, scale, x.adv, b.mask)

    return [
        Case("ktae.key_token_values", "statistic", False, frozenset(), k_values, True),
        Case("entropy.top_entropy_mask", "statistic", False, frozenset({"entropy"}), ent_mask, True),
        Case("traces.trace_log_weights P", "statistic", False, frozenset({"old_log_probs"}), ptrace, True),
        Case(
            "traces.trace_log_weights S",
            "statistic",
            False,
            frozenset({"old_log_probs", "entropy"}),
            strace,
            True,
        ),
        Case(
            "gcpo.rank_power_weights",
            "statistic",
            False,
            frozenset({"old_log_probs", "neg_log_probs"}),
            gcpo_w,
            True,
        ),
        Case("arca.normalize_scores", "statistic", False, frozenset(), arca_norm, True),
        Case(
            "delta.coefficients_from_hidden",
            "statistic",
            True,
            frozenset({"hidden", "old_log_probs"}),
            delta_coef,
            True,
        ),
    ]


def all_cases() -> list[Case]:
    return (
        [_credit_case(n) for n in sorted(credit.CREDIT_METHODS)]
        + _stat_cases()
        + [_kernel_case(n) for n in sorted(objectives.KERNELS)]
    )


# ---------------------------------------------------------------------------- signals pass
def lm_head_cost(args: argparse.Namespace) -> dict[bool, float]:
    """Seconds per token of the chunked LM head (log p, with / without entropy) at V, H."""
    from tokencredit.signals import chunked_log_probs

    m = args.signal_tokens
    g = torch.Generator().manual_seed(args.seed)
    head = torch.nn.Linear(args.hidden, args.vocab, bias=False)
    with torch.no_grad():
        head.weight.normal_(generator=g).mul_(2.0 / math.sqrt(args.hidden))
        h = torch.randn(m, args.hidden, generator=g)
        y = torch.randint(0, args.vocab, (m,), generator=g)
        out = {}
        for with_entropy in (False, True):
            chunked_log_probs(h[:64], head, y[:64], with_entropy=with_entropy)  # warm-up
            t = timeit(
                lambda e=with_entropy: chunked_log_probs(h, head, y, with_entropy=e), 1, m, warmup=False
            )
            out[with_entropy] = t.seconds / m
            print(
                f"signals: chunked LM head V={args.vocab} H={args.hidden} {'log p + entropy' if with_entropy else 'log p'}"
                f" on {m} tokens: {t.seconds:.2f} s ({m / t.seconds:,.0f} tokens/s), CPU {t.cpu:.2f} s, load {t.load:.2f}"
            )
    return out


def signal_passes(needs: frozenset[str]) -> tuple[int, bool, str]:
    """(LM-head passes, entropy in one of them, note) that the signals `needs` cost."""
    passes, notes = 0, []
    policy = needs & {"old_log_probs", "entropy"}
    if policy:
        passes += 1
    if "ref_log_probs" in needs:
        passes += 1
    if "base_log_probs" in needs:
        passes += 1
    if "neg_log_probs" in needs:
        passes += 1
        notes.append("negative-prompt forward")
    if "hidden" in needs and not policy:
        notes.append("decoder forward")
    if "base_hidden" in needs and "base_log_probs" not in needs:
        notes.append("adapter-off decoder forward")
    return passes, "entropy" in needs, ", ".join(notes)


# ---------------------------------------------------------------------------- main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, default=256)
    p.add_argument("--group-size", type=int, default=16)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--min-frac", type=float, default=0.5)
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--scale", type=float, default=1.0, help="fraction of --groups for the [N,T] methods")
    p.add_argument(
        "--hidden-scale",
        type=float,
        default=0.0,
        help="fraction of --groups for the hidden-state methods (0: the largest power of two that fits)",
    )
    p.add_argument("--mem-margin-gb", type=float, default=4.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--signal-tokens", type=int, default=1024, help="tokens for the LM-head timing (0: skip)")
    p.add_argument("--no-scaling", action="store_true", help="only the full batch, no 1/16 and 1/4 runs")
    p.add_argument(
        "--scaling",
        default="1/16,1/4,1",
        help="batch fractions for the scaling table; the largest runs at --scale (--hidden-scale for hidden cases)",
    )
    p.add_argument("--only", default="", help="comma-separated case names to run (default: all)")
    p.add_argument("--plot", default=str(Path(__file__).resolve().parent / "credit_scaling.png"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    cases = all_cases()
    if args.only:
        wanted = {s.strip() for s in args.only.split(",")}
        cases = [c for c in cases if c.name in wanted]
    h_scale = hidden_fraction(args)
    full_tokens_est = args.groups * args.group_size * args.max_len * (1 + args.min_frac) / 2
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, OMP_WAIT_POLICY="
        f"{os.environ.get('OMP_WAIT_POLICY')}, MALLOC_MMAP_THRESHOLD_={os.environ.get('MALLOC_MMAP_THRESHOLD_')}; "
        f"standard batch {args.groups} groups x "
        f"{args.group_size} x T={args.max_len} (lengths {args.min_frac:.0%}-100%), V={args.vocab}, H={args.hidden}; "
        f"[N,T] methods at scale {args.scale:g}, hidden-state methods at scale {h_scale:g}; load {_load():.2f}"
    )
    fractions = (
        (1.0,) if args.no_scaling else tuple(sorted(float(eval_fraction(f)) for f in args.scaling.split(",")))
    )
    base_scale = {c.name: (h_scale if c.hidden else args.scale) for c in cases}
    results: dict[str, dict[float, Timing]] = {c.name: {} for c in cases}
    for with_hidden in (False, True):
        group_cases = [c for c in cases if c.hidden == with_hidden]
        if not group_cases:
            continue
        for frac in fractions:
            # the largest fraction runs at the case's scale, the others below it
            groups = max(1, round(args.groups * base_scale[group_cases[0].name] * frac / fractions[-1]))
            t0 = time.perf_counter()
            x = make_inputs(args, groups, with_hidden)
            print(
                f"-- {groups} groups ({x.tokens:,} valid tokens){' with hidden states' if with_hidden else ''}: "
                f"batch built in {time.perf_counter() - t0:.1f} s, load {_load():.2f}"
            )
            if with_hidden and frac == fractions[-1]:
                validation_cost(x)
                roofline(x, args.repeats)
            for c in group_cases:
                t = timeit(c.build(x), args.repeats, x.tokens)
                results[c.name][frac] = t
                print(
                    f"   {c.name:<32} {t.seconds:8.3f} s  {t.tokens_per_s:14,.0f} tokens/s  CPU {t.cpu:7.2f} s  "
                    f"load {t.load:.2f}  runs {', '.join(f'{r:.3f}' for r in t.runs)}"
                )
            del x

    head = lm_head_cost(args) if args.signal_tokens > 0 else None

    # ---- main table: each case at its largest size, hidden-state cases scaled to the full batch
    print(
        f"\nSummary: standard batch ({args.groups} groups, ~{full_tokens_est / 1e6:.2f}M valid tokens); "
        f"target <= {TARGET_S:g} s for the statistics-only pieces on 2 cores"
    )
    hdr = f"{'case':<32} {'measured at':>12} {'seconds':>9} {'tokens/s':>12} {'CPU s':>8} {'load':>5} {'full batch s':>13} {'target':>7}  signals pass (LM head, full batch)"
    print(hdr)
    print("-" * len(hdr))
    for c in cases:
        t = results[c.name][fractions[-1]]
        full_s = t.seconds / base_scale[c.name]
        target = ("PASS" if full_s <= TARGET_S else "FAIL") if c.target else ""
        sig = ""
        if head is not None:
            passes, ent, note = signal_passes(c.needs)
            full_tok = t.tokens / base_scale[c.name]
            cost = passes * head[False] * full_tok + ((head[True] - head[False]) * full_tok if ent else 0.0)
            sig = (
                f"{passes} pass(es){' + entropy' if ent else ''}: ~{cost:,.0f} s (credit = {100 * full_s / cost:.3f}%)"
                if passes
                else "none"
            )
            if note:
                sig += f" (+ {note})"
        print(
            f"{c.name:<32} {base_scale[c.name]:>11g}x {t.seconds:9.3f} {t.tokens_per_s:12,.0f} {t.cpu:8.2f} "
            f"{t.load:5.2f} {full_s:13.2f} {target:>7}  {sig}"
        )

    if len(fractions) > 1:
        print(
            "\nScaling (groups scaled at fixed T): seconds and microseconds per 1k valid tokens; flat = linear"
        )
        print(f"{'case':<32} " + "  ".join(f"{f'x{f:g}':>26}" for f in fractions) + "   max/min of s/token")
        for c in cases:
            cells, per_tok = [], []
            for f in fractions:
                t = results[c.name][f]
                per_tok.append(t.seconds / t.tokens)
                cells.append(f"{t.tokens:>9,} {t.seconds:7.3f}s {1e9 * t.seconds / t.tokens:6.1f}")
            print(
                f"{c.name:<32} "
                + "  ".join(f"{s:>26}" for s in cells)
                + f"   {max(per_tok) / min(per_tok):6.2f}"
            )
        if args.plot:
            plot(results, cases, fractions, args.plot, base_scale, args)


def plot(results, cases, fractions, path: str, base_scale, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 6))
    kinds = [
        ("credit methods (credit.compute) and statistics", ("credit", "statistic")),
        ("ratio kernels: policy_loss forward + backward", ("kernel",)),
    ]
    colors = plt.cm.tab20.colors
    markers = "osD^v<>"
    for ax, (title, ks) in zip(axes, kinds):
        shown = [c for c in cases if c.kind in ks]
        for i, c in enumerate(shown):
            xs = [results[c.name][f].tokens for f in fractions]
            ys = [results[c.name][f].seconds for f in fractions]
            ax.plot(
                xs,
                ys,
                marker=markers[i % len(markers)],
                color=colors[i % len(colors)],
                linestyle="--" if c.hidden else "-",
                label=c.name + (" (hidden states)" if c.hidden else ""),
            )
        if not shown:
            continue
        lo = min(results[c.name][fractions[0]].tokens for c in shown)
        hi = max(results[c.name][fractions[-1]].tokens for c in shown)
        ymin = min(results[c.name][f].seconds for c in shown for f in fractions)
        ax.plot(
            [lo, hi], [ymin, ymin * hi / lo], color="grey", linewidth=4, alpha=0.3, label="slope 1 (linear)"
        )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("valid tokens in the batch")
        ax.set_ylabel("seconds (median of runs)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    h_scale = max((base_scale[c.name] for c in cases if c.hidden), default=0.0)
    malloc = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    fig.suptitle(
        f"credit cost vs batch size: {args.groups} groups x {args.group_size} x T={args.max_len} at x{fractions[-1]:g}, "
        f"hidden-state methods (dashed) at {h_scale:g} of that; {torch.get_num_threads()} CPU threads, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, "
        f"{'MALLOC_MMAP_THRESHOLD_=' + malloc if malloc else 'default glibc malloc'}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()

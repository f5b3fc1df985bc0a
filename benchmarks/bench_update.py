"""The policy update against its compute floor, and the default `tokencredit train` run's time split (issue 18).

Two modes:

`--train-run DIR` runs the default `tokencredit train` (40 steps, recipe dapo+ktae, shipped toy model,
1 torch thread) in this process and prints its wall and CPU time split into generation, signals
(+ credit), update (from metrics.jsonl's time_generate / time_signals / time_update), evaluation
(`Trainer.evaluate`, timed here) and the rest (rollout records, checkpoints, export, summary), with
the held-out greedy accuracy at the start and the end. It works with any version of tokencredit on
PYTHONPATH, so an older checkout gives the "before" figures.

Without it, the update of one default training step is timed against two floors. The batch is
the default run's first step (`Trainer.sample(0)`, the signals pass and the credit, seed 0); every
timed call starts from the same parameters and optimizer state.

- *update*: `tokencredit.train.update.policy_update` as the trainer calls it (the training forward
  with the fused old-policy log-probs and entropy, the loss, the backward, grad clipping, AdamW).
- *floor A*: one forward + backward of the whole [N, P+T] batch, the model's own forward (logits of
  every position, no cache), then log_softmax at the response positions, gathered, weighted by the
  advantages and summed. No checks, no chunking, no optimizer. This is the floor the issue names.
- *floor B*: the minimal work: each distinct prompt once (all but its last token) into a cache, the
  cache rows repeated to the group's rollouts, then [last prompt token + response] of every row over
  it, the same loss and the backward through both.
- *optimizer*: `clip_grad_norm_` + `AdamW.step` alone (part of *update*, not of the floors).

The paths alternate (update, floor A, floor B, optimizer, update, ...) for `--repeats` rounds after
one warm-up each; medians are printed with the 1-minute load average. `--profile` prints torch
profiler tables (top ops by self CPU time) of one update and one floor-A call.

    python benchmarks/bench_update.py --repeats 7
    python benchmarks/bench_update.py --train-run /tmp/run_after --seed 0
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Before torch loads: libgomp reads this once, at start-up (see bench_trainer_vs_trl.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from _common import load_average


def _clock(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


# ---------------------------------------------------------------------------- the default run
def train_run(out: str, seed: int) -> None:
    """The default `tokencredit train` into `out`, with its time split (module docstring)."""
    import tokencredit.train.trainer as trainer_mod
    from tokencredit.cli import main as cli_main

    spent = {"wall": 0.0, "cpu": 0.0, "calls": 0}
    inner = trainer_mod.Trainer.evaluate

    def timed(self: Any, step: int) -> dict[str, Any]:
        w, c, res = _clock(lambda: inner(self, step))
        spent["wall"] += w
        spent["cpu"] += c
        spent["calls"] += 1
        return res

    trainer_mod.Trainer.evaluate = timed
    load0 = load_average()
    w, c, rc = _clock(lambda: cli_main(["train", "--out", out, "--no-progress", "--seed", str(seed)]))
    load1 = load_average()
    recs = [
        json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines() if line.strip()
    ]
    steps = [r for r in recs if r.get("type") != "eval" and "step" in r]
    evals = [r for r in recs if r.get("type") == "eval"]
    split = {k: sum(r.get(f"time_{k}", 0.0) for r in steps) for k in ("generate", "signals", "update")}
    rest = w - sum(split.values()) - spent["wall"]
    rounds = sum(r.get("gen_rounds", 0) for r in steps)
    tokens = sum(r.get("tokens", 0) for r in steps)
    print(
        f"train run seed {seed} ({trainer_mod.__file__}): exit {rc}, {w:.1f} s wall, {c:.1f} s CPU; "
        f"load {load0} -> {load1}"
    )
    print(
        f"  generation {split['generate']:.1f} s ({rounds} rounds), signals+credit {split['signals']:.1f} s, "
        f"update {split['update']:.1f} s ({tokens} response tokens, {split['update'] / max(1, len(steps)):.3f} s/step), "
        f"evaluation {spent['wall']:.1f} s wall / {spent['cpu']:.1f} s CPU ({spent['calls']} calls), "
        f"rest {rest:.1f} s"
    )
    accs = [(e["step"], e.get("eval_greedy_accuracy")) for e in evals]
    print("  held-out greedy accuracy: " + ", ".join(f"step {s}: {a:.3f}" for s, a in accs))


# ---------------------------------------------------------------------------- the update and its floors
def step_batch(seed: int, work: Path) -> tuple[Any, dict[str, Any]]:
    """A trainer with the default config and the inputs of its first step's update."""
    from rich.console import Console

    from tokencredit.train.config import TrainConfig
    from tokencredit.train.trainer import Trainer

    cfg = TrainConfig()
    cfg.run.seed, cfg.run.progress = seed, False
    trainer = Trainer(cfg, work / "run", console=Console(quiet=True))
    try:
        ro = trainer.sample(0)
    finally:
        trainer.reward_fn.close()
    batch = trainer.old_policy_batch(ro)
    seq, attn = ro.sequences.to(trainer.device), ro.attention_mask.to(trainer.device)
    credit = trainer.credit(batch)
    inputs = {
        "batch": batch,
        "credit": credit,
        "sequences": seq,
        "attention_mask": attn,
        "prompt_len": int(ro.prompt_ids.shape[1]),
        "group_ids": ro.group_ids,
    }
    return trainer, inputs


def floor_a(model: Any, x: dict[str, Any]) -> None:
    """Forward + backward of the whole [N, P+T] batch: the model's logits, log_softmax, gather, weighted sum."""
    seq, att, p = x["sequences"], x["attention_mask"], x["prompt_len"]
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=seq, attention_mask=att, position_ids=pos, use_cache=False).logits
    logp = torch.log_softmax(logits[:, p - 1 : -1].float(), -1).gather(-1, seq[:, p:, None]).squeeze(-1)
    (logp * x["weights"]).sum().backward()


def floor_b(model: Any, x: dict[str, Any]) -> None:
    """Each distinct prompt once, its cache repeated to the rollouts, then [last prompt token + response]."""
    from transformers import DynamicCache

    seq, att, p = x["sequences"], x["attention_mask"], x["prompt_len"]
    first, rows = x["distinct"], x["rows"]
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    model(
        input_ids=seq[first, : p - 1],
        attention_mask=att[first, : p - 1],
        position_ids=pos[first, : p - 1],
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys[rows], layer.values[rows]
    logits = model(
        input_ids=seq[:, p - 1 : -1],
        attention_mask=att[:, :-1],
        position_ids=pos[:, p - 1 : -1],
        cache=cache,
        use_cache=True,
    ).logits
    logp = torch.log_softmax(logits.float(), -1).gather(-1, seq[:, p:, None]).squeeze(-1)
    (logp * x["weights"]).sum().backward()


def update_vs_floor(args: argparse.Namespace) -> None:
    from tokencredit.train.update import policy_update

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        trainer, x = step_batch(args.seed, Path(tmp))
    model, opt = trainer.model, trainer.optimizer
    mask = x["batch"].mask
    x["weights"] = x["credit"].token_advantages.detach() * mask / max(1, int(mask.sum()))
    x["distinct"] = torch.cat(
        [torch.ones(1, dtype=torch.bool), x["group_ids"][1:] != x["group_ids"][:-1]]
    ).nonzero()[:, 0]
    x["rows"] = (
        torch.cumsum(x["distinct"].new_zeros(len(x["group_ids"])).index_fill_(0, x["distinct"], 1), 0) - 1
    )
    start = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()))
    seq_len = x["sequences"].shape[1]
    n = x["sequences"].shape[0]
    print(
        f"batch: {n} rollouts, [N, P+T] = [{n}, {seq_len}] (P = {x['prompt_len']}), "
        f"{int(mask.sum())} response tokens, {len(x['distinct'])} groups; fused old pass: {trainer.fused_old}"
    )

    def reset() -> None:
        model.load_state_dict(start[0])
        opt.load_state_dict(start[1])
        opt.zero_grad(set_to_none=True)

    def update() -> None:
        c = trainer.cfg
        policy_update(
            model,
            opt,
            x["batch"],
            x["credit"],
            x["sequences"],
            x["attention_mask"],
            x["prompt_len"],
            c.optim,
            temperature=c.rollout.temperature,
            fuse_old=trainer.fused_old,
            seed=c.run.seed,
            step=0,
        )

    def optimizer() -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            p.grad = torch.zeros_like(p)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    model.train()
    paths: dict[str, Callable[[], None]] = {
        "update": update,
        "floor A": lambda: floor_a(model, x),
        "floor B": lambda: floor_b(model, x),
        "optimizer": optimizer,
    }
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in paths}
    loads = []
    for r in range(args.repeats + 1):
        loads.append(load_average())
        for name, fn in paths.items():
            reset()
            model.train()
            w, c, _ = _clock(fn)
            if r:
                times[name].append((w, c))
    med = {
        k: (statistics.median(t[0] for t in v), statistics.median(t[1] for t in v)) for k, v in times.items()
    }
    print(
        f"{args.repeats} alternated rounds after a warm-up, {torch.get_num_threads()} thread(s); "
        f"load (1 min) at each round: {', '.join(loads)}"
    )
    for k, (w, c) in med.items():
        print(f"  {k:<10} median {w:.3f} s wall, {c:.3f} s CPU")
    for f in ("floor A", "floor B"):
        print(
            f"  update / {f}: {med['update'][0] / med[f][0]:.2f}x wall, {med['update'][1] / med[f][1]:.2f}x CPU"
        )
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for name in ("update", "floor A"):
            reset()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                paths[name]()
            print(f"--- {name}: top ops by self CPU time")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.profile_rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--train-run", metavar="DIR", help="instead: the default `tokencredit train` into DIR, timed"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--profile-rows", type=int, default=15)
    args = p.parse_args()
    if args.train_run:
        train_run(args.train_run, args.seed)  # the trainer sets its own threads (1 for the toy)
    else:
        update_vs_floor(args)


if __name__ == "__main__":
    main()

"""Why the PPO critic's explained variance stays low on the toy task: learning curve, ceiling, linear probe.

With the policy held at its warm start, `--batches` steps of rollouts are sampled once, as the trainer
samples them (`Trainer.sample`, `Trainer.old_policy_batch`; `--recipe ppo`, seed `--seed`, 8 prompts x 8
rollouts on the embedded toy task). The first `--train` batches train a critic, the rest are held out.
With gamma = lam = 1 every token's target is its rollout's reward r. Three measurements:

    fit      the trainer's own critic (`tokencredit.train.critic.Critic`: the warm start + a zero head,
             AdamW, verl's clipped value loss, `--epochs` x `critic.mini_batches` steps per batch) updated
             once per training batch, in order, for `--passes` passes. Its explained variance (EV) on
             each batch before training on it ("online", what the trainer logs as
             critic/explained_variance), mean ± se per block of `--block` updates; after each block, its
             EV on the held-out batches pooled (`tokencredit.critic.explained_variance` over all their
             tokens) and per held-out batch (mean ± se).
    ceiling  the oracle's Monte-Carlo values V^(s_t) (`tokencredit.oracle.ModelSampler`, K = `--k`
             continuations of the state with the policy's sampling settings, scored by the trainer's
             reward; `mc_value`) at `--positions` positions drawn uniformly over the valid tokens of the
             last `--ceiling-batches` held-out batches, against the same returns: EV of V^, and EV of V
             with the K-sample noise removed (mean V^(1 - V^)/(K - 1) added back to the numerator),
             its se a bootstrap over rollouts; and the noise-corrected EV by response position.
    probe    ridge regression of r on the critic's head input (the warm start's final hidden state at
             each valid token, backbone frozen) over the training batches, EV on the held-out batches:
             what a head alone could reach.

The figures of docs/experiments/critic.md ("Why the toy critic's explained variance stays near 0") came
from scratch runs whose settings the defaults reproduce (seed 0):

    python benchmarks/critic_explained_variance.py                       # fit at critic lr 1e-3, ceiling, probe
    python benchmarks/critic_explained_variance.py --parts fit --critic-lr 3e-3
    python benchmarks/critic_explained_variance.py --parts fit --passes 2

Costs on one CPU thread of the shared 2-core machine: start-up about 20 s, sampling about 2 s a batch,
the fit 7-16 s an update (with the held-out evaluations), the ceiling 2-3 minutes per 300 positions at
K = 16: the default run about 15-25 minutes. The JSON (`--out`) holds every per-batch number and every
ceiling position's K rewards.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from _common import load_average
from rich.console import Console
from torch import Tensor

from tokencredit.batch import RolloutBatch
from tokencredit.critic import ValueModel, explained_variance
from tokencredit.oracle import ModelSampler, mc_value
from tokencredit.train.config import load_config
from tokencredit.train.critic import Critic
from tokencredit.train.sampling import StepRollouts
from tokencredit.train.trainer import Trainer

PARTS = ("fit", "ceiling", "probe")


@dataclass
class Held:
    """One step's rollouts sampled by the held policy, with the trainer's batch (mask [N,T], scores [N])."""

    rollouts: StepRollouts
    batch: RolloutBatch
    sequences: Tensor  # [N, P+T]
    attention_mask: Tensor
    prompt_len: int

    def returns(self) -> Tensor:
        """R [N,T] float32: the rollout's reward r on every valid token (gamma = lam = 1), 0 elsewhere."""
        return torch.where(self.batch.mask, self.batch.scores.float()[:, None], torch.zeros(()))


def sample_batches(trainer: Trainer, n: int, log: Any) -> list[Held]:
    """Steps 0..n-1 of the trainer's rollouts, the policy never updated (so each step's sample is the
    one a run with the policy held would draw: same prompts, same sampling seed)."""
    out = []
    for step in range(n):
        ro = trainer.sample(step)
        batch = trainer.old_policy_batch(ro)
        out.append(Held(ro, batch, ro.sequences, ro.attention_mask, int(ro.prompt_ids.shape[1])))
        log(f"batch {step + 1}/{n} sampled, mean reward {float(batch.scores.mean()):.3f}")
    return out


def values(critic: Critic, h: Held) -> Tensor:
    return critic.values(h.sequences, h.attention_mask, h.prompt_len, h.batch.mask)


def heldout_ev(critic: Critic, test: list[Held]) -> dict[str, Any]:
    """The critic's EV on the held-out batches: pooled over all their tokens, and per batch."""
    vs = [values(critic, h) for h in test]
    per = [explained_variance(v, h.returns(), h.batch.mask) for v, h in zip(vs, test)]
    pooled = explained_variance(
        torch.cat([v.reshape(-1) for v in vs]),
        torch.cat([h.returns().reshape(-1) for h in test]),
        torch.cat([h.batch.mask.reshape(-1) for h in test]),
    )
    return {"pooled": pooled, "per_batch": per, **mean_se(per)}


def mean_se(x: list[float]) -> dict[str, float]:
    """mean and standard error (sample SD / sqrt n; 0 for one value) of x."""
    t = torch.tensor(x, dtype=torch.float64)
    se = float(t.std()) / math.sqrt(len(x)) if len(x) > 1 else 0.0
    return {"mean": float(t.mean()), "se": se}


# ---------------------------------------------------------------------------- fit
def fit(
    critic: Critic, train: list[Held], test: list[Held], args: argparse.Namespace, log: Any
) -> dict[str, Any]:
    """Train the critic on `train` in order, `args.passes` times, through `Critic.update` (the trainer's
    update); online EV per update, held-out EV after every `args.block` updates and at the end."""
    online: list[float] = []
    losses: list[float] = []
    blocks: list[dict[str, Any]] = []
    start = heldout_ev(critic, test)
    log(f"held-out EV before training: pooled {start['pooled']:.3f}")
    total = args.passes * len(train)
    t0 = time.perf_counter()
    for k in range(total):
        h = train[k % len(train)]
        batch = replace(h.batch, values=values(critic, h))  # V_old, as Trainer.step fills it
        m = critic.update(batch, h.sequences, h.attention_mask, h.prompt_len, step=k)
        online.append(m["critic/explained_variance"])
        losses.append(m["critic/value_loss"])
        if (k + 1) % args.block == 0 or k + 1 == total:
            lo = blocks[-1]["hi"] + 1 if blocks else 1
            ev = heldout_ev(critic, test)
            blocks.append({"lo": lo, "hi": k + 1, "online": mean_se(online[lo - 1 :]), "heldout": ev})
            log(
                f"update {k + 1}/{total}: online EV {online[-1]:.3f}, loss {losses[-1]:.4f}, held-out EV "
                f"pooled {ev['pooled']:.3f} ({time.perf_counter() - t0:.0f} s)"
            )
    return {"start": start, "online": online, "value_loss": losses, "blocks": blocks}


# ---------------------------------------------------------------------------- ceiling
def ceiling(
    trainer: Trainer, batches: list[tuple[int, Held]], args: argparse.Namespace, log: Any
) -> dict[str, Any]:
    """EV of the oracle's Monte-Carlo values V^(s_t) against the returns at random valid positions."""
    cfg = trainer.cfg.rollout
    gen = torch.Generator().manual_seed(args.seed)
    per_batch = args.positions // len(batches)
    records = []
    for index, h in batches:
        sampler = ModelSampler(
            trainer.model,
            trainer.tokenizer,
            h.rollouts,
            [p.answer for p in h.rollouts.problems],
            trainer.reward_fn,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_new_tokens=cfg.max_new_tokens,
            batch_size=64,
        )
        mask = h.batch.mask.cpu().bool()
        rows, cols = mask.nonzero(as_tuple=True)
        pick = torch.randperm(rows.numel(), generator=gen)[:per_batch]
        rows, cols = rows[pick], cols[pick]
        t0 = time.perf_counter()
        rewards = sampler(rows, cols, args.k, seed=1000 * args.seed + index).rewards
        log(
            f"ceiling: batch {index + 1}, {rows.numel()} positions x K = {args.k} ({time.perf_counter() - t0:.0f} s)"
        )
        for i in range(rows.numel()):
            r = int(rows[i])
            records.append(
                {
                    "batch": index + 1,
                    "row": r,
                    "t": int(cols[i]),
                    "length": int(mask[r].sum()),
                    "R": float(h.batch.scores[r]),
                    "rewards": rewards[i].tolist(),
                }
            )
    return ceiling_stats(records, args.k, args.position_bins, args.bootstrap, args.seed)


def ceiling_stats(
    records: list[dict[str, Any]], k: int, bins: list[int], bootstrap: int, seed: int
) -> dict[str, Any]:
    """EV of V^ (the mean of each record's K rewards) against R, and of V with the K-sample noise removed:
    Var(R - V^) = Var(R - V) + E[V(1 - V)]/K, whose last term V^(1 - V^)/(K - 1) estimates without bias."""
    R = torch.tensor([x["R"] for x in records], dtype=torch.float64)
    V, _ = mc_value(torch.tensor([x["rewards"] for x in records], dtype=torch.float64))
    noise = V * (1 - V) / (k - 1)
    rollout = torch.unique(
        torch.tensor([[x["batch"], x["row"]] for x in records]), dim=0, return_inverse=True
    )[1]

    def ev(idx: Tensor) -> tuple[float, float]:
        """(EV of V^, noise-corrected EV of V) on the positions idx."""
        raw = explained_variance(V[idx], R[idx], torch.ones(idx.numel(), dtype=torch.bool))
        return raw, raw + float(noise[idx].mean() / (torch.var(R[idx]) + 1e-5))

    raw, corrected = ev(torch.arange(R.numel()))
    # bootstrap over rollouts: the positions of one rollout share its return
    members = [(rollout == c).nonzero().squeeze(1) for c in range(int(rollout.max()) + 1)]
    gen = torch.Generator().manual_seed(seed)
    draws = []
    for _ in range(bootstrap):
        pick = torch.randint(len(members), (len(members),), generator=gen)
        draws.append(ev(torch.cat([members[int(c)] for c in pick])))
    boot = torch.tensor(draws, dtype=torch.float64).reshape(-1, 2)
    t = torch.tensor([x["t"] for x in records])
    edges = [0, *bins, math.inf]
    by_position = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        idx = ((t >= lo) & (t < hi)).nonzero().squeeze(1)
        if idx.numel() > 1:
            by_position.append({"lo": lo, "hi": hi, "positions": idx.numel(), "ev_corrected": ev(idx)[1]})
    return {
        "positions": R.numel(),
        "rollouts": len(members),
        "var_R": float(torch.var(R)),
        "ev_raw": raw,
        "ev_corrected": corrected,
        "se_raw": float(boot[:, 0].std()) if bootstrap > 1 else math.nan,
        "se_corrected": float(boot[:, 1].std()) if bootstrap > 1 else math.nan,
        "by_position": by_position,
        "records": records,
    }


# ---------------------------------------------------------------------------- probe
@torch.no_grad()
def head_inputs(model: ValueModel, h: Held) -> tuple[Tensor, Tensor]:
    """(X [tokens, H] float64: the head's input at each valid token, y [tokens]: the rollout's reward)."""
    seen: list[Tensor] = []
    hook = model.head.register_forward_hook(lambda _mod, inp, _out: seen.append(inp[0].detach()))
    try:
        model.eval()(h.sequences, h.attention_mask, h.prompt_len, h.batch.mask)
    finally:
        hook.remove()
    hidden = seen[0]  # [N, t_keep, H]: ValueModel runs the columns up to the last valid token only
    m = h.batch.mask[:, : hidden.shape[1]]
    return hidden[m].double(), h.returns()[:, : hidden.shape[1]][m].double()


def probe(
    model: ValueModel, train: list[Held], test: list[Held], ridges: list[float], log: Any
) -> list[dict[str, Any]]:
    """Ridge regression (with an intercept) of r on the frozen head input; EV on train and held-out tokens."""
    xs, ys = zip(*(head_inputs(model, h) for h in train))
    xt, yt = zip(*(head_inputs(model, h) for h in test))
    X, y, Xt, Yt = torch.cat(xs), torch.cat(ys), torch.cat(xt), torch.cat(yt)
    X = torch.cat([X, torch.ones(len(X), 1, dtype=X.dtype)], 1)
    Xt = torch.cat([Xt, torch.ones(len(Xt), 1, dtype=Xt.dtype)], 1)
    log(f"probe: {len(y)} training tokens, {len(Yt)} held-out tokens, {X.shape[1] - 1} features")
    gram, xy = X.T @ X, X.T @ y
    out = []
    for lam in ridges:
        w = torch.linalg.solve(gram + lam * torch.eye(len(gram), dtype=gram.dtype), xy)
        ones, ones_t = torch.ones(len(y), dtype=torch.bool), torch.ones(len(Yt), dtype=torch.bool)
        out.append(
            {
                "ridge": lam,
                "tokens_train": len(y),
                "tokens_heldout": len(Yt),
                "ev_train": explained_variance(X @ w, y, ones),
                "ev_heldout": explained_variance(Xt @ w, Yt, ones_t),
            }
        )
    return out


# ---------------------------------------------------------------------------- report
def report(args: argparse.Namespace, n_test: int, res: dict[str, Any]) -> list[str]:
    first_test = args.train + 1
    held = f"held-out batches {first_test}-{args.batches} ({n_test} rollouts)"
    lines = [
        f"# critic explained variance, policy held: --recipe {args.recipe} --batches {args.batches} "
        f"--train {args.train} --critic-lr {args.critic_lr:g} --epochs {args.epochs} --passes {args.passes} "
        f"--k {args.k} --positions {args.positions} --seed {args.seed}",
    ]
    ceil = res.get("ceiling")
    ceil_cell = f"{ceil['ev_corrected']:.3f} ± {ceil['se_corrected']:.3f}" if ceil else ""
    if "fit" in res:
        f = res["fit"]
        blocks = f["blocks"]
        unit = "batches" if args.passes == 1 else "updates"
        head = [f"critic lr {args.critic_lr:g}, {args.epochs} epochs, policy held"]
        head += [f"{unit} {b['lo']}-{b['hi']}" for b in blocks] + ["ceiling (oracle V)"]
        rows = [
            ["online (next batch, before training on it), mean ± se"]
            + [f"{b['online']['mean']:.3f} ± {b['online']['se']:.3f}" for b in blocks]
            + [ceil_cell],
            [f"{held}, pooled, after the block"] + [f"{b['heldout']['pooled']:.3f}" for b in blocks] + [""],
            [f"{held}, per batch, mean ± se"]
            + [f"{b['heldout']['mean']:.3f} ± {b['heldout']['se']:.3f}" for b in blocks]
            + [""],
        ]
        lines += [
            "",
            f"held-out EV before training: pooled {f['start']['pooled']:.3f}",
            "| " + " | ".join(head) + " |",
            "|---" + "|---:" * (len(head) - 1) + "|",
        ]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    if ceil:
        lines += [
            "",
            f"ceiling: {ceil['positions']} positions of {ceil['rollouts']} rollouts (held-out batches "
            f"{', '.join(str(b) for b in sorted({x['batch'] for x in ceil['records']}))}), K = {args.k}, "
            f"Var(R) {ceil['var_R']:.4f}",
            f"  EV(V^) {ceil['ev_raw']:.3f} ± {ceil['se_raw']:.3f}; EV(V), K-sample noise removed, "
            f"{ceil['ev_corrected']:.3f} ± {ceil['se_corrected']:.3f} (se: bootstrap over rollouts, {args.bootstrap} draws)",
            "  by response position (noise-corrected): "
            + ", ".join(
                f"tokens {b['lo']}-{'' if math.isinf(b['hi']) else int(b['hi']) - 1} {b['ev_corrected']:.2f} "
                f"({b['positions']})"
                for b in ceil["by_position"]
            ),
        ]
    if "probe" in res:
        p = res["probe"]
        lines += [
            "",
            f"probe: ridge regression of r on the frozen head input, {p[0]['tokens_train']} training tokens "
            f"(batches 1-{args.train}), {p[0]['tokens_heldout']} held-out tokens",
        ]
        lines += [
            f"  ridge {x['ridge']:g}: EV train {x['ev_train']:.3f}, held-out {x['ev_heldout']:.3f}" for x in p
        ]
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default=",".join(PARTS), help=f"which measurements, of {','.join(PARTS)}")
    p.add_argument("--recipe", default="ppo", help="a recipe with a learned critic (ppo, bpco)")
    p.add_argument("--config", help="a shipped config or TOML file (default: the embedded toy task)")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)"
    )
    p.add_argument("--batches", type=int, default=60, help="steps of rollouts sampled with the policy held")
    p.add_argument(
        "--train", type=int, default=50, help="the first TRAIN batches train; the rest are held out"
    )
    p.add_argument("--critic-lr", type=float, default=1e-3)
    p.add_argument("--epochs", type=int, default=4, help="critic epochs per batch")
    p.add_argument("--passes", type=int, default=1, help="passes over the training batches")
    p.add_argument("--block", type=int, default=10, help="updates per block of the learning curve")
    p.add_argument("--k", type=int, default=16, help="continuations per state for the ceiling's V^ (>= 2)")
    p.add_argument("--positions", type=int, default=600, help="ceiling positions, split over its batches")
    p.add_argument("--ceiling-batches", type=int, default=2, help="the last N held-out batches")
    p.add_argument("--position-bins", default="12,24,36", help="bin edges of the ceiling by position")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap draws for the ceiling's se")
    p.add_argument("--ridge", default="1e-3,0.1,10", help="the probe's ridge penalties")
    p.add_argument("--seed", type=int, default=0, help="run.seed (rollouts) and the ceiling's draws")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="/tmp/critic_ev/result.json")
    args = p.parse_args()
    parts = args.parts.split(",")
    if unknown := sorted(set(parts) - set(PARTS)):
        p.error(f"--parts: unknown {', '.join(unknown)} (choose from {', '.join(PARTS)})")
    if not 0 < args.train < args.batches:
        p.error(f"--train must be in [1, --batches - 1], got {args.train} with --batches {args.batches}")
    held_out = args.batches - args.train
    if "ceiling" in parts and not (
        args.k >= 2 and 1 <= args.ceiling_batches <= min(held_out, args.positions)
    ):
        p.error(
            f"the ceiling needs --k >= 2 and 1 <= --ceiling-batches <= min(held-out batches, --positions): got "
            f"--k {args.k}, --ceiling-batches {args.ceiling_batches}, {held_out} held-out, --positions {args.positions}"
        )
    args.position_bins = [int(x) for x in args.position_bins.split(",")]
    ridges = [float(x) for x in args.ridge.split(",")]
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    sets = [
        f"run.seed={args.seed}", f"run.threads={args.threads}", f"run.steps={args.batches}",
        "run.progress=false", "checkpoint.every=0", "eval.every=0", "eval.at_start=false", "data.eval_size=4",
        f"critic.lr={args.critic_lr}", f"critic.epochs={args.epochs}", *args.set,
    ]  # fmt: skip
    cfg = load_config(args.config, sets=sets, recipe=args.recipe)
    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="critic_ev_") as work:
        trainer = Trainer(cfg, Path(work) / "run", console=Console(quiet=True))
        try:
            if trainer.critic is None:
                p.error(f"--recipe {args.recipe}: the recipe has no learned critic")
            data = sample_batches(trainer, args.batches, log)
            train, test = data[: args.train], data[args.train :]
            if "probe" in parts:  # the critic is still the warm start + zero head here: its frozen features
                res["probe"] = probe(trainer.critic.model, train, test, ridges, log)
            if "fit" in parts:
                res["fit"] = fit(trainer.critic, train, test, args, log)
            if "ceiling" in parts:
                last = range(args.batches - args.ceiling_batches, args.batches)
                res["ceiling"] = ceiling(trainer, [(i, data[i]) for i in last], args, log)
        finally:
            trainer.reward_fn.close()
            trainer.lock.release()
    wall = time.perf_counter() - t0
    lines = report(args, sum(h.batch.num_rollouts for h in test), res)
    lines.append(f"\nwall {wall:.0f} s, {args.threads} thread(s), load {load_average()}")
    print("\n".join(lines))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "wall_s": wall, **res}, indent=1))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

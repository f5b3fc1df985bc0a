"""Monte-Carlo token advantages (`tokencredit.oracle`): cost, and the |A*| mass the delta skip loses.

Setting: one batch of the toy warm start at the trainer's default rollout settings (16 prompts x 8
samples of the train split, qwen-math template, temperature 1, top_p 1, 80 new tokens), the
trainer's default reward (math-verify), K continuations per state, 1 CPU thread.

What the delta rule loses. A position whose token had probability p >= 1 - delta gets A* = 0, and
|A*_t| <= 1 - p there exactly (rewards in [0, 1]; `tokencredit.oracle`), so the skipped mass is at
most B = sum of (1 - p) over the skipped positions: no sampling needed. It is set against a lower
bound of the batch's true |A*| mass: the A*_t of a rollout sum to R - V(prompt), so
sum_t |A*_t| >= |R - V(prompt)|, with V(prompt) sampled once per prompt (K continuations). The
printed "lost share <= B / sum_i |R_i - V(prompt_i)|" is therefore an upper bound on the share of
|A*| mass lost against delta = 0 (up to the Monte-Carlo error of V(prompt)); the same is printed for
larger deltas. The estimated mass on the kept positions (sum |A^*|, which includes Monte-Carlo noise)
is shown beside it.

`--full-rows R` also estimates the first R rollouts at delta = 0 (every position sampled) and
reports the |A^*| mass it finds on the positions the default delta skips, next to the mass that
Monte-Carlo noise alone would put there (sum of sqrt(2 / pi) se: the mean |N(0, se^2)|): at
delta = 0 a near-certain token's A* is the difference of two independent estimates of nearly the
same value, so that mass is noise unless it exceeds the noise floor.

    python benchmarks/bench_oracle.py                       # K = 16, delta = 1e-3 (the defaults)
    python benchmarks/bench_oracle.py --full-rows 16        # + the direct delta = 0 comparison
    python benchmarks/bench_oracle.py --model toy-hard --max-new-tokens 128 --vine
"""

from __future__ import annotations

import argparse
import math
import os
import time

# Before torch loads: libgomp reads this once (see benchmarks/bench_credit.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from _common import load_average

from tokencredit import models, oracle
from tokencredit.data.templates import render
from tokencredit.rewards import Reward
from tokencredit.rollout import generate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="toy", help="toy or toy-hard")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=80)
    ap.add_argument("--k", type=int, default=oracle.DEFAULT_K)
    ap.add_argument("--delta", type=float, default=oracle.DEFAULT_DELTA)
    ap.add_argument("--batch-size", type=int, default=64, help="sequences per generate call")
    ap.add_argument("--full-rows", type=int, default=0, help="rollouts also estimated at delta = 0")
    ap.add_argument("--vine", action="store_true", help="also VinePPO's step values (K = 9) on the batch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    model, tok = models.load_model(args.model)
    problems = models.toy_task(seed=args.seed, name=args.model).sample(args.prompts, "train")
    prompts = [render("qwen-math", p.problem, tok) for p in problems]
    t0 = time.perf_counter()
    ro = generate(
        model,
        tok,
        prompts,
        args.group_size,
        temperature=1.0,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
    )
    t_gen = time.perf_counter() - t0
    golds = [problems[int(i)].answer for i in ro.prompt_index]
    reward = Reward("math")
    try:
        kw = {"temperature": 1.0, "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size}
        lp = oracle.policy_log_probs(model, ro, temperature=1.0, batch_size=args.batch_size)
        out = oracle.oracle_credit(
            model, tok, ro, golds, reward, k=args.k, delta=args.delta, seed=args.seed, old_log_probs=lp, **kw
        )
        sampler = oracle.ModelSampler(model, tok, ro, golds, reward, **kw)
        n = ro.num_rollouts
        v0 = oracle.mc_value(
            sampler(torch.arange(n), torch.zeros(n, dtype=torch.long), args.k, args.seed + 1).rewards
        )[0]
        vine = None
        if args.vine:
            vine = oracle.vine_credit(model, tok, ro, golds, reward, k=oracle.VINE_K, seed=args.seed, **kw)
        full = None
        if args.full_rows:
            rows = torch.arange(min(args.full_rows, n))
            sub = _Rows(ro, rows)
            full = oracle.oracle_credit(
                model,
                tok,
                sub,
                [golds[i] for i in rows],
                reward,
                k=args.k,
                delta=0.0,
                seed=args.seed,
                old_log_probs=lp[rows],
                **kw,
            )
    finally:
        reward.close()

    mask = out.mask
    p = lp.double().exp()
    c = out.cost
    lower = float((out.rewards.double() - v0).abs().sum())
    kept_mass = float(out.advantages.double().abs().sum())
    print(
        f"# oracle on {args.model}: {args.prompts} prompts x {args.group_size} samples, K = {args.k}, "
        f"delta = {args.delta:g}, {args.threads} thread(s), load {load_average()}"
    )
    print(
        f"rollouts: {n}, {int(mask.sum())} tokens ({float(mask.sum(1).double().mean()):.1f} per rollout), "
        f"accuracy {float((out.rewards > 0).double().mean()):.3f}; generation {t_gen:.1f}s"
    )
    print(f"cost: {c.summary()}")
    print(
        f"  per rollout: {c.states / n:.2f} states, {c.generated_tokens / n:.0f} generated tokens; "
        f"{c.generated_tokens / max(c.seconds, 1e-9):.0f} generated tokens/s"
    )
    print(
        f"|A*| mass: lower bound sum_i |R_i - V(prompt_i)| = {lower:.2f}; estimated on kept positions "
        f"sum |A^*| = {kept_mass:.2f}; significant (|A*| > 2 se) positions: {int(out.significant().sum())}"
    )
    print(
        "| delta | positions skipped | states needed | bound B on skipped mass | B / lower bound | B / (B + est. kept mass) |"
    )
    print("|---|---|---|---|---|---|")
    for d in sorted({0.0, args.delta, 1e-3, 5e-3, 1e-2, 2e-2, 5e-2}):
        skip = oracle.skip_positions(lp, mask, d)
        b = float((1 - p)[skip].sum())
        states = int(oracle.value_states(mask, skip).sum())
        # estimated mass on the positions kept at d (from the default run: those it kept, plus bounds it skipped)
        kept_d = float(out.advantages.double().abs()[~skip].sum())
        mark = " (run)" if d == args.delta else ""
        print(
            f"| {d:g}{mark} | {float(skip.sum()) / float(mask.sum()):.1%} | {states} | {b:.3f} | "
            f"{b / lower:.2%} | {b / (b + kept_d):.2%} |"
        )
    if vine is not None:
        steps = float((vine.steps.max(1).values + 1).double().mean())
        print(
            f"VinePPO step values (K = {oracle.VINE_K}, {steps:.1f} steps per rollout): {vine.cost.summary()}"
        )
    if full is not None:
        r = len(full.rewards)
        skip_def = oracle.skip_positions(lp[:r], mask[:r], args.delta)
        a = full.advantages.double().abs()
        on_skip = float(a[skip_def].sum())
        noise = float((full.stderr.double()[skip_def] * math.sqrt(2 / math.pi)).sum())
        print(f"delta = 0 on the first {r} rollouts: {full.cost.summary()}")
        print(
            f"  |A^*| mass on the positions delta = {args.delta:g} skips: {on_skip:.2f} of {float(a.sum()):.2f} "
            f"({on_skip / float(a.sum()):.1%}); noise floor there (sum sqrt(2/pi) se): {noise:.2f}; "
            f"bound there: {float((1 - p[:r])[skip_def].sum()):.3f}"
        )
        same = mask[:r] & ~skip_def
        print(
            f"  on the kept positions: delta = 0 sum |A^*| {float(a[same].sum()):.2f} vs default run "
            f"{float(out.advantages[:r].double().abs()[same].sum()):.2f}"
        )


class _Rows:
    """The rollouts `rows` of a batch (prompt / response tensors only)."""

    def __init__(self, ro, rows):
        self.prompt_ids, self.prompt_mask = ro.prompt_ids[rows], ro.prompt_mask[rows]
        self.response_ids, self.response_mask = ro.response_ids[rows], ro.response_mask[rows]


if __name__ == "__main__":
    main()

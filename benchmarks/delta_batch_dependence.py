"""Does DelTA's credit of fixed rollouts depend on the rest of the batch? (probe machinery, any probe model)

DelTA's coefficients come from the centroids mu+ / mu- of the whole batch's positive and negative
token-gradient proxies v = (1 - p) h (docs/spec/delta.md). Within a response, Â = A c~ ranks the
tokens exactly as the projection s_t h_t . d does, d = mu+ - mu- after the refinement (ascending: the
most negative Â is the smallest projection, on either side; the script checks it and prints the per-row
Spearman), so the same rollout's ranking - and its blame@1 - can change when the *other* groups of the
batch change d.

What it does: samples a probe batch (`--groups` x `--group-size`, `--seed`, the probe's sampling and
signals), estimates the Monte-Carlo A* of its mixed groups' rows (`run_oracle`, K = `--oracle`), then,
for each of `--target-sets` random shares T of the mixed groups (`--target-frac`, default half), computes the credit of T's rows with
the probe's own pipeline (`method_credits`) on several batch compositions:

    full      the whole probe batch;
    resample  `--resamples` batches: T plus each other group kept with probability `--keep`
              (with `--other-seed S`: the other groups are drawn from a second batch sampled with seed S,
              so T's rows sit among groups of other problems, as in another probe seed's batch);
    alone     T's groups only.

Printed, on T's rows: blame@1 against A* (`blame_hits`, targets `oracle_targets`: rows whose most negative A*
is significant) and the mean per-response Spearman of Â with A*, for DelTA and the controls (surprisal:
batch-independent; KTAE: depends on the group only); for every method, the mean per-response Spearman of
its Â with its Â on the full batch and with its Â on T alone (1 = the within-response ranking did not
move; -1 = reversed); the share of responses whose ranking reversed (Spearman < -0.5); DelTA's direction d
compared by cosine with the full batch's and with T-alone's; and the cosine of the directions computed on
two disjoint halves of the mixed groups (T and the others), the noise test: d is a property of the task when
halves agree (cos ~ 1), noise when they do not. Numbers are mean ± SE over the resamples (SD beside it, the
spread of one batch draw), one block per target set. The JSON (`--out`) holds every resample.

    python benchmarks/delta_batch_dependence.py                       # toy warm start, 32 x 8, K = 16
    python benchmarks/delta_batch_dependence.py --other-seed 1        # T among another seed's groups
    # the probe's own batch of `tokencredit probe --model toy --groups 16 --seed 1 --oracle 16 --batch-size 256`,
    # all its mixed groups as T, among half of seed 0's groups
    python benchmarks/delta_batch_dependence.py --groups 16 --batch-size 256 --seed 1 --other-seed 0 \
        --target-frac 1 --target-sets 1
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from contextlib import nullcontext
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tokencredit.batch import RolloutBatch
from tokencredit.builder import Passes, build_batch, forward_signals, needs_of, rendered_negative_prompts
from tokencredit.columns import resolve_methods
from tokencredit.credit.delta import discriminate
from tokencredit.models import special_token_ids
from tokencredit.oracle import spearman
from tokencredit.probe import blame_hits, probe_config, resolve_points, run_oracle
from tokencredit.probe.pipeline import REWARD_NAMES
from tokencredit.probe.sample import probe_problems, sample_rollouts, scored
from tokencredit.probe.score import method_credits
from tokencredit.probe.truth import build_truth, checker_reward, mixed_rows
from tokencredit.rewards import Reward, check_rewards

FLIP = -0.5
"""A response counts as reversed when the Spearman of its Â with the reference Â is below this."""


# ---------------------------------------------------------------------------- the probe batch
def sample_batch(
    model: Any, tok: Any, cfg: Any, specs: Any, log: Any
) -> tuple[Any, RolloutBatch, list[Any], Tensor]:
    """(rollouts, batch with the methods' signals, each row's gold for the reward, scores [N]) as the probe samples."""
    problems = probe_problems(cfg)
    log(f"sampling {len(problems)} x {cfg.group_size} (seed {cfg.seed}) ...")
    ro = sample_rollouts(model, tok, problems, cfg)
    rows = [problems[int(i)] for i in ro.prompt_index]
    if cfg.synthetic:
        truth, _ = build_truth(rows, ro.response_ids, ro.response_mask, ro.prompt_index, tok)
        scores, golds = truth.correct.float(), list(rows)
    else:
        golds = [p.answer for p in rows]
        with Reward("auto") as reward:
            scores = torch.tensor(check_rewards(reward(ro.texts, golds), len(rows), REWARD_NAMES[False]))
    needs = needs_of([s.recipe for s in specs], lora=False)
    passes = Passes(
        temperature=cfg.sampling.temperature,
        batch_size=cfg.sampling.batch_size,
        tokenizer=tok,
        negative_prompts=rendered_negative_prompts([p.problem for p in rows], cfg.template, tok),
    )
    rollouts = scored(ro, scores.float())
    signals = forward_signals(model, rollouts, needs.forward, passes, who="probe")
    batch = build_batch(rollouts, needs, given=signals, device="cpu", who="probe")
    return ro, batch, golds, scores.float()


def concat(a: RolloutBatch, b: RolloutBatch) -> RolloutBatch:
    """The rows of a then b, right-padded to the wider response width; b's group ids shifted past a's."""
    t = max(a.max_len, b.max_len)
    kw: dict[str, Any] = {}
    for f in fields(RolloutBatch):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if x is None or y is None or not isinstance(x, Tensor):
            kw[f.name] = None
            continue
        if f.name == "group_ids":
            y = y + int(x.max()) + 1
        if x.dim() >= 2:
            x, y = (torch.nn.functional.pad(z, (0, 0) * (z.dim() - 2) + (0, t - z.shape[1])) for z in (x, y))
        kw[f.name] = torch.cat([x, y])
    return RolloutBatch(**kw)


# ---------------------------------------------------------------------------- credit on a composition
def direction(batch: RolloutBatch, seq_adv: Tensor, params: dict[str, Any]) -> tuple[Tensor, Tensor]:
    """(d = mu+ - mu- of the final refinement [H], c~ [N,T]) of DelTA on `batch` with advantages A [N]."""
    scale = (-torch.expm1(batch.old_log_probs.float())).clamp(0.0, 1.0)
    terms = discriminate(batch.hidden, scale, seq_adv, batch.mask, **params)
    mu_pos, mu_neg = terms.centroids[-1]
    return mu_pos - mu_neg, terms.coefficients


def credit_of(
    batch: RolloutBatch,
    groups: Tensor,
    rows: Tensor,
    specs: Any,
    special_ids: Any,
    delta_params: dict[str, Any],
) -> tuple[dict[str, Tensor], Tensor]:
    """({method: effective Â of `rows` [R,T]}, DelTA's d) on the sub-batch of the groups `groups`.

    `rows` (indices into `batch`) must lie in `groups`; the Â columns are `batch`'s width.
    """
    keep = torch.isin(batch.group_ids, groups).nonzero().squeeze(1)
    sub = batch.select(keep)
    pos = torch.full((batch.num_rollouts,), -1, dtype=torch.long)
    pos[keep] = torch.arange(keep.numel())
    at = pos[rows]
    assert bool((at >= 0).all()), "target rows outside the composition"
    got = method_credits(sub, specs, special_ids=special_ids)
    out: dict[str, Tensor] = {}
    d = None
    for name, g in got.items():
        if g.credit is None:
            raise RuntimeError(f"{name}: no credit on the sub-batch ({g.reason})")
        out[name] = g.credit.effective().float()[at]
        if name == "delta":
            d, coef = direction(sub, g.credit.seq_advantages, delta_params)
            want = g.credit.seq_advantages.float()[:, None] * coef
            err = float((want - g.credit.token_advantages.float()).abs().where(sub.mask, 0.0).max())
            assert err < 1e-4, f"DelTA recomputation differs from the pipeline's by {err}"
    assert d is not None
    return out, d


# ---------------------------------------------------------------------------- statistics
def row_spearmans(x: Tensor, y: Tensor, mask: Tensor) -> Tensor:
    """[R] float64 per-row Spearman of x and y over the valid tokens (NaN where undefined)."""
    out = []
    for i in range(x.shape[0]):
        m = mask[i]
        r = spearman(x[i][m], y[i][m]) if int(m.sum()) >= 3 else None
        out.append(math.nan if r is None else r)
    return torch.tensor(out, dtype=torch.float64)


def nanmean(x: Tensor) -> float:
    x = x[~torch.isnan(x)]
    return float(x.mean()) if x.numel() else math.nan


def cosine(a: Tensor, b: Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=0))


def summary(values: list[float]) -> dict[str, float]:
    """mean, SE (SD / sqrt n), SD, min, max of finite values."""
    v = torch.tensor([x for x in values if math.isfinite(x)], dtype=torch.float64)
    if not v.numel():
        return {"n": 0}
    sd = float(v.std()) if v.numel() > 1 else 0.0
    return {
        "n": int(v.numel()),
        "mean": float(v.mean()),
        "se": sd / math.sqrt(v.numel()),
        "sd": sd,
        "min": float(v.min()),
        "max": float(v.max()),
    }


def fmt(s: dict[str, float], pct: bool = False) -> str:
    if not s.get("n"):
        return "n/a"
    k = 100.0 if pct else 1.0
    unit = "%" if pct else ""
    return (
        f"{k * s['mean']:7.3f}{unit} ± {k * s['se']:.3f} (sd {k * s['sd']:.3f}, "
        f"range {k * s['min']:.3f}..{k * s['max']:.3f})"
    )


# ---------------------------------------------------------------------------- one composition's numbers
class Scorer:
    """The numbers of one composition's credit on T's rows, against A* and the reference compositions."""

    def __init__(self, oracle: Any, rows: Tensor, mask: Tensor) -> None:
        self.mask = mask
        sel = torch.isin(oracle.rows, rows)
        order = {int(r): j for j, r in enumerate(oracle.rows.tolist())}
        self.oidx = torch.tensor([order[int(r)] for r in rows.tolist()])
        self.targets = oracle.targets[self.oidx]
        self.astar = oracle.credit.advantages.float()[self.oidx]
        self.has = self.targets >= 0
        assert int(sel.sum()) == rows.numel()

    def score(self, c: Tensor, refs: dict[str, Tensor]) -> dict[str, float]:
        m = self.mask
        out = {
            "blame@1": float(blame_hits(c[self.has], m[self.has], self.targets[self.has], 1).mean()),
            "rho_astar": nanmean(row_spearmans(c, self.astar, m)),
        }
        low = c.masked_fill(~m, math.inf).argmin(1)
        for name, ref in refs.items():
            out[f"top1_{name}"] = float((low == ref.masked_fill(~m, math.inf).argmin(1)).double().mean())
            r = row_spearmans(c, ref, m)
            out[f"rho_{name}"] = nanmean(r)
            fin = r[~torch.isnan(r)]
            out[f"reversed_{name}"] = float((fin < FLIP).double().mean()) if fin.numel() else math.nan
        return out


def run_target_set(
    batch: RolloutBatch,
    oracle: Any,
    mixed_groups: Tensor,
    pool_batch: RolloutBatch | None,
    specs: Any,
    special_ids: Any,
    delta_params: dict[str, Any],
    args: argparse.Namespace,
    gen: torch.Generator,
) -> dict[str, Any]:
    """One target set: T = a random share of the mixed groups; the full / resample / alone compositions.

    The other groups of a resample come from `batch` (its groups outside T) or, given, from `pool_batch`.
    """
    perm = mixed_groups[torch.randperm(mixed_groups.numel(), generator=gen)]
    n_t = min(perm.numel(), max(1, round(args.target_frac * perm.numel())))
    target, rest = perm[:n_t].sort().values, perm[n_t:].sort().values
    rows = torch.isin(batch.group_ids, target).nonzero().squeeze(1)
    assert bool(torch.isin(rows, oracle.rows).all()), "a mixed group's row without A*"
    full, d_full = credit_of(batch, torch.unique(batch.group_ids), rows, specs, special_ids, delta_params)
    alone, d_alone = credit_of(batch, target, rows, specs, special_ids, delta_params)
    d_rest = None
    if rest.numel():
        first_rest = torch.isin(batch.group_ids, rest).nonzero().squeeze(1)[:1]
        _, d_rest = credit_of(batch, rest, first_rest, specs, special_ids, delta_params)
    scorer = Scorer(oracle, rows, batch.mask[rows])
    names = list(full)

    def block(credit: dict[str, Tensor]) -> dict[str, dict[str, float]]:
        return {n: scorer.score(credit[n], {"full": full[n], "alone": alone[n]}) for n in names}

    res: dict[str, Any] = {
        "target_groups": target.tolist(),
        "target_rows": int(rows.numel()),
        "blame_rows": int(scorer.has.sum()),
        "cos_halves": math.nan if d_rest is None else cosine(d_alone, d_rest),
        "cos_alone_full": cosine(d_alone, d_full),
        "full": block(full),
        "alone": block(alone),
        "resamples": [],
    }
    if pool_batch is None:
        groups = torch.unique(batch.group_ids)
        pool = groups[~torch.isin(groups, target)]
    else:
        pool = torch.unique(pool_batch.group_ids)
        target_batch = batch.select(rows)  # T's rows first, in batch order (= `rows`' order)
    for _ in range(args.resamples):
        kept = pool[torch.rand(pool.numel(), generator=gen) < args.keep]
        if pool_batch is None:
            cr, d = credit_of(batch, torch.cat([target, kept]), rows, specs, special_ids, delta_params)
            n_mixed = int(target.numel() + torch.isin(kept, mixed_groups).sum())
        else:
            comp = concat(target_batch, pool_batch.select(torch.isin(pool_batch.group_ids, kept)))
            at = torch.arange(rows.numel())
            cr, d = credit_of(comp, torch.unique(comp.group_ids), at, specs, special_ids, delta_params)
            cr = {n: v[:, : batch.max_len] for n, v in cr.items()}
            n_mixed = int(torch.unique(comp.group_ids[mixed_rows(comp.group_ids, comp.scores)]).numel())
        res["resamples"].append(
            {
                "mixed_groups": n_mixed,
                "cos_full": cosine(d, d_full),
                "cos_alone": cosine(d, d_alone),
                **block(cr),
            }
        )
    return res


# ---------------------------------------------------------------------------- report
def report(k: int, res: dict[str, Any], names: list[str]) -> list[str]:
    rs = res["resamples"]
    lines = [
        f"\n## target set {k}: {len(res['target_groups'])} mixed groups, {res['target_rows']} rows, "
        f"{res['blame_rows']} with a significant A* target",
        f"cos(d on T alone, d on the other mixed groups alone) = {res['cos_halves']:+.3f}; "
        f"cos(d on T alone, d on the full batch) = {res['cos_alone_full']:+.3f}",
        f"resamples: {len(rs)}, mixed groups per composition {fmt(summary([r['mixed_groups'] for r in rs]))}",
        "cos(d, d_full)  " + fmt(summary([r["cos_full"] for r in rs])),
        "cos(d, d_alone) " + fmt(summary([r["cos_alone"] for r in rs])),
        f"share of resamples with cos(d, d_full) < 0: {sum(r['cos_full'] < 0 for r in rs) / max(1, len(rs)):.3f}",
    ]
    for n in names:
        f, a = res["full"][n], res["alone"][n]
        lines.append(
            f"- {n}: blame@1 full {100 * f['blame@1']:.1f}%, alone {100 * a['blame@1']:.1f}%; "
            f"rho(Â, A*) full {f['rho_astar']:+.3f}, alone {a['rho_astar']:+.3f}; "
            f"rho(Â_alone, Â_full) {a['rho_full']:+.3f}, reversed {100 * a['reversed_full']:.1f}%"
        )
        for key, label, pct in (
            ("blame@1", "blame@1 vs A*", True),
            ("rho_astar", "rho(Â, A*) per resp.", False),
            ("top1_full", "same top-1 as full", True),
            ("rho_full", "rho(Â, Â_full)", False),
            ("rho_alone", "rho(Â, Â_alone)", False),
            ("reversed_full", "reversed vs full", True),
        ):
            lines.append(f"    {label:22s} {fmt(summary([r[n][key] for r in rs]), pct)}")
    if rs and "delta" in names:
        b = torch.tensor([r["delta"]["blame@1"] for r in rs], dtype=torch.float64)
        c = torch.tensor([r["cos_full"] for r in rs], dtype=torch.float64)
        ra = torch.tensor([r["delta"]["rho_astar"] for r in rs], dtype=torch.float64)
        if len(rs) > 2 and float(b.std()) > 0 and float(c.std()) > 0:
            lines.append(
                f"across resamples: corr(DelTA blame@1, cos(d, d_full)) = {float(torch.corrcoef(torch.stack([b, c]))[0, 1]):+.3f}, "
                f"corr(DelTA rho(Â, A*), cos(d, d_full)) = {float(torch.corrcoef(torch.stack([ra, c]))[0, 1]):+.3f}"
            )
    return lines


def full_batch_lines(
    batch: RolloutBatch, oracle: Any, specs: Any, special_ids: Any, delta_params: dict[str, Any]
) -> list[str]:
    """Each method's blame@1 vs A* on the whole batch's rows with a target (± SE over rows), by outcome,
    and the check that DelTA's within-response order is the projection s h . d's (per-row Spearman 1)."""
    got = method_credits(batch, specs, special_ids=special_ids)
    g = got["delta"].credit
    d, _ = direction(batch, g.seq_advantages, delta_params)
    scale = (-torch.expm1(batch.old_log_probs.float())).clamp(0.0, 1.0)
    proj = scale * (batch.hidden.float() @ d)
    r = row_spearmans(g.effective().float()[oracle.rows], proj[oracle.rows], batch.mask[oracle.rows])
    check = (
        f"DelTA's Â vs the projection s h . d within each response (full batch, {oracle.rows.numel()} rows): "
        f"Spearman min {float(r[~torch.isnan(r)].min()):+.4f}, mean {nanmean(r):+.4f}"
    )
    has = oracle.targets >= 0
    rows = oracle.rows[has]
    wrong = oracle.credit.rewards.cpu()[has] <= 0
    lines = [
        check,
        f"whole batch, {int(has.sum())} rows with a target ({int(wrong.sum())} wrong, {int((~wrong).sum())} correct):",
    ]
    for name, g in got.items():
        c = g.credit.effective().float()[rows]
        hits = blame_hits(c, batch.mask[rows], oracle.targets[has], 1)
        s = summary(hits.tolist())
        lines.append(
            f"- {name}: blame@1 {100 * s['mean']:.1f}% ± {100 * s['se']:.1f} "
            f"(wrong {100 * float(hits[wrong].mean()):.1f}%, correct {100 * float(hits[~wrong].mean()):.1f}%)"
        )
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="toy", help="a probe --model (default toy, the warm start)")
    p.add_argument("--data", help="probe --data (default: the model's task)")
    p.add_argument("--groups", type=int, default=32)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0, help="the probe seed of the batch (and the oracle)")
    p.add_argument("--oracle", type=int, default=16, metavar="K", help="continuations per state for A*")
    p.add_argument("--methods", default="delta,ktae,surprisal", help="credit methods (delta required)")
    p.add_argument("--target-sets", type=int, default=4, help="random halves T of the mixed groups")
    p.add_argument(
        "--target-frac",
        type=float,
        default=0.5,
        help="share of the mixed groups in T (1: all, with --other-seed)",
    )
    p.add_argument("--resamples", type=int, default=100, help="compositions per target set")
    p.add_argument(
        "--keep", type=float, default=0.5, help="probability that another group joins a composition"
    )
    p.add_argument("--other-seed", type=int, help="draw the other groups from a second batch of this seed")
    p.add_argument("--batch-size", type=int, default=64, help="probe --batch-size (rows per generate call)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="/tmp/delta_dep/result.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr)

    points, run_cfg, recipe, _ = resolve_points(args.model, device="cpu", log=log)
    common = dict(
        group_size=args.group_size,
        max_new_tokens=None,
        random_draws=20,
        batch_size=args.batch_size,
        ks="1,3,10",
        model=args.model,
        data=args.data,
        oracle=args.oracle,
        bootstrap=0,
        grad_batches=0,
    )
    cfg = probe_config(run_cfg, recipe, groups=args.groups, seed=args.seed, **common)
    names = args.methods.split(",")
    if "delta" not in names:
        p.error("--methods must include delta")
    specs = resolve_methods(
        names, advantage=cfg.advantage, advantage_params=cfg.advantage_params, run_recipe=recipe
    )
    delta_params = dict(next(s for s in specs if s.name == "delta").recipe.credit_params)
    model, tok = points[0].load()
    special_ids = special_token_ids(tok)
    ro, batch, golds, scores = sample_batch(model, tok, cfg, specs, log)
    mixed = mixed_rows(batch.group_ids, scores)
    mixed_groups = torch.unique(batch.group_ids[mixed])
    log(
        f"{int(mixed.sum())} rows in {mixed_groups.numel()} mixed groups; accuracy {float(scores.mean()):.3f}"
    )
    with nullcontext(checker_reward) if cfg.synthetic else Reward("auto") as reward:
        oracle = run_oracle(
            model, tok, ro, golds, reward, mixed, cfg, old_log_probs=batch.old_log_probs, log=log
        )
    assert oracle is not None, "no mixed group"
    log(
        f"oracle done: {int((oracle.targets >= 0).sum())} of {oracle.rows.numel()} rows have a significant target"
    )

    full_lines = full_batch_lines(batch, oracle, specs, special_ids, delta_params)
    pool_batch = None
    if args.other_seed is not None:
        cfg2 = probe_config(run_cfg, recipe, groups=args.groups, seed=args.other_seed, **common)
        _, pool_batch, _, s2 = sample_batch(model, tok, cfg2, specs, log)
        n2 = int(torch.unique(pool_batch.group_ids[mixed_rows(pool_batch.group_ids, s2)]).numel())
        log(f"other batch (seed {args.other_seed}): {n2} mixed groups")
    gen = torch.Generator().manual_seed(12345 + args.seed)
    lines = [
        f"# DelTA batch dependence: --model {args.model} --groups {args.groups} --group-size {args.group_size} "
        f"--seed {args.seed} --oracle {args.oracle}"
        + (f" --other-seed {args.other_seed}" if args.other_seed is not None else ""),
        f"mixed groups {mixed_groups.numel()} of {args.groups}; oracle rows {oracle.rows.numel()}, "
        f"with a significant target {int((oracle.targets >= 0).sum())}",
    ]
    lines += full_lines
    results = []
    for k in range(args.target_sets):
        res = run_target_set(
            batch, oracle, mixed_groups, pool_batch, specs, special_ids, delta_params, args, gen
        )
        results.append(res)
        lines += report(k, res, list(res["full"]))
        log(f"target set {k} done")
    wall = time.perf_counter() - t0
    lines.append(f"\nwall {wall:.1f} s, {args.threads} thread(s)")
    print("\n".join(lines))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "wall_s": wall, "target_sets": results}, indent=1))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

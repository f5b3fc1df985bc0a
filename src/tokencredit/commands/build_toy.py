"""`tokencredit build-toy`: rebuild a shipped toy warm start (toy, toy-hard, toy-free), or build a variant (--set).

The build is deterministic on CPU for a fixed thread count and CPU kind; the shipped files were
built with one thread, the default here.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import fields, replace
from typing import Any

import torch

from tokencredit.data.synthetic import ArithmeticTask
from tokencredit.errors import ConfigError, closest
from tokencredit.models import TOY_VARIANTS, WarmStartConfig, build_toy, load_model, toy_accuracy


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--task", default="toy", choices=sorted(TOY_VARIANTS), help="which toy model (default: toy)"
    )
    parser.add_argument(
        "--out", default=None, help="output directory (default: the variant's asset directory)"
    )
    parser.add_argument("--steps", type=int, default=None, help="SFT steps (default: the variant's)")
    parser.add_argument("--seed", type=int, default=WarmStartConfig.seed)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (the shipped build used 1; the weights depend on it)",
    )
    parser.add_argument(
        "--eval", type=int, default=200, help="held-out problems to score after the build (0 = skip)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a warm-start setting of the variant, e.g. phrasings=4 or forget_rate=0.6 (repeatable; "
        "a variant built so is not the shipped one: give --out)",
    )


def _overrides(assignments: list[str]) -> dict[str, object]:
    """{field: value} of `--set FIELD=VALUE` on `WarmStartConfig`'s scalar fields (ConfigError naming the closest)."""
    types = {f.name: f.type for f in fields(WarmStartConfig) if f.name not in ("model", "steps", "seed")}
    out: dict[str, object] = {}
    for a in assignments:
        key, sep, value = a.partition("=")
        key = key.strip()
        if not sep or key not in types:
            raise ConfigError(
                f"--set {a!r}: not FIELD=VALUE of a warm-start setting{closest(key, types)}; one of {', '.join(types)}"
            )
        kind = {"int": int, "float": float, "str": str}[str(types[key])]
        try:
            out[key] = kind(value.strip())
        except ValueError:
            raise ConfigError(f"--set {a!r}: {key} must be a {types[key]}") from None
    return out


def eval_budget(max_new_tokens: int, cfg: WarmStartConfig, problems: list[Any], tokenizer: Any) -> int:
    """The generation budget of the build's accuracy report: at least 96 (the toy's reports so far) and
    the variant's own `max_new_tokens`; room for the longest reference solution of `problems` plus EOS
    and 16 spare tokens (a ``--set difficulty`` beyond the variant's writes longer answers); with free
    phrasings up to 28 tokens a step."""
    longest = max((len(tokenizer(p.solution)["input_ids"]) for p in problems), default=0) + 1
    phrased = 28 * (cfg.difficulty + 1) + 8 if cfg.phrasings else 0
    return max(96, max_new_tokens, longest + 16, phrased)


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    variant = TOY_VARIANTS[args.task]
    cfg = replace(
        variant.config, steps=args.steps or variant.config.steps, seed=args.seed, **_overrides(args.set)
    )
    if args.set and args.out is None:
        raise ConfigError("build-toy --set makes another model than the shipped one: give --out DIR")
    t0 = time.perf_counter()
    out = build_toy(args.out or variant.asset_dir, cfg, log_every=max(1, cfg.steps // 20))
    print(f"built the toy model in {time.perf_counter() - t0:.0f}s -> {out}")
    if args.eval:
        model, tok = load_model(str(out))
        task = ArithmeticTask(
            difficulty=cfg.difficulty,
            digits=cfg.digits,
            operand_digits=cfg.operand_digits,
            phrasings=cfg.phrasings,
        )
        heldout = task.sample(args.eval, "heldout")
        budget = eval_budget(variant.max_new_tokens, cfg, heldout, tok)
        greedy = toy_accuracy(model, tok, heldout, temperature=0.0, max_new_tokens=budget)
        sampled = toy_accuracy(model, tok, heldout, temperature=1.0, max_new_tokens=budget)
        print(f"held-out accuracy on {args.eval} problems: greedy {greedy:.3f}, sampled (T=1) {sampled:.3f}")
    return 0

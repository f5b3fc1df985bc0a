"""`tokencredit probe`: does a credit method blame the token where a wrong solution went astray?

    tokencredit probe --model toy|PATH|RUN_DIR [--checkpoint step_N | --all-checkpoints]
                      [--methods grpo,ktae,delta,strace,arca,...] [--groups N] [--group-size G] [--seed S]
                      [--data toy|toy-hard|BENCHMARK|FILE] [--prompts-per-step N]
                      [--oracle K [--oracle-delta D] [--grad-batches B] [--two-groups]]
                      [--critic RUN_DIR]   (a ppo / bpco run's trained critic: the values the ppo / bpco columns read)

Parses the arguments, calls `tokencredit.probe` (points -> config -> methods -> probe ->
report) and prints the Markdown; the JSON goes to --out and the Markdown beside it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from tokencredit.columns import resolve_methods, with_critic_recipe
from tokencredit.errors import ConfigError
from tokencredit.models import resolve_device
from tokencredit.oracle import DEFAULT_DELTA
from tokencredit.probe import (
    DEFAULT_GRAD_BATCHES,
    DEFAULT_KS,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_METHODS,
    ProbeConfig,
    default_max_new_tokens,
    default_output,
    markdown_report,
    probe_config,
    probe_points,
    probe_result,
    resolve_points,
    write_report,
)
from tokencredit.train.checkpoint import load_run_critic

__all__ = ["add_arguments", "run"]


def _add_data_and_oracle_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data",
        help="problems: 'toy' (the synthetic task), 'toy-hard', 'toy-free', a benchmark name (math500, ...), "
        "'reasoning-gym:NAME[?params]' or a data file; these have no checker truth of the first wrong token, "
        "only the --oracle metrics (default: the run's or the toy model's synthetic task, else toy)",
    )
    parser.add_argument(
        "--oracle",
        type=int,
        default=0,
        metavar="K",
        help="Monte-Carlo continuations per state for the ground-truth token advantages A*: adds the "
        "'Credit fidelity against Monte-Carlo A*' table (default 0: off; e.g. 8)",
    )
    parser.add_argument(
        "--oracle-delta",
        type=float,
        default=DEFAULT_DELTA,
        help=f"the oracle skips tokens of probability >= 1 - delta (A* = 0, |A*| <= delta; default {DEFAULT_DELTA})",
    )
    parser.add_argument(
        "--bootstrap",
        type=int,
        default=200,
        help="resamples of whole groups for the standard errors of the fidelity table's ρ, sign agreement "
        "and Â mass (default 200; 0: none)",
    )
    parser.add_argument(
        "--grad-batches",
        type=int,
        default=DEFAULT_GRAD_BATCHES,
        metavar="B",
        help="with --oracle: split the oracle's rollouts into B batches of whole problems and add each method's "
        "gradient cosines with the oracle's and GRPO's policy gradient (mean ± SE over the batches) and the "
        "headroom index; with an even K also their split-half noise ceiling (A* from each half of the K "
        "continuations, no extra sampling: the noise-corrected cosines and headroom); costs backward passes "
        f"(default {DEFAULT_GRAD_BATCHES}; 0: off)",
    )
    parser.add_argument(
        "--two-groups",
        action="store_true",
        help="with --oracle and --grad-batches: sample two independent groups of --group-size rollouts per problem "
        "and add the noise decomposition of each credit's gradient (signal, between-problem, within-problem and "
        "A*'s Monte-Carlo part of E|g|^2, raw and in AdamW's metric); costs twice the rollouts and oracle "
        "continuations, and two backward passes per credit per problem",
    )
    parser.add_argument(
        "--prompts-per-step",
        type=int,
        metavar="N",
        help="problems (groups) per training batch: every credit is computed on batches of N groups, as the "
        "trainer does per step, so batch statistics (DelTA, S-trace, the 80/20 mask) are a training batch's "
        "(default: the probed run's rollout.prompts_per_step, else the trainer's default 8; 0: the whole probe set)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        required=True,
        help="'toy' (the shipped warm start), 'smollm2', a model directory, a .gguf file, a cached hub id, or a RUN_DIR",
    )
    parser.add_argument(
        "--checkpoint", help="with a RUN_DIR: probe checkpoint step_N (default: RUN_DIR/final)"
    )
    parser.add_argument(
        "--all-checkpoints",
        action="store_true",
        help="with a RUN_DIR: probe the run's starting model and every saved checkpoint",
    )
    parser.add_argument(
        "--methods",
        default=DEFAULT_METHODS,
        help=f"comma-separated credit methods and/or recipes (default: {DEFAULT_METHODS})",
    )
    parser.add_argument(
        "--critic",
        metavar="RUN_DIR",
        help="a run trained with ppo / bpco (or one of its checkpoints): its trained critic gives the values V the "
        "ppo / bpco columns of --methods read, scored like every other column; it must share the probed model's "
        "tokenizer (without it those columns are n/a)",
    )
    parser.add_argument("--groups", type=int, default=64, help="held-out problems (groups), default 64")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per problem (G), default 8")
    parser.add_argument(
        "--seed", type=int, default=0, help="problem sample, sampling and random baseline seed"
    )
    _add_data_and_oracle_arguments(parser)
    parser.add_argument(
        "--difficulty", type=int, help="arithmetic steps of --data toy (default: the run's, else 3)"
    )
    parser.add_argument(
        "--digits", type=int, help="digits of the running totals of --data toy (default: the run's, else 2)"
    )
    parser.add_argument(
        "--operand-digits",
        type=int,
        help="digits of the added operands of --data toy (default: the run's, else the task's)",
    )
    parser.add_argument("--template", help="prompt template (default: the run's, else qwen-math)")
    parser.add_argument(
        "--temperature", type=float, help="sampling temperature (default: the run's, else 1.0)"
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        help=f"generation limit (default {DEFAULT_MAX_NEW_TOKENS}; "
        f"--data toy-hard: its budget, {default_max_new_tokens('toy-hard')})",
    )
    parser.add_argument(
        "--advantage", help="group estimator for plain credit methods (default: the run's, else grpo)"
    )
    parser.add_argument(
        "--ks", default=",".join(map(str, DEFAULT_KS)), help="k values of blame@k (default 1,3,10)"
    )
    parser.add_argument("--random-draws", type=int, default=20, help="draws averaged for the random baseline")
    parser.add_argument("--batch-size", type=int, default=64, help="rows per forward / generate call")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    parser.add_argument(
        "--out",
        help="output JSON file; the Markdown goes next to it as .md (default: RUN_DIR/probe.json or ./probe.json)",
    )


def _command(args: argparse.Namespace, cfg: ProbeConfig) -> str:
    """The command line that reproduces the run (options left at their defaults are omitted)."""
    parts = ["tokencredit probe", f"--model {args.model}"]
    if args.checkpoint:
        parts.append(f"--checkpoint {args.checkpoint}")
    if args.all_checkpoints:
        parts.append("--all-checkpoints")
    parts.append(f"--methods {args.methods}")
    if args.critic:
        parts.append(f"--critic {args.critic}")
    parts += [f"--groups {args.groups}", f"--group-size {args.group_size}", f"--seed {args.seed}"]
    for name in ("data", "difficulty", "digits", "operand_digits", "template", "temperature", "advantage"):
        value = getattr(args, name)
        if value is not None:
            parts.append(f"--{name.replace('_', '-')} {value}")
    if cfg.sampling.max_new_tokens != default_max_new_tokens(cfg.data):
        parts.append(f"--max-new-tokens {cfg.sampling.max_new_tokens}")
    if args.ks != ",".join(map(str, DEFAULT_KS)):
        parts.append(f"--ks {args.ks}")
    if args.oracle:
        parts.append(f"--oracle {args.oracle}")
        if args.oracle_delta != DEFAULT_DELTA:
            parts.append(f"--oracle-delta {args.oracle_delta}")
        if args.bootstrap != 200:
            parts.append(f"--bootstrap {args.bootstrap}")
        if args.grad_batches != DEFAULT_GRAD_BATCHES:
            parts.append(f"--grad-batches {args.grad_batches}")
        if args.two_groups:
            parts.append("--two-groups")
    if args.prompts_per_step is not None:
        parts.append(f"--prompts-per-step {args.prompts_per_step}")
    return " ".join(parts)


MAX_THREADS = 1024


def _say(msg: str) -> None:
    print(f"[probe] {msg}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.threads <= MAX_THREADS:
        raise ConfigError(f"--threads must be in 0..{MAX_THREADS} (0: torch's default), got {args.threads}")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    points, run_cfg, recipe, run_dir = resolve_points(
        args.model, checkpoint=args.checkpoint, all_checkpoints=args.all_checkpoints, device=args.device
    )
    cfg = probe_config(
        run_cfg,
        recipe,
        groups=args.groups,
        group_size=args.group_size,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        random_draws=args.random_draws,
        batch_size=args.batch_size,
        ks=args.ks,
        difficulty=args.difficulty,
        digits=args.digits,
        operand_digits=args.operand_digits,
        template=args.template,
        temperature=args.temperature,
        advantage=args.advantage,
        model=args.model,
        data=args.data,
        oracle=args.oracle,
        oracle_delta=args.oracle_delta,
        bootstrap=args.bootstrap,
        grad_batches=args.grad_batches,
        prompts_per_step=args.prompts_per_step,
        two_groups=args.two_groups,
    )
    specs = resolve_methods(
        args.methods.split(","),
        advantage=cfg.advantage,
        advantage_params=cfg.advantage_params,
        run_recipe=recipe,
    )
    critic = None
    if args.critic:  # loaded (and checked) before any rollout is sampled
        critic = load_run_critic(args.critic, resolve_device(args.device, "--device"), log=_say)
        specs = with_critic_recipe(specs, critic.recipe)  # its column with the critic's gamma, lam and bounds
    out_json = Path(args.out) if args.out else default_output(run_dir)
    results = probe_points(points, specs, cfg, log=_say, critic=critic)
    result = probe_result(_command(args, cfg), args.model, cfg, specs, results)
    md = markdown_report(result)
    out_md = write_report(result, md, out_json)
    print(md)
    print(f"wrote {out_json} and {out_md}", file=sys.stderr)
    return 0

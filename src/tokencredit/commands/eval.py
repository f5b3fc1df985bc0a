"""`tokencredit eval`: a model on the shipped math benchmarks (or data files), greedy and sampled."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.markdown import Markdown

from tokencredit.data.templates import check_template
from tokencredit.errors import ConfigError
from tokencredit.evaluation import EvalSettings, evaluate_benchmarks, load_benchmark, markdown_table
from tokencredit.models import load_model, resolve_device
from tokencredit.rewards import Reward
from tokencredit.rewards.verifier import RETRY_FACTOR
from tokencredit.rollout import SamplingSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="'toy', 'toy-hard', 'smollm2', a model directory, a .gguf file or a cached hub id ORG/NAME")
    parser.add_argument(
        "--bench",
        default="math500",
        help="comma-separated benchmark names (math500, aime24, amc23, minerva_math, olympiadbench, "
        "gsm8k_train), reasoning-gym data ('reasoning-gym:NAME[?params]', its held-out split) or data files "
        "(.jsonl / .parquet / datasets directory)",
    )
    parser.add_argument("--samples", type=int, default=4, help="samples per problem K (pass@k for k=1,2,4..<=K)")
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--top-k", type=int, default=0, help="0 disables top-k")
    parser.add_argument("--max-new-tokens", type=int, default=1024)
    parser.add_argument("--limit", type=int, default=None, help="first L problems of each benchmark")
    parser.add_argument("--seed", default="0", help="seed, or comma-separated seeds (mean and std reported)")
    parser.add_argument("--template", default="qwen-math", help="qwen-math, r1-zero, chat, or a string with {problem}")
    parser.add_argument("--batch-size", type=int, default=64, help="sequences per generate call")
    parser.add_argument("--no-greedy", action="store_true", help="skip the greedy (temperature 0) pass")
    parser.add_argument("--timeout", type=float, default=5.0, help="verifier seconds per answer")
    parser.add_argument("--retry-timeouts", action=argparse.BooleanOptionalAction, default=True,
                        help="judge an answer that timed out once more with 4x the limit (default: on)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    parser.add_argument("--out", default=None, help="write the results as JSON to this file")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in str(text).split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seed must be an integer or comma-separated integers, got {text!r}") from None
    if not seeds:
        raise ConfigError("--seed needs at least one seed")
    return seeds


def _settings(args: argparse.Namespace) -> EvalSettings:
    """The evaluation settings of the command line (ConfigError naming the option when one is out of range)."""
    try:
        sampling = SamplingSettings(
            temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
        )  # fmt: skip
        return EvalSettings(
            samples=args.samples, sampling=sampling, template=args.template, seed=None, greedy=not args.no_greedy
        )
    except ValueError as e:
        raise ConfigError(f"--{str(e).replace('_', '-')}") from None


def run(args: argparse.Namespace) -> int:
    seeds = _seeds(args.seed)
    if args.samples < 0:
        raise ConfigError(f"--samples must be >= 0, got {args.samples}")
    if args.samples == 0 and args.no_greedy:
        raise ConfigError("nothing to evaluate: --samples 0 with --no-greedy")
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {args.limit}")
    if not args.timeout > 0:
        raise ConfigError(f"--timeout must be > 0 seconds, got {args.timeout}")
    check_template(args.template)
    settings = _settings(args)
    benches = [b.strip() for b in args.bench.split(",") if b.strip()]
    if not benches:
        raise ConfigError("--bench names no benchmark")
    data = {b: load_benchmark(b, args.limit) for b in benches}
    device = resolve_device(args.device, "--device")
    dtype = (torch.bfloat16 if device.type == "cuda" else torch.float32) if args.dtype == "auto" else args.dtype
    # "auto": reasoning-gym problems by their own checker, every other benchmark by math-verify
    with Reward("auto", timeout=args.timeout, retry_timeouts=args.retry_timeouts) as reward:
        verifier = reward.verifier
        verifier.start(wait=False)  # the workers warm up while the model loads
        model, tok = load_model(args.model, dtype=dtype, device=device)
        results = evaluate_benchmarks(
            model, tok, data, seeds, settings, verifier=verifier, progress=not args.no_progress
        )
    _report(args, results, seeds)
    return 0


def timeout_line(results: dict, timeout: float, retry: bool) -> str:
    """The answers the verifier could not judge in time, per benchmark (they count as wrong above)."""
    limit = f"{timeout:g} s" + (f", retried with {RETRY_FACTOR * timeout:g} s" if retry else "")
    counts = ", ".join(f"{b} {r.get('verify_timeouts', 0)}" for b, r in results.items())
    return f"verifier timeouts (limit {limit}; a timed-out answer counts as wrong): {counts}"


def _report(args: argparse.Namespace, results: dict, seeds: list[int]) -> None:
    table = markdown_table(results)
    footer = (
        f"template={args.template} temperature={args.temperature} top_p={args.top_p} top_k={args.top_k} "
        f"max_new_tokens={args.max_new_tokens} samples={args.samples} seeds={','.join(map(str, seeds))}"
        + ("" if len(seeds) == 1 else " (mean ± std over seeds)")
    )
    timeouts = timeout_line(results, args.timeout, args.retry_timeouts)
    console = Console()
    if max(len(line) for line in table.splitlines()) + 4 <= console.width:
        console.print(Markdown(table))
    else:
        # Too wide to render without wrapping cells: print the Markdown source unwrapped.
        console.print(table, markup=False, highlight=False, soft_wrap=True)
    console.print(footer)
    console.print(timeouts, markup=False, highlight=False, soft_wrap=True)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        settings = {
            "model": args.model, "samples": args.samples, "temperature": args.temperature, "top_p": args.top_p,
            "top_k": args.top_k, "max_new_tokens": args.max_new_tokens, "template": args.template, "seeds": seeds,
            "limit": args.limit, "timeout": args.timeout, "retry_timeouts": args.retry_timeouts,
        }  # fmt: skip
        payload = {"settings": settings, "results": results, "markdown": f"{table}\n\n{footer}\n{timeouts}\n"}
        out.write_text(json.dumps(payload, indent=2, allow_nan=False) + "\n")
        print(f"wrote {out}", file=sys.stderr)

"""`tokencredit eval`: a model on the shipped math benchmarks, the embedded toy tasks or data files,
greedy and sampled; given a run directory, its final model on the run's own evaluation data."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.markdown import Markdown

from tokencredit.data.templates import chat_template_warning, check_template
from tokencredit.errors import ConfigError
from tokencredit.evaluation import (
    BENCHMARKS,
    DEFAULT_EVAL_SAMPLING,
    EvalSettings,
    evaluate_benchmarks,
    load_benchmark,
    markdown_table,
)
from tokencredit.models import MODEL_ALIASES, TOY_VARIANTS, load_model, resolve_device
from tokencredit.rewards import Reward
from tokencredit.rewards.custom import is_builtin_reward
from tokencredit.rewards.verifier import RETRY_FACTOR
from tokencredit.rollout import SamplingSettings
from tokencredit.tasks import load_problems_for
from tokencredit.train.config import DataConfig, TrainConfig
from tokencredit.train.rundir import RunDir
from tokencredit.train.sampling import run_eval_settings

# The value of each option left out, without a run directory (with one: the run's own, `_run_defaults`).
_DEFAULTS: dict[str, Any] = {
    "samples": 4,
    "temperature": DEFAULT_EVAL_SAMPLING.temperature,
    "top_p": DEFAULT_EVAL_SAMPLING.top_p,
    "max_new_tokens": DEFAULT_EVAL_SAMPLING.max_new_tokens,
    "batch_size": DEFAULT_EVAL_SAMPLING.batch_size,
    "seed": "0",
    "template": "qwen-math",
    "dtype": "auto",
}
_RUN = " (a run directory: the run's own)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        required=True,
        help="'toy', 'toy-hard', 'toy-free', 'smollm2', a model directory, a .gguf file, a cached hub id ORG/NAME, or a run "
        "directory of `tokencredit train` (its final model; by default on the run's own evaluation data and "
        "settings from its config.toml: data.eval, eval.*, the template, max_new_tokens, dtype)",
    )
    parser.add_argument(
        "--bench",
        default=None,
        help=f"comma-separated benchmark names ({', '.join(BENCHMARKS)}; toy / toy-hard: the embedded tasks' "
        "held-out problems, as data.eval='toy' in training), reasoning-gym data ('reasoning-gym:NAME[?params]', "
        "its held-out split) or data files (.jsonl / .parquet / datasets directory); default math500, or a run "
        "directory's data.eval",
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=None,
        help="samples per problem K (pass@k for k=1,2,4..<=K); default 4" + _RUN,
    )
    parser.add_argument("--temperature", type=float, default=None, help="default 0.6" + _RUN)
    parser.add_argument("--top-p", type=float, default=None, help="default 0.95" + _RUN)
    parser.add_argument("--top-k", type=int, default=0, help="0 disables top-k")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 1024" + _RUN)
    parser.add_argument("--limit", type=int, default=None, help="first L problems of each benchmark")
    parser.add_argument(
        "--seed",
        default=None,
        help="seed, or comma-separated seeds (mean and std reported); default 0" + _RUN,
    )
    parser.add_argument(
        "--template",
        default=None,
        help="qwen-math (default), r1-zero, chat, or a string with {problem}" + _RUN,
    )
    parser.add_argument(
        "--batch-size", type=int, default=None, help="sequences per generate call; default 64" + _RUN
    )
    parser.add_argument("--no-greedy", action="store_true", help="skip the greedy (temperature 0) pass")
    parser.add_argument("--timeout", type=float, default=5.0, help="verifier seconds per answer")
    parser.add_argument(
        "--retry-timeouts",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="judge an answer that timed out once more with 4x the limit (default: on)",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    parser.add_argument(
        "--dtype",
        default=None,
        choices=["auto", "float32", "bfloat16", "float16"],
        help="default auto (bfloat16 on CUDA, else float32)" + _RUN,
    )
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


def _run_config(model: str) -> tuple[RunDir, TrainConfig] | None:
    """(the run, its config) when `model` is a run directory of `tokencredit train` (a model's name, such
    as "toy", stays that model), else None. Keys of its config.toml this version does not know are
    skipped with a warning (on stderr)."""
    run = RunDir(model)
    if model in TOY_VARIANTS or model in MODEL_ALIASES or not run.is_run():
        return None
    skipped: list[str] = []
    cfg = run.read_config(skipped=skipped)
    for line in skipped:
        print(f"tokencredit eval: warning: {line}", file=sys.stderr)
    if not run.has_final_model():
        raise ConfigError(
            f"--model {model}: the run has no final model ({run.final_dir} is missing: the run has not finished); "
            f"finish it with `tokencredit train --resume {model}`"
        )
    return run, cfg


def _run_defaults(cfg: TrainConfig) -> dict[str, Any]:
    """The options' defaults for a run directory: the settings of the trainer's own evaluations."""
    s = run_eval_settings(cfg)
    return {
        "samples": s.samples,
        "temperature": s.sampling.temperature,
        "top_p": s.sampling.top_p,
        "max_new_tokens": s.sampling.max_new_tokens,
        "batch_size": s.sampling.batch_size,
        "seed": str(s.seed),
        "template": s.template,
        "dtype": cfg.model.dtype,
    }


def _settings(args: argparse.Namespace) -> EvalSettings:
    """The evaluation settings of the command line (ConfigError naming the option when one is out of range)."""
    try:
        sampling = SamplingSettings(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
        )
        return EvalSettings(
            samples=args.samples,
            sampling=sampling,
            template=args.template,
            seed=None,
            greedy=not args.no_greedy,
        )
    except ValueError as e:
        raise ConfigError(f"--{str(e).replace('_', '-')}") from None


def _run_data(run: RunDir, cfg: TrainConfig, limit: int | None) -> dict[str, list[Any]]:
    """{data.eval: its problems}: the run's held-out data as the trainer loads it (one benchmark, as the
    trainer evaluates it; its validation split for a run with data.eval_split = "validation"), the
    first `limit` problems when given."""
    try:
        problems = load_problems_for(cfg.data.eval, cfg.data, split=cfg.data.eval_split)
    except ConfigError as e:
        raise ConfigError(f"{run.config_path}: data.eval = {cfg.data.eval!r}: {e} (give --bench)") from None
    return {cfg.data.eval: problems[:limit] if limit else problems}


def _benchmarks(args: argparse.Namespace, target: tuple[RunDir, TrainConfig] | None) -> dict[str, list[Any]]:
    """{name: problems} of --bench, or of a run directory's data.eval when --bench is not given."""
    if args.bench is None and target is not None:
        return _run_data(*target, args.limit)
    benches = [b.strip() for b in (args.bench or "math500").split(",") if b.strip()]
    if not benches:
        raise ConfigError("--bench names no benchmark")
    data = (
        target[1].data if target is not None else DataConfig()
    )  # toy / toy-hard: the run's difficulty and digits
    return {b: load_benchmark(b, args.limit, data) for b in benches}


def _reward(target: tuple[RunDir, TrainConfig] | None, args: argparse.Namespace) -> Reward:
    """The run's own built-in reward for a run directory (its trainer evaluated with it); else "auto":
    reasoning-gym problems by their own checker, every other benchmark by math-verify. A user reward
    function is a training reward: evaluation judges correctness ("auto"), as the trainer's does."""
    name = target[1].reward.function if target is not None else "auto"
    name = name if is_builtin_reward(name) else "auto"
    return Reward(name, timeout=args.timeout, retry_timeouts=args.retry_timeouts)


def _set_threads(model: str, cfg: TrainConfig | None) -> None:
    """CPU threads as the trainer sets them: a run's run.threads, else one for the toy models (their
    ops are too small to split: more threads only wait on each other)."""
    threads = cfg.run.threads if cfg is not None else 0
    if threads > 0 or (cfg.model.name if cfg is not None else model) in TOY_VARIANTS:
        torch.set_num_threads(threads or 1)


def run(args: argparse.Namespace) -> int:
    target = _run_config(args.model)
    for key, value in (_DEFAULTS if target is None else _run_defaults(target[1])).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
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
    data = _benchmarks(args, target)
    device = resolve_device(args.device, "--device")
    _set_threads(args.model, target[1] if target is not None else None)
    dtype = (
        (torch.bfloat16 if device.type == "cuda" else torch.float32) if args.dtype == "auto" else args.dtype
    )
    model_path = str(target[0].final_dir) if target is not None else args.model
    with _reward(target, args) as reward:
        verifier = reward.verifier
        verifier.start(wait=False)  # the workers warm up while the model loads
        model, tok = load_model(model_path, dtype=dtype, device=device)
        warning = chat_template_warning(args.template, tok, args.model, option="--template")
        if warning:
            print(f"tokencredit eval: warning: {warning}", file=sys.stderr)
        results = evaluate_benchmarks(
            model, tok, data, seeds, settings, verifier=verifier, progress=not args.no_progress
        )
    _report(args, results, seeds, target[0] if target is not None else None)
    return 0


def timeout_line(results: dict, timeout: float, retry: bool) -> str:
    """The answers the verifier could not judge in time, per benchmark (they count as wrong above)."""
    limit = f"{timeout:g} s" + (f", retried with {RETRY_FACTOR * timeout:g} s" if retry else "")
    counts = ", ".join(f"{b} {r.get('verify_timeouts', 0)}" for b, r in results.items())
    return f"verifier timeouts (limit {limit}; a timed-out answer counts as wrong): {counts}"


def _report(args: argparse.Namespace, results: dict, seeds: list[int], run: RunDir | None) -> None:
    table = markdown_table(results)
    footer = (
        (
            f"run {run.path}: its final model; what the command line leaves out is the run's ({run.config_path})\n"
            if run
            else ""
        )
        + f"template={args.template} temperature={args.temperature} top_p={args.top_p} top_k={args.top_k} "
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
            "model": args.model,
            "samples": args.samples,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "top_k": args.top_k,
            "max_new_tokens": args.max_new_tokens,
            "template": args.template,
            "seeds": seeds,
            "limit": args.limit,
            "timeout": args.timeout,
            "retry_timeouts": args.retry_timeouts,
            "benchmarks": list(results),
            "run": str(run.path) if run else None,
            "dtype": args.dtype,
            "batch_size": args.batch_size,
        }
        payload = {"settings": settings, "results": results, "markdown": f"{table}\n\n{footer}\n{timeouts}\n"}
        out.write_text(json.dumps(payload, indent=2, allow_nan=False) + "\n")
        print(f"wrote {out}", file=sys.stderr)

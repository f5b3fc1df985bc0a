"""`tokencredit explain`: per-token credit of several methods as one HTML file (`tokencredit.explain`).

tokencredit explain RUN_DIR [--step N] [--methods ktae,delta,strace,arca,uniform] [--groups K] [--out F.html]
tokencredit explain --jsonl FILE --model PATH [--methods ...] [--groups K] [--out F.html]
tokencredit explain ... [--select mixed|all-wrong|all-right|any] [--groups K]  |  [--group-index 3,7,12]
tokencredit explain RUN_DIR --methods saved,ktae,...   (saved: the Â the rollouts were trained with)
tokencredit explain ... [--png F.png] [--max-tokens 8192]
tokencredit explain RUN_DIR|--jsonl ... [--critic CRITIC_RUN]   (ppo / bpco columns: a trained critic's values)

A bad input is one line naming it (exit 2); a completion cut to fit or a large page is one warning line
on stderr, said before the model scores, and a note on the page.
"""

from __future__ import annotations

import argparse
import sys

from tokencredit.explain import DEFAULT_METHODS, GROUP_KINDS, ExplainOptions, write_report
from tokencredit.explain.options import DEFAULT_MAX_TOKENS

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir", nargs="?", help="a training run directory (reads RUN_DIR/rollouts/step_NNNNNN.jsonl)"
    )
    parser.add_argument(
        "--jsonl",
        help="JSONL of prompts, completions and rewards instead of a run directory; or prime-rl's token exports "
        "(a step_N/rank_R.jsonl file, or a directory of them)",
    )
    parser.add_argument(
        "--model",
        help="a model ('toy', 'smollm2', a directory, a .gguf file, a cached hub id); required with --jsonl; default RUN_DIR/final",
    )
    parser.add_argument(
        "--step",
        type=int,
        help="which saved step of the run or prime-rl export directory (default: the latest)",
    )
    parser.add_argument(
        "--methods",
        default=DEFAULT_METHODS,
        help="comma-separated credit methods and/or recipes, and 'saved': the Â saved with the rollouts, as trained "
        f"(every shown completion must carry token_advantages) (default: {DEFAULT_METHODS})",
    )
    parser.add_argument(
        "--groups",
        type=int,
        metavar="K",
        help="how many groups to show (default 4): the first K of the --select kind",
    )
    parser.add_argument(
        "--select",
        metavar="KIND",
        help=f"which kind of group to show: {' | '.join(GROUP_KINDS)} (right: saved 'correct', else reward > 0; "
        "default credit: groups where some method's credit is non-zero, those whose rewards differ first)",
    )
    parser.add_argument(
        "--group-index",
        metavar="I,J,...",
        help="show exactly these groups: 0-based indices in the file, as in each group's header (e.g. 3,7,12)",
    )
    parser.add_argument(
        "--out", help="output HTML file (default: RUN_DIR/explain_step_NNNNNN.html or FILE.explain.html)"
    )
    parser.add_argument(
        "--advantage",
        help="group estimator for plain credit methods (grpo, dr-grpo, rloo, grpo-batch; default: the run's, else grpo)",
    )
    parser.add_argument(
        "--template", help="prompt template for 'problem' fields (default: the run's, else qwen-math)"
    )
    parser.add_argument(
        "--temperature", type=float, help="temperature of the signals (default: the run's, else 1.0)"
    )
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda (for recomputing signals)")
    parser.add_argument(
        "--batch-size", type=int, default=16, help="rows per forward when recomputing signals"
    )
    parser.add_argument(
        "--critic",
        metavar="RUN",
        help="a run trained with ppo / bpco (or one of its checkpoints): its trained critic gives the values V that "
        "the ppo / bpco columns read, added beside the default --methods (default: the explained run's own critic, "
        "if it trained one; without a critic those columns are skipped)",
    )
    parser.add_argument("--png", help="also write a static picture (PNG) of the first group's credit")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        metavar="N",
        help="tokens of a completion scored and shown; a longer one is cut (and one past the model's positions "
        f"after its prompt), marked truncated and noted on the page (default {DEFAULT_MAX_TOKENS})",
    )


def _say(line: str) -> None:
    print(f"tokencredit explain: {line}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    result = write_report(
        ExplainOptions(
            run_dir=args.run_dir,
            jsonl=args.jsonl,
            model=args.model,
            step=args.step,
            methods=args.methods,
            groups=args.groups,
            select=args.select,
            group_index=args.group_index,
            out=args.out,
            advantage=args.advantage,
            template=args.template,
            temperature=args.temperature,
            device=args.device,
            batch_size=args.batch_size,
            png=args.png,
            max_tokens=args.max_tokens,
            critic=args.critic,
        ),
        warn=_say,  # a large page or a completion cut: said before the model loads or scores
    )
    for line in result.damaged:  # what of a damaged run directory was left out (also on the page)
        _say(line)
    skipped = f" (skipped: {', '.join(result.skipped)}; reasons on the page)" if result.skipped else ""
    print(f"wrote {result.path}{skipped}" + (f" and {args.png}" if args.png else ""))
    return 0

"""Generation throughput of `tokencredit.rollout.generate` vs naive loops, on the toy model, CPU.

Setting (defaults): a freshly initialised toy Qwen3 (`tokencredit.models.build_toy_model`, hidden 128,
3 layers, character tokenizer), P = 16 arithmetic prompts (`ArithmeticTask`, "qwen-math" chat
template, ~130 tokens each) x G = 8 samples, up to 64 new tokens, temperature 1.

Compared, each generating the same P x G completions:
- batched: `tokencredit.rollout.generate(model, tok, prompts, G)`: every prompt tokenised once, all
  P x G rows in one `model.generate` call with the KV cache, finished rows stopped at EOS;
- per-prompt loop (naive): for each prompt, tokenise it and call `model.generate` with
  num_return_sequences = G (one call per prompt);
- per-completion loop (naive): tokenise and generate one completion at a time (P x G calls);
- batched without the KV cache (`use_cache=False`), to show what the cache buys (`--no-cache-check`).

Reported: generated tokens (valid response tokens, EOS included) per second of wall time, median
over `--repeats` runs after a warm-up, the process CPU time, the 1-minute load average, and the
ratios. Also checked (printed): the number of tokenizer calls `generate` makes (1 for all P x G rows),
and that decoding stops at the longest completion when every row has finished.

OpenMP: OMP_WAIT_POLICY defaults to PASSIVE here, as in benchmarks/bench_credit.py (see there).

Threads: one torch thread by default: with 2 threads on a busy 2-core machine, libgomp's spin-waiting
at every parallel region made this generation up to 25x slower (see benchmarks/bench_trainer_vs_trl.py).

    python benchmarks/bench_generation.py
    python benchmarks/bench_generation.py --prompts 32 --group-size 16 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

# Before torch loads (see the module docstring): libgomp reads this once, at start-up.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from _common import load_average


def _time(fn, repeats: int, warmup: bool = True) -> tuple[list[float], float, Any]:
    out = fn() if warmup else None  # the model is warm after the first measurement; long runs skip it
    wall, cpu = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, statistics.median(cpu), out


class CountingTokenizer:
    """Wraps a tokenizer and counts `__call__` invocations and the texts they encode."""

    def __init__(self, tok: Any) -> None:
        self.__dict__["_tok"] = tok
        self.__dict__["calls"] = 0
        self.__dict__["texts"] = 0

    def __call__(self, texts: Any, *a: Any, **k: Any) -> Any:
        self.__dict__["calls"] += 1
        self.__dict__["texts"] += 1 if isinstance(texts, str) else len(texts)
        return self._tok(texts, *a, **k)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._tok, name, value)


def _naive(model: Any, tok: Any, prompts: list[str], group: int, max_new: int, per_completion: bool) -> int:
    """Per-prompt (or per-completion) loop over `model.generate`; returns the generated tokens."""
    eos = tok.eos_token_id
    tokens = 0
    with torch.no_grad():
        for p in prompts:
            reps = group if per_completion else 1
            for _ in range(reps):
                enc = tok(p, return_tensors="pt", add_special_tokens=False)
                out = model.generate(
                    **enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new,
                    num_return_sequences=1 if per_completion else group, eos_token_id=eos,
                    pad_token_id=tok.pad_token_id, use_cache=True,
                )  # fmt: skip
                resp = out[:, enc["input_ids"].shape[1] :]
                is_eos = resp == eos
                seen = is_eos.long().cumsum(1) - is_eos.long()
                tokens += int((seen == 0).sum())
    return tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 by default: see the module docstring)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-per-completion", action="store_true", help="skip the slowest baseline")
    p.add_argument(
        "--no-cache-check", action="store_true", help="also time batched generation without KV cache"
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from tokencredit.data.synthetic import ArithmeticTask
    from tokencredit.data.templates import render
    from tokencredit.models import build_toy_model, build_toy_tokenizer
    from tokencredit.rollout import generate

    tok = build_toy_tokenizer()
    model = build_toy_model(seed=args.seed, tokenizer=tok).eval()
    problems = ArithmeticTask().sample(args.prompts, "train")
    prompts = [render("qwen-math", q.problem, tok) for q in problems]
    n_rows = args.prompts * args.group_size
    prompt_tokens = statistics.mean(len(tok(x, add_special_tokens=False)["input_ids"]) for x in prompts)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}; "
        f"toy Qwen3 "
        f"({sum(x.numel() for x in model.parameters()) / 1e6:.2f} M params), P={args.prompts} x G={args.group_size} "
        f"= {n_rows} rows, prompt ~{prompt_tokens:.0f} tokens, max_new_tokens={args.max_new_tokens}, load {load_average()}"
    )

    counting = CountingTokenizer(tok)
    seeds = iter(range(10_000))

    def batched() -> Any:
        return generate(
            model, counting, prompts, args.group_size, max_new_tokens=args.max_new_tokens, seed=next(seeds)
        )

    wall, cpu, ro = _time(batched, args.repeats)
    calls_per_run = counting.calls / (args.repeats + 1)
    texts_per_run = counting.texts / (args.repeats + 1)
    tok_b = int(ro.response_mask.sum())
    med_b = statistics.median(wall)
    lengths = ro.response_lengths
    print(
        f"batched  tokencredit.rollout.generate: {tok_b} tokens in {med_b:.3f} s (median of {args.repeats}: "
        f"{', '.join(f'{t:.2f}' for t in wall)}) -> {tok_b / med_b:,.0f} tokens/s, CPU {cpu:.2f} s, load {load_average()}"
    )
    print(
        f"  tokenizer calls per generate: {calls_per_run:.0f} (encoding {texts_per_run:.0f} prompt texts for "
        f"{n_rows} rows); response columns {ro.response_ids.shape[1]} (longest completion {int(lengths.max())}, "
        f"mean {float(lengths.float().mean()):.1f}, truncated {int(ro.truncated.sum())}/{n_rows})"
    )
    # Stop check: with frequent characters (digits, space) as extra stop ids every row ends early; the
    # decoding loop must end at the longest completion, not run to max_new_tokens.
    stops = [tok.eos_token_id, *tok.convert_tokens_to_ids(list("0123456789 "))]
    budget = 4 * args.max_new_tokens
    stop = generate(model, tok, prompts, args.group_size, max_new_tokens=budget, seed=123, eos_token_id=stops)
    ran = stop.response_ids.shape[1]
    print(
        f"  stop check (stop ids: EOS, digits, space; max_new_tokens={budget}): decoding ran {ran} columns = longest "
        f"completion {int(stop.response_lengths.max())} (mean {float(stop.response_lengths.float().mean()):.1f}); "
        f"{'OK' if ran == int(stop.response_lengths.max()) < budget else 'NOT STOPPED'}. Finished rows stay in the "
        "batch as padding until the last row ends (transformers' generate does not shrink the batch)"
    )

    results = {"batched": tok_b / med_b}
    wall, cpu, tok_p = _time(
        lambda: _naive(model, tok, prompts, args.group_size, args.max_new_tokens, per_completion=False),
        args.repeats,
    )
    med_p = statistics.median(wall)
    results["per-prompt"] = tok_p / med_p
    print(
        f"per-prompt loop ({args.prompts} generate calls x {args.group_size} rows): {tok_p} tokens in {med_p:.3f} s "
        f"-> {tok_p / med_p:,.0f} tokens/s, CPU {cpu:.2f} s, load {load_average()}"
    )
    if not args.skip_per_completion:
        wall, cpu, tok_c = _time(
            lambda: _naive(model, tok, prompts, args.group_size, args.max_new_tokens, per_completion=True),
            1,
            warmup=False,
        )
        med_c = statistics.median(wall)
        results["per-completion"] = tok_c / med_c
        print(
            f"per-completion loop ({n_rows} generate calls x 1 row): {tok_c} tokens in {med_c:.3f} s "
            f"-> {tok_c / med_c:,.0f} tokens/s, CPU {cpu:.2f} s (1 timed run), load {load_average()}"
        )
    if args.no_cache_check:
        cfg_cache = model.generation_config.use_cache
        model.generation_config.use_cache = False
        try:
            from transformers import GenerationConfig

            enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
            ids = enc["input_ids"].repeat_interleave(args.group_size, 0)
            att = enc["attention_mask"].repeat_interleave(args.group_size, 0)
            gc = GenerationConfig(
                do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.max_new_tokens,
                eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, use_cache=False,
            )  # fmt: skip

            def nocache() -> int:
                with torch.no_grad():
                    out = model.generate(input_ids=ids, attention_mask=att, generation_config=gc)
                resp = out[:, ids.shape[1] :]
                is_eos = resp == tok.eos_token_id
                return int(((is_eos.long().cumsum(1) - is_eos.long()) == 0).sum())

            wall, cpu, tok_n = _time(nocache, 1, warmup=False)
            results["batched, no KV cache"] = tok_n / wall[0]
            print(
                f"batched without KV cache: {tok_n} tokens in {wall[0]:.3f} s -> {tok_n / wall[0]:,.0f} tokens/s, "
                f"CPU {cpu:.2f} s (1 timed run), load {load_average()}"
            )
        finally:
            model.generation_config.use_cache = cfg_cache
    for name, tps in results.items():
        if name != "batched":
            print(f"ratio batched / {name}: {results['batched'] / tps:.2f}x")


if __name__ == "__main__":
    main()

"""Generation speed of `tokencredit.rollout.generate` against plain `model.generate` and the compute floor.

Setting (defaults = the trainer's defaults, issue 18): the shipped toy model (`load_model("toy")`,
Qwen3, 0.65 M parameters, character tokenizer), CPU, 1 torch thread. `--model` takes any model
`load_model` accepts (e.g. `smollm2`, the real SmolLM2-135M-Instruct Llama from its GGUF file, issue 30),
with the toy task's problems as prompts.

- *rollout round*: P = 8 training problems ("qwen-math" chat template, ~122 tokens) x G = 8 samples,
  up to 80 new tokens, temperature 1, top_p 1 (`RolloutConfig`), one `generate` call, as
  `Trainer._generate_round` makes it;
- *eval*: 200 held-out problems decoded greedily, then 2 samples each at temperature 1, in the
  chunks the trainer's evaluation makes (`eval.batch_size` rows per `generate` call, 256 by default;
  `--eval-batch 64` gives `evaluate`'s own default).

Paths, run alternately (hf, repeated, ours, hf, ...; median over `--repeats`):

- hf: plain ``model.generate`` on the left-padded rows with the same `GenerationConfig`
  (`tokencredit.rollout.generation_config`): transformers' `DynamicCache`, every row's prompt
  prefilled. This is what `generate` did before issue 18;
- repeated (rollout round only): `tokencredit.rollout.generate(..., shared_attention=False)`: shared
  prompt prefill and append-in-place cache, each row holding its own copy of the prompt's keys/values
  (what `generate` did from the first issue-18 change until the shared-prefix attention);
- ours: `tokencredit.rollout.generate` (shared prompt prefill, append-in-place cache, shared-prefix
  attention; see its docstring).

All get the same seeds; the script checks that they return the same tokens.

Compute floors (no decoding overhead; measured, not estimated):

- floor A: one forward of the finished batch, ``model(sequences, attention_mask)`` on the
  [N, prompt + response] ids that ours generated (no cache, causal attention over all positions);
- floor B: what any decoder must compute: each distinct prompt once, then one forward of all
  response tokens [N, T] over the prompt cache (repeated to the N rows).

The ratios time / floor are printed; the issue-18 target is ours <= 3x floor A on the rollout round.
`--mechanisms` also times transformers' static cache, with and without ``torch.compile``.
`--train-run DIR` instead runs the default `tokencredit train` and reports the time spent inside
`generate` (run it with an older checkout's src on PYTHONPATH for the "before" figures).
`--profile` prints torch profiler tables (top ops by self CPU time) of one rollout round per path.
Also checked: one tokenizer call per `generate`, and decoding stops at the longest completion.

OpenMP: OMP_WAIT_POLICY defaults to PASSIVE (see BENCHMARKS.md, "two environment effects").

    python benchmarks/bench_generation.py
    python benchmarks/bench_generation.py --mechanisms --profile
    python benchmarks/bench_generation.py --train-run /tmp/gen_after
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

# Before torch loads: libgomp reads this once, at start-up.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from _common import load_average


def _clock(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


def alternate(
    paths: dict[str, Callable[[int], Any]], repeats: int
) -> dict[str, tuple[float, float, list[Any]]]:
    """Run each path once to warm up, then `repeats` rounds of all paths in turn (repeat r uses seed r).
    Returns name -> (median wall s, median CPU s, outputs of the timed runs)."""
    for fn in paths.values():
        fn(-1)
    wall: dict[str, list[float]] = {k: [] for k in paths}
    cpu: dict[str, list[float]] = {k: [] for k in paths}
    outs: dict[str, list[Any]] = {k: [] for k in paths}
    for r in range(repeats):
        for name, fn in paths.items():
            w, c, o = _clock(functools.partial(fn, r))
            wall[name].append(w)
            cpu[name].append(c)
            outs[name].append(o)
    return {k: (statistics.median(wall[k]), statistics.median(cpu[k]), outs[k]) for k in paths}


def hf_generate(
    model: Any,
    tok: Any,
    prompts: list[str],
    group: int,
    temperature: float,
    top_p: float,
    max_new: int,
    seed: int | None,
) -> torch.Tensor:
    """[N, T] response ids from one plain ``model.generate`` call (DynamicCache, full prefill)."""
    from tokencredit.rollout import generation_config

    cfg = generation_config(temperature, top_p, 0, max_new, [tok.eos_token_id], tok.pad_token_id)
    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    ids = enc["input_ids"].repeat_interleave(group, 0)
    att = enc["attention_mask"].repeat_interleave(group, 0)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        if seed is not None:
            torch.manual_seed(seed)
        out = model.generate(input_ids=ids, attention_mask=att, generation_config=cfg)
    return out[:, ids.shape[1] :]


def same_tokens(hf: torch.Tensor, ro: Any, eos: int) -> bool:
    """hf's raw [N, T] output equals the rollout's valid tokens (hf pads finished rows with the pad id)."""
    if hf.shape[1] != ro.response_ids.shape[1]:
        return False
    return bool(torch.equal(torch.where(ro.response_mask, hf, ro.pad_token_id), ro.response_ids))


def floors(
    model: Any, tok: Any, prompts: list[str], group: int, ro: Any, repeats: int
) -> tuple[float, float]:
    """(floor A, floor B) in seconds, medians over `repeats` (see the module docstring)."""
    from transformers import DynamicCache

    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    seq, att = ro.sequences, ro.attention_mask
    padded = not bool(enc["attention_mask"].all())

    def floor_a() -> None:
        model(input_ids=seq, attention_mask=att, use_cache=False)

    def floor_b() -> None:
        cache = DynamicCache(config=model.config)
        m = enc["attention_mask"]
        model(
            input_ids=enc["input_ids"],
            attention_mask=m if padded else None,
            cache=cache,
            use_cache=True,
            position_ids=(m.cumsum(-1) - 1).clamp(min=0),
            logits_to_keep=1,
        )
        cache.batch_repeat_interleave(group)
        pos = att.cumsum(-1)[:, enc["input_ids"].shape[1] :] - 1
        model(input_ids=ro.response_ids, attention_mask=att, position_ids=pos, cache=cache, use_cache=True)

    res = []
    with torch.no_grad():
        for fn in (floor_a, floor_b):
            fn()
            res.append(statistics.median(_clock(fn)[0] for _ in range(repeats)))
    return res[0], res[1]


def train_run(out: str) -> None:
    """The default `tokencredit train` in this process, with the wall and CPU seconds spent inside
    `tokencredit.rollout.generate` (rollouts and evaluations) recorded; works with any version of
    tokencredit on PYTHONPATH, so an older checkout gives the "before" figures."""
    import tokencredit.rollout as rollout
    from tokencredit.cli import main as cli_main

    inner = rollout.generate
    spent = {"wall": 0.0, "cpu": 0.0, "calls": 0}

    def timed(*a: Any, **k: Any) -> Any:
        w, c, res = _clock(lambda: inner(*a, **k))
        spent["wall"] += w
        spent["cpu"] += c
        spent["calls"] += 1
        return res

    rollout.generate = timed  # the trainer and evaluate import it at call time
    w, c, rc = _clock(lambda: cli_main(["train", "--out", out, "--no-progress"]))
    print(
        f"train run ({rollout.__file__}): exit {rc}, {w:.1f} s wall, {c:.1f} s CPU; inside generate "
        f"({spent['calls']} calls): {spent['wall']:.1f} s wall, {spent['cpu']:.1f} s CPU; load {load_average()}"
    )


def library_mechanisms(
    model: Any, tok: Any, prompts: list[str], group: int, max_new: int, repeats: int
) -> None:
    """Time transformers' own speed options on the rollout round: the static cache, and the static cache
    with ``torch.compile`` of the decoding forward (CPU compilation has to be forced on; the first
    call includes compiling)."""
    from transformers import CompileConfig

    from tokencredit.rollout import generation_config

    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    ids, att = enc["input_ids"].repeat_interleave(group, 0), enc["attention_mask"].repeat_interleave(group, 0)
    compiled = CompileConfig()
    compiled._compile_all_devices = True  # transformers compiles only on accelerators unless told
    for label, extra in (
        ("dynamic cache (generate's default)", {}),
        ("static cache", {"cache_implementation": "static"}),
        ("static cache + torch.compile", {"cache_implementation": "static", "compile_config": compiled}),
    ):
        cfg = generation_config(1.0, 1.0, 0, max_new, [tok.eos_token_id], tok.pad_token_id)
        cfg.update(**extra)
        with torch.no_grad():
            first = _clock(
                lambda cfg=cfg: model.generate(input_ids=ids, attention_mask=att, generation_config=cfg)
            )[0]
            times = [
                _clock(
                    lambda cfg=cfg: model.generate(input_ids=ids, attention_mask=att, generation_config=cfg)
                )[0]
                for _ in range(repeats)
            ]
        print(
            f"  {label}: first call {first:.2f} s, then median {statistics.median(times):.3f} s; load {load_average()}"
        )


def profile_table(fn: Callable[[], Any], rows: int = 12) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def main() -> None:
    from tokencredit.train.config import EvalConfig

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--model", default="toy", help="any name load_model accepts (toy, smollm2, a directory, ...)"
    )
    p.add_argument("--template", default="qwen-math", help="prompt template (tokencredit.data.templates)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=80)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--eval-problems", type=int, default=200)
    p.add_argument(
        "--eval-batch",
        type=int,
        default=EvalConfig().batch_size,
        help="rows per generate call in eval (the trainer's)",
    )
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: the trainer's default for the toy)"
    )
    p.add_argument("--seed", type=int, default=0, help="problem sampling seed")
    p.add_argument("--skip-eval", action="store_true")
    p.add_argument(
        "--train-run",
        metavar="DIR",
        help="instead: the default `tokencredit train` into DIR, with the time inside generate",
    )
    p.add_argument(
        "--mechanisms", action="store_true", help="also time transformers' static cache and torch.compile"
    )
    p.add_argument(
        "--profile", action="store_true", help="torch profiler tables of one rollout round per path"
    )
    args = p.parse_args()
    if args.train_run:
        train_run(args.train_run)  # the trainer sets its own threads (1 for the toy)
        return
    torch.set_num_threads(args.threads)

    from tokencredit.data.templates import render
    from tokencredit.models import load_model, toy_task
    from tokencredit.rollout import generate

    model, tok = load_model(args.model)
    task = toy_task(args.seed)
    prompts = [render(args.template, q.problem, tok) for q in task.sample(args.prompts, "train")]
    n_rows = args.prompts * args.group_size
    plen = statistics.mean(len(tok(x, add_special_tokens=False)["input_ids"]) for x in prompts)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), OMP_WAIT_POLICY="
        f"{os.environ.get('OMP_WAIT_POLICY')}; model {args.model} ({type(model).__name__}, "
        f"{sum(x.numel() for x in model.parameters()) / 1e6:.2f} M params); load {load_average()}"
    )
    temp, top_p, max_new = args.temperature, args.top_p, args.max_new_tokens

    # ---- rollout round
    def ours(seed: int) -> Any:
        return generate(
            model,
            tok,
            prompts,
            args.group_size,
            temperature=temp,
            top_p=top_p,
            max_new_tokens=max_new,
            seed=seed,
        )

    def repeated(seed: int) -> Any:  # shared prefill + append cache, every row's own copy of the prompt
        return generate(
            model,
            tok,
            prompts,
            args.group_size,
            temperature=temp,
            top_p=top_p,
            max_new_tokens=max_new,
            seed=seed,
            shared_attention=False,
        )

    def hf(seed: int) -> torch.Tensor:
        return hf_generate(model, tok, prompts, args.group_size, temp, top_p, max_new, seed)

    res = alternate({"hf": hf, "repeated": repeated, "ours": ours}, args.repeats)
    ro = res["ours"][2][-1]
    tokens = int(ro.response_mask.sum())
    same = all(
        same_tokens(h, o, tok.eos_token_id) and torch.equal(o.response_ids, p.response_ids)
        for h, p, o in zip(res["hf"][2], res["repeated"][2], res["ours"][2])
    )
    fa, fb = floors(model, tok, prompts, args.group_size, ro, args.repeats)
    print(
        f"\nrollout round: P={args.prompts} x G={args.group_size} = {n_rows} rows, prompt ~{plen:.0f} tokens, "
        f"{ro.response_ids.shape[1]} decoding steps, {tokens} sampled tokens, temperature {temp}, top_p {top_p}, "
        f"max_new_tokens {max_new}; median of {args.repeats} alternated runs"
    )
    for name in ("hf", "repeated", "ours"):
        w, c, _ = res[name]
        print(
            f"  {name:8s} {w:.3f} s wall, {c:.3f} s CPU, {tokens / w:,.0f} tokens/s, "
            f"{w / fa:.2f}x floor A, {w / fb:.2f}x floor B"
        )
    print(f"  floor A (one forward of the finished [{n_rows}, {ro.sequences.shape[1]}] batch): {fa:.3f} s")
    print(
        f"  floor B (distinct prompts once + one forward of the [{n_rows}, {ro.response_ids.shape[1]}] "
        f"responses over the cache): {fb:.3f} s"
    )
    print(
        f"  speed-up hf/ours {res['hf'][0] / res['ours'][0]:.2f}x wall, {res['hf'][1] / res['ours'][1]:.2f}x CPU; "
        f"repeated/ours {res['repeated'][0] / res['ours'][0]:.2f}x wall; "
        f"same tokens (hf, repeated, ours) under the same seeds: {'yes' if same else 'NO'}; load {load_average()}"
    )

    # ---- eval decoding, in evaluate's chunks
    if not args.skip_eval:
        eval_prompts = [
            render(args.template, q.problem, tok) for q in task.sample(args.eval_problems, "heldout")
        ]
        for label, n_per, t in (("greedy", 1, 0.0), ("2 samples", 2, temp)):
            per_chunk = max(1, args.eval_batch // n_per)
            chunks = [eval_prompts[s : s + per_chunk] for s in range(0, len(eval_prompts), per_chunk)]

            def ours_eval(seed: int, chunks=chunks, n_per=n_per, t=t) -> list[Any]:
                return [
                    generate(
                        model,
                        tok,
                        c,
                        n_per,
                        temperature=t,
                        top_p=top_p,
                        max_new_tokens=max_new,
                        seed=seed if t > 0 else None,
                    )
                    for c in chunks
                ]

            def hf_eval(seed: int, chunks=chunks, n_per=n_per, t=t) -> list[torch.Tensor]:
                return [
                    hf_generate(model, tok, c, n_per, t, top_p, max_new, seed if t > 0 else None)
                    for c in chunks
                ]

            r = alternate({"hf": hf_eval, "ours": ours_eval}, max(1, args.repeats // 2))
            last = r["ours"][2][-1]
            same = all(
                same_tokens(h, o, tok.eos_token_id)
                for hs, os_ in zip(r["hf"][2], r["ours"][2])
                for h, o in zip(hs, os_)
            )
            fa_eval = sum(floors(model, tok, c, n_per, o, 1)[0] for c, o in zip(chunks, last))
            n_tok = sum(int(o.response_mask.sum()) for o in last)
            print(
                f"\neval {label}: {len(eval_prompts)} problems x {n_per}, {len(chunks)} generate calls, "
                f"{n_tok} tokens; median of {max(1, args.repeats // 2)} alternated runs"
            )
            for name in ("hf", "ours"):
                w, c, _ = r[name]
                print(
                    f"  {name:5s} {w:.3f} s wall, {c:.3f} s CPU, {w / fa_eval:.2f}x floor A ({fa_eval:.3f} s)"
                )
            print(
                f"  speed-up hf/ours {r['hf'][0] / r['ours'][0]:.2f}x wall; same tokens: {'yes' if same else 'NO'}; "
                f"load {load_average()}"
            )

    # ---- checks: tokenising once, stopping at the longest completion
    calls = []
    orig = type(tok).__call__

    def counting(self: Any, text: Any, *a: Any, **k: Any) -> Any:
        calls.append(1 if isinstance(text, str) else len(text))
        return orig(self, text, *a, **k)

    type(tok).__call__ = counting
    try:
        ours(0)
    finally:
        type(tok).__call__ = orig
    print(
        f"\ntokenizer calls per generate: {len(calls)} (encoding {sum(calls)} prompt texts for {n_rows} rows)"
    )
    # a second stop id that every row soon samples (the rollouts' most frequent token), so that all rows end early
    sampled = ro.response_ids[ro.response_mask.bool()]
    common = int(torch.mode(sampled[sampled != tok.eos_token_id]).values)
    stops = [tok.eos_token_id, common]
    budget = 4 * max_new
    stop = generate(model, tok, prompts, args.group_size, max_new_tokens=budget, seed=123, eos_token_id=stops)
    ran, longest = stop.response_ids.shape[1], int(stop.response_lengths.max())
    print(
        f"stop check (stop ids EOS and {tok.convert_ids_to_tokens(common)!r}; max_new_tokens={budget}): decoding ran "
        f"{ran} columns, longest completion {longest}: {'OK' if ran == longest < budget else 'NOT STOPPED'}"
    )

    if args.mechanisms:
        print("\ntransformers' own options, plain model.generate on the rollout round:")
        library_mechanisms(model, tok, prompts, args.group_size, max_new, args.repeats)
    if args.profile:
        for name, fn in (("hf", lambda: hf(99)), ("ours", lambda: ours(99))):
            print(f"\nprofile, one rollout round, {name}:\n{profile_table(fn)}")


if __name__ == "__main__":
    main()

"""Operations issued per decoding step: our decoding path against plain ``generate``, counted on the CPU.

Why: on an H100 the trainer's SmolLM2 rollouts took 11.1 s a step against TRL's 6.9 s, with CPU time equal
to wall time (docs/experiments/trainer-speed.md#the-first-gpu-run-benchmarksgpu_checksh). Where a small
model's decoding is bound by the CPU issuing kernels, the number of ATen operations per step is the cost
that carries over to the GPU. This script counts them with ``torch.profiler`` on a random Llama of
SmolLM2-135M's layout (30 layers, 9 query and 3 key/value heads) shrunk in width, so that it runs in
seconds on a laptop, for two paths of `tokencredit.rollout.generate_ids`:

- ours: shared prompt prefill, append-in-place cache, shared-prefix attention and our decoding loop;
- repeated + generate: ``shared_attention=False``: the same prefill and cache, every row holding its
  prompt's keys/values, decoded by ``model.generate``.

It prints the counts per decoding step, their ratio, the most frequent operations and each path's
unprofiled wall time (on the CPU a CPU figure; with ``--device cuda`` the GPU's, synchronised, so that the
two paths' decoding time can be compared where the trainer's rollouts lost to TRL's).

    python benchmarks/decode_ops.py                    # 8 prompts x 8 samples, 64 steps
    python benchmarks/decode_ops.py --steps 32 --layers 8
    # SmolLM2-135M's full layout (hidden 576, vocabulary 49,152) on a GPU, 128 new tokens, bf16:
    python benchmarks/decode_ops.py --device cuda --dtype bfloat16 --width 64 --vocab 49152 --steps 128
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import torch
from _common import load_average

# Operations that only re-describe a tensor (no kernel on a GPU) or allocate; the rest launch work.
METADATA = frozenset(
    "aten::" + op
    for op in (
        "as_strided view reshape _unsafe_view transpose slice expand t resolve_conj resolve_neg unsqueeze "
        "squeeze select permute detach alias empty empty_like empty_strided lift_fresh _reshape_alias split "
        "unbind contiguous chunk narrow to result_type"
    ).split()
)


def _model(layers: int, width: int, vocab: int, dtype: torch.dtype, device: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=9 * width,
        intermediate_size=24 * width,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=1024,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(cfg).eval().to(device=device, dtype=dtype)


def _run(
    model: torch.nn.Module, args: argparse.Namespace, shared: bool
) -> tuple[Counter[str], Counter[str], int, float]:
    """(ATen operation counts, leaf operation counts, decoding steps, unprofiled wall seconds: the fastest
    of `args.repeats` calls) of one `generate_ids` call."""
    from tokencredit.rollout.generation import generate_ids, sampling_settings

    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, args.vocab, (args.prompts, args.prompt_len), generator=g)
    mask = torch.ones_like(prompt, dtype=torch.bool)
    s = sampling_settings(temperature=1.0, top_p=1.0, max_new_tokens=args.steps)

    def call() -> torch.Tensor:
        # EOS id 0 of the vocabulary: a random model rarely samples it, so rows run close to the full `steps`
        # (the ids come back on the CPU, so the call's wall time includes the device's work)
        return generate_ids(
            model,
            prompt,
            mask,
            args.samples,
            eos_ids=[0],
            pad_id=1,
            sampling=s,
            seed=0,
            shared_attention=shared,
        )[1]

    call()  # warm-up
    walls = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        ids = call()
        walls.append(time.perf_counter() - t0)
    wall = min(walls)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        call()
    ops = Counter({e.key: e.count for e in prof.key_averages() if e.key.startswith("aten::")})
    # leaves: operations that call no other ATen operation (matmul calls mm, to calls copy_): one kernel each.
    # Only ATen children count: on CUDA a leaf's children are the runtime's launch calls.
    leaves = Counter(
        e.name
        for e in prof.events()
        if e.name.startswith("aten::") and not any(c.name.startswith("aten::") for c in e.cpu_children)
    )
    return ops, leaves, int(ids.shape[1]), wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=30, help="decoder layers (SmolLM2-135M: 30)")
    p.add_argument("--width", type=int, default=8, help="head width; hidden size = 9 x width")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=8, help="samples per prompt")
    p.add_argument("--prompt-len", type=int, default=44, help="prompt tokens (SmolLM2 bench: 44)")
    p.add_argument("--steps", type=int, default=64, help="new tokens")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the GPU runs bf16")
    p.add_argument("--vocab", type=int, default=256, help="vocabulary (SmolLM2: 49152)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--repeats", type=int, default=1, help="timed calls per path (the fastest is shown)")
    p.add_argument("--top", type=int, default=8, help="most frequent operations shown")
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = _model(args.layers, args.width, args.vocab, getattr(torch, args.dtype), args.device)
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, 1 thread, load {load_average()}"
    print(
        f"torch {torch.__version__}, {where}; random Llama ({args.dtype}), {args.layers} layers, hidden "
        f"{9 * args.width}, vocabulary {args.vocab}; {args.prompts} x {args.samples} rows, prompt {args.prompt_len} "
        f"tokens, {args.steps} steps"
    )
    per_step, work_step, walls = {}, {}, {}
    for name, shared in (("ours", True), ("repeated + generate", False)):
        ops, leaves, steps, wall = _run(model, args, shared)
        work = Counter({k: v for k, v in leaves.items() if k not in METADATA})
        per_step[name], work_step[name] = sum(ops.values()) / steps, sum(work.values()) / steps
        top = ", ".join(f"{k.removeprefix('aten::')} {v / steps:.0f}" for k, v in work.most_common(args.top))
        print(
            f"{name:20s} {steps} steps; a step: {per_step[name]:6.0f} ATen ops, {work_step[name]:5.0f} leaf ops that "
            f"do work ({wall:.2f} s unprofiled, {wall / steps * 1e3:.1f} ms a step); most: {top}"
        )
        walls[name] = wall
    a, b = "ours", "repeated + generate"
    print(
        f"ratio {a} / {b}: {per_step[a] / per_step[b]:.2f}x ops a step, {work_step[a] / work_step[b]:.2f}x leaf ops that "
        f"do work, {walls[a] / walls[b]:.2f}x wall time"
    )


if __name__ == "__main__":
    main()

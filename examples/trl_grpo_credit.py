"""GRPO with token-level credit in TRL: a Qwen model on the GSM8K prompts shipped with tokencredit.

    pip install -e ".[trl]"
    python examples/trl_grpo_credit.py --model Qwen/Qwen2.5-Math-1.5B --credit ktae --max-steps 200
    accelerate launch --num_processes 8 examples/trl_grpo_credit.py --credit dapo+ktae --use-vllm

`--credit` takes any registered credit method (ktae, entropy-80-20, delta, surprisal, gcpo, ...) or
recipe (dapo+ktae, grpo+ktae, delta, ...): `tokencredit recipes` lists them. The reward is the
math-verify verifier of `tokencredit.rewards.math_reward` (1.0 when the final boxed answer equals
the gold answer). Prompts use the "qwen-math" template (the tokenizer's chat template with the
system prompt "Please reason step by step, and put your final answer within \\boxed{}.").
"""

from __future__ import annotations

import argparse

import torch
from datasets import Dataset
from transformers import AutoTokenizer
from trl import GRPOConfig

from tokencredit.data.math_benchmarks import load
from tokencredit.data.templates import render
from tokencredit.integrations.trl import CreditGRPOTrainer
from tokencredit.rewards import math_reward


def math_verify_reward(completions: list[str], answer: list[list[str]], **_: object) -> list[float]:
    """1.0 for a completion whose final answer matches one of the gold answers, else 0.0."""
    return math_reward(completions, answer)


def gsm8k_dataset(tokenizer, limit: int | None) -> Dataset:
    """The shipped GSM8K training prompts, rendered with the qwen-math template."""
    rows = []
    for p in load("gsm8k_train", limit=limit):
        answers = [p.answer] if isinstance(p.answer, str) else list(p.answer)
        rows.append(
            {"prompt": render("qwen-math", p.problem, tokenizer), "problem": p.problem, "answer": answers}
        )
    return Dataset.from_list(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="Qwen/Qwen2.5-Math-1.5B", help="hub id or local path")
    ap.add_argument("--credit", default="ktae", help="credit method or recipe name")
    ap.add_argument("--output-dir", default="runs/trl_grpo_credit")
    ap.add_argument("--limit", type=int, default=None, help="use the first N GSM8K problems")
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--per-device-batch", type=int, default=8, help="completions per device per step")
    ap.add_argument("--num-generations", type=int, default=8, help="G, completions per prompt")
    ap.add_argument("--grad-accum", type=int, default=4)
    ap.add_argument("--max-completion-length", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--use-vllm", action="store_true", help="generate with vLLM (colocated)")
    ap.add_argument("--report-to", default="none")
    args = ap.parse_args(argv)

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    cuda = torch.cuda.is_available()
    config = GRPOConfig(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.per_device_batch,
        gradient_accumulation_steps=args.grad_accum,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        learning_rate=args.lr,
        temperature=args.temperature,
        beta=0.0,
        bf16=cuda,
        use_cpu=not cuda,
        gradient_checkpointing=cuda,
        use_vllm=args.use_vllm,
        vllm_mode="colocate",
        logging_steps=1,
        save_strategy="no",
        report_to=args.report_to,
    )
    trainer = CreditGRPOTrainer(
        model=args.model,
        reward_funcs=math_verify_reward,
        args=config,
        train_dataset=gsm8k_dataset(tokenizer, args.limit),
        processing_class=tokenizer,
        credit=args.credit,
    )
    trainer.train()
    trainer.save_model(args.output_dir)


if __name__ == "__main__":
    main()

"""GRPO with token-level credit in TRL: a Qwen model on the GSM8K prompts shipped with tokencredit.

    pip install -e ".[trl]"
    python examples/trl_grpo_credit.py --model Qwen/Qwen2.5-Math-1.5B --credit ktae --max-steps 200
    accelerate launch --num_processes 8 examples/trl_grpo_credit.py --credit dapo+ktae --use-vllm
    # a real model offline on a CPU (issue 30): SmolLM2-135M-Instruct from its GGUF, reasoning-gym chain sums
    python examples/trl_grpo_credit.py --model smollm2 --data reasoning-gym:chain_sum_small --template chat \
        --credit delta --max-steps 3 --per-device-batch 8 --num-generations 4 --grad-accum 1 \
        --max-completion-length 48 --lr 2e-4 --lora-rank 8

`--model` takes a hub id or local path (loaded by TRL) or any name `tokencredit.models.load_model` accepts
(`smollm2`, a `.gguf` file, a cached hub id; loaded here and handed to TRL).

`--credit` takes any registered credit method (ktae, entropy-80-20, delta, surprisal, gcpo, ...) or
recipe (dapo+ktae, grpo+ktae, delta, ...): `tokencredit recipes` lists them. The reward is the
math-verify verifier of `tokencredit.rewards.math_reward` (1.0 when the final boxed answer equals
the gold answer). Prompts use the "qwen-math" template (the tokenizer's chat template with the
system prompt "Please reason step by step, and put your final answer within \\boxed{}.").
"""

from __future__ import annotations

import argparse
import json

import torch
from datasets import Dataset
from transformers import AutoTokenizer
from trl import GRPOConfig

from tokencredit.data.math_benchmarks import load
from tokencredit.data.templates import render
from tokencredit.errors import ConfigError
from tokencredit.integrations.trl import CreditGRPOTrainer
from tokencredit.rewards import math_reward


def math_verify_reward(completions: list[str], answer: list[list[str]], **_: object) -> list[float]:
    """1.0 for a completion whose final answer matches one of the gold answers, else 0.0."""
    return math_reward(completions, answer)


def gsm8k_dataset(tokenizer, limit: int | None, template: str = "qwen-math") -> Dataset:
    """The shipped GSM8K training prompts, rendered with `template`."""
    rows = []
    for p in load("gsm8k_train", limit=limit):
        answers = [p.answer] if isinstance(p.answer, str) else list(p.answer)
        rows.append(
            {"prompt": render(template, p.problem, tokenizer), "problem": p.problem, "answer": answers}
        )
    return Dataset.from_list(rows)


def gym_dataset_and_reward(spec: str, tokenizer, size: int, template: str):
    """reasoning-gym problems (`tokencredit.data.reasoning_gym`) and a reward scored by reasoning-gym's own
    checker in tokencredit's sandboxed workers; the entry reference travels as a dataset column."""
    from tokencredit.data import reasoning_gym
    from tokencredit.rewards import Reward
    from tokencredit.rewards.reasoning_gym import GymAnswer

    problems = reasoning_gym.load(spec, split="train", size=size)
    rows = [
        {
            "prompt": render(template, p.problem, tokenizer),
            "problem": p.problem,
            "answer": str(p.answer),
            "answer_ref": json.dumps(p.answer.ref),
        }
        for p in problems
    ]
    reward = Reward("reasoning-gym")

    def gym_reward(
        completions: list[str], answer: list[str], answer_ref: list[str], **_: object
    ) -> list[float]:
        golds = [GymAnswer(a, **json.loads(r)) for a, r in zip(answer, answer_ref)]
        return reward(completions, golds)

    return Dataset.from_list(rows), gym_reward


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
    ap.add_argument("--data", default="gsm8k", help="gsm8k (shipped) or reasoning-gym:NAME[?params]")
    ap.add_argument("--template", default="qwen-math", help="prompt template: qwen-math, chat, r1-zero")
    ap.add_argument("--train-size", type=int, default=2000, help="reasoning-gym problems to draw")
    ap.add_argument("--lora-rank", type=int, default=0, help="> 0: train a LoRA adapter (peft)")
    args = ap.parse_args(argv)

    model = args.model
    try:  # a name tokencredit resolves offline (smollm2, a .gguf file, a cached hub id, a directory)
        from tokencredit.models import load_model

        model, tokenizer = load_model(args.model)
    except ConfigError:  # a hub id TRL may fetch itself
        tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if args.data == "gsm8k":
        dataset, reward_fn = gsm8k_dataset(tokenizer, args.limit, args.template), math_verify_reward
    else:
        dataset, reward_fn = gym_dataset_and_reward(args.data, tokenizer, args.train_size, args.template)
    peft_config = None
    if args.lora_rank > 0:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=args.lora_rank,
            lora_alpha=2 * args.lora_rank,
            task_type="CAUSAL_LM",
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        )
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
        model=model,
        reward_funcs=reward_fn,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        credit=args.credit,
        peft_config=peft_config,
    )
    trainer.train()
    trainer.save_model(args.output_dir)


if __name__ == "__main__":
    main()

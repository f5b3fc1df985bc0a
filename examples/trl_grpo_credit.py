"""GRPO with token-level credit in TRL, on any data `tokencredit train` reads, scored by its rewards.

    pip install -e ".[trl]"
    # the embedded toy model and task on a CPU, rollouts saved for `tokencredit explain` (docs/integrations.md)
    python examples/trl_grpo_credit.py --model toy --data toy --credit ktae --max-steps 2 \
        --per-device-batch 8 --num-generations 4 --grad-accum 1 --max-completion-length 80 --lr 1e-4 \
        --save-rollouts runs/trl-toy/rollouts --save-every 1 --output-dir runs/trl-toy
    python examples/trl_grpo_credit.py --model Qwen/Qwen2.5-Math-1.5B --data gsm8k_train --credit ktae --max-steps 200
    accelerate launch --num_processes 8 examples/trl_grpo_credit.py --credit dapo+ktae --use-vllm
    # a real model offline on a CPU (issue 30): SmolLM2-135M-Instruct from its GGUF, reasoning-gym chain sums
    python examples/trl_grpo_credit.py --model smollm2 --data reasoning-gym:chain_sum_small --template chat \
        --credit delta --max-steps 3 --per-device-batch 8 --num-generations 4 --grad-accum 1 \
        --max-completion-length 48 --lr 2e-4 --lora-rank 8

`--model` takes a hub id or local path (loaded by TRL) or any name `tokencredit.models.load_model` accepts
(`toy`, `toy-hard`, `toy-free`, `smollm2`, a `.gguf` file, a cached hub id; loaded here and handed to TRL).

`--data` takes any of the trainer's data specs (`data.train`): `toy`, `toy-hard`, `toy-free`, a shipped
benchmark (`gsm8k_train`, `math500`, ...; `gsm8k` is `gsm8k_train`), `reasoning-gym:NAME[?params]`, a
JSONL / Parquet file or `datasets` directory; the problems come from `tokencredit.tasks.load_problems_for`
and the prompts from `tokencredit.data.templates.render` with `--template`, as `tokencredit train` makes
them. `--reward` takes any `reward.function` (default `auto`: math-verify, reasoning-gym's checker for its
problems, or your `module:function` in either contract, docs/inputs.md); TRL calls it through one
reward function with its own contract, which hands it the problem records.

`--credit` takes any registered credit method (ktae, entropy-80-20, delta, surprisal, gcpo, ...) or
recipe (dapo+ktae, grpo+ktae, delta, ...): `tokencredit recipes` lists them. `--save-rollouts DIR
--save-every N` writes DIR/step_NNNNNN.jsonl every N steps (`SaveRolloutsCallback`), which
`tokencredit explain --jsonl` and `tokencredit probe --data` read.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import torch
from datasets import Dataset
from transformers import AutoTokenizer
from trl import GRPOConfig

from tokencredit.data.templates import render
from tokencredit.errors import ConfigError
from tokencredit.integrations.trl import CreditGRPOTrainer, SaveRolloutsCallback
from tokencredit.rewards import Reward
from tokencredit.rewards.custom import resolve_reward_function
from tokencredit.tasks import load_problems_for
from tokencredit.train.config import DataConfig

DATA_ALIASES = {"gsm8k": "gsm8k_train"}


def problems_dataset(
    spec: str, tokenizer: Any, template: str, size: int, limit: int | None
) -> tuple[Dataset, list]:
    """(dataset, problems): the problems of data spec `spec` (its training split; `size` problems of a toy
    task or reasoning-gym data, the first `limit` of any), one row each: the rendered `prompt`, its `id`,
    `problem` and `answer` (a list of acceptable strings)."""
    problems = load_problems_for(spec, DataConfig(train=spec, train_size=size), split="train")[:limit]
    ids = [p.id for p in problems]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"--data {spec}: problem ids repeat; the reward finds each problem by its id")
    rows = [
        {
            "prompt": render(template, p.problem, tokenizer),
            "id": p.id,
            "problem": p.problem,
            "answer": [str(p.answer)] if not isinstance(p.answer, list) else [str(a) for a in p.answer],
        }
        for p in problems
    ]
    return Dataset.from_list(rows), problems


def tokencredit_reward(reward: Reward, problems: list) -> Callable[..., list[float]]:
    """A TRL reward function (TRL's contract: prompts, completions, completion ids and the dataset's columns
    by keyword) that scores with `reward` against each row's problem record, found by its `id` column (the
    record keeps what a dataset column cannot, a reasoning-gym answer's entry, for one)."""
    by_id = {p.id: p for p in problems}

    def verifier(prompts: list, completions: list, completion_ids: list, **columns: Any) -> list[float]:
        rows = [by_id[i] for i in columns["id"]]
        return reward(
            completions,
            [p.answer for p in rows],
            prompts=prompts,
            completion_ids=completion_ids,
            problems=rows,
            step=columns["trainer_state"].global_step,
        )

    verifier.__name__ = reward.spec  # TRL's name for it: rewards/<name>/mean
    return verifier


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--model", default="Qwen/Qwen2.5-Math-1.5B", help="hub id, local path or tokencredit name"
    )
    ap.add_argument("--credit", default="ktae", help="credit method or recipe name")
    ap.add_argument("--output-dir", default="runs/trl_grpo_credit")
    ap.add_argument("--data", default="gsm8k_train", help="a data spec of tokencredit train (data.train)")
    ap.add_argument("--template", default="qwen-math", help="prompt template: qwen-math, chat, r1-zero")
    ap.add_argument(
        "--reward", default="auto", help="reward.function: auto, math, reasoning-gym, module:function"
    )
    ap.add_argument("--reward-contract", default="auto", help="reward.contract of a module:function")
    ap.add_argument("--train-size", type=int, default=2000, help="toy / reasoning-gym problems to draw")
    ap.add_argument("--limit", type=int, default=None, help="use the first N problems")
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--per-device-batch", type=int, default=8, help="completions per device per step")
    ap.add_argument("--num-generations", type=int, default=8, help="G, completions per prompt")
    ap.add_argument("--grad-accum", type=int, default=4)
    ap.add_argument("--max-completion-length", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--use-vllm", action="store_true", help="generate with vLLM (colocated)")
    ap.add_argument("--report-to", default="none")
    ap.add_argument(
        "--log-completions", action="store_true", help="TRL's completions table (OUTPUT_DIR/completions)"
    )
    ap.add_argument("--lora-rank", type=int, default=0, help="> 0: train a LoRA adapter (peft)")
    ap.add_argument(
        "--save-rollouts", default=None, metavar="DIR", help="save rollouts as DIR/step_NNNNNN.jsonl"
    )
    ap.add_argument(
        "--save-every", type=int, default=10, metavar="N", help="with --save-rollouts: every N steps"
    )
    args = ap.parse_args(argv)

    model = args.model
    try:  # a name tokencredit resolves offline (toy, smollm2, a .gguf file, a cached hub id, a directory)
        from tokencredit.models import load_model

        model, tokenizer = load_model(args.model)
    except ConfigError:  # a hub id TRL may fetch itself
        tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    data = DATA_ALIASES.get(args.data, args.data)
    dataset, problems = problems_dataset(data, tokenizer, args.template, args.train_size, args.limit)
    reward = Reward(
        resolve_reward_function(args.reward, [data]), contract=args.reward_contract, max_steps=args.max_steps
    )
    reward.check(problems[0])  # a user function that does not fit its contract stops here, before training
    callbacks = (
        [SaveRolloutsCallback(args.save_rollouts, every=args.save_every)] if args.save_rollouts else None
    )
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
        seed=args.seed,
        beta=0.0,
        bf16=cuda,
        use_cpu=not cuda,
        gradient_checkpointing=cuda,
        use_vllm=args.use_vllm,
        vllm_mode="colocate",
        logging_steps=1,
        log_completions=args.log_completions,
        save_strategy="no",
        report_to=args.report_to,
    )
    with reward:
        trainer = CreditGRPOTrainer(
            model=model,
            reward_funcs=tokencredit_reward(reward, problems),
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            credit=args.credit,
            peft_config=peft_config,
            callbacks=callbacks,
        )
        trainer.train()
    trainer.save_model(args.output_dir)


if __name__ == "__main__":
    try:
        main()
    except ConfigError as e:  # bad input: one line, no traceback
        sys.exit(f"error: {e}")

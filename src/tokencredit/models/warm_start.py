"""The supervised warm start of a toy model on the synthetic arithmetic task (`WarmStartConfig`), its
accuracy check and the deterministic build of the shipped files (`build_toy`)."""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from tokencredit.data.synthetic import ArithmeticTask, check
from tokencredit.data.templates import render
from tokencredit.models.toy import (
    TOY_ASSET_DIR,
    WarmStartConfig,
    build_toy_model,
    build_toy_tokenizer,
    toy_variant,
)


def _encode_examples(tokenizer: Any, prompts: list[str], targets: list[str]) -> tuple[torch.Tensor, ...]:
    """Right-padded (input_ids, attention_mask, labels) with the loss on target tokens only."""
    p_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    t_ids = tokenizer([t + tokenizer.eos_token for t in targets], add_special_tokens=False)["input_ids"]
    width = max(len(a) + len(b) for a, b in zip(p_ids, t_ids))
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(prompts), width), -100, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, (a, b) in enumerate(zip(p_ids, t_ids)):
        n = len(a) + len(b)
        ids[i, :n] = torch.tensor(a + b)
        labels[i, len(a) : n] = torch.tensor(b)
        mask[i, :n] = 1
    return ids, mask, labels


def _sft_loss(model: Any, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss over the labelled tokens, running the prompt prefix that every row
    shares (the template's system turn) once instead of once per row.

    Same loss and gradients as ``model(ids, mask, labels=labels).loss`` (up to float rounding): the
    shared prefix's keys/values are computed with gradients for one row and repeated across the
    batch, which makes the warm start about twice as fast on CPU.
    """

    same = (ids == ids[:1]).all(dim=0) & mask.bool().all(dim=0)
    first_label = int((labels != -100).any(dim=0).nonzero()[0])
    p = int(same.long().cumprod(0).sum())
    # The first labelled token is predicted from the position before it, which must not be cached.
    p = min(p, first_label - 1)
    if p <= 0:
        return model(input_ids=ids, attention_mask=mask, labels=labels).loss
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    model.model(input_ids=ids[:1, :p], past_key_values=cache, use_cache=True)
    cache.batch_repeat_interleave(ids.shape[0])
    positions = torch.arange(p, ids.shape[1]).expand(ids.shape[0], -1)
    out = model(
        input_ids=ids[:, p:],
        attention_mask=mask,
        past_key_values=cache,
        position_ids=positions,
        labels=labels[:, p:],
        use_cache=True,
    )
    return out.loss


def warm_start(
    model: Any, tokenizer: Any, config: WarmStartConfig | None = None, *, log_every: int = 0
) -> list[float]:
    """Supervised fine-tuning of `model` (in place) on noisy-teacher solutions; returns the losses.

    Deterministic on CPU for a fixed thread count: the data order, the teacher's slips and the
    initial weights all derive from ``config.seed``.
    """

    cfg = config or WarmStartConfig()
    task = ArithmeticTask(
        difficulty=cfg.difficulty,
        digits=cfg.digits,
        operand_digits=cfg.operand_digits,
        seed=cfg.seed,
        phrasings=cfg.phrasings,
        tail=cfg.tail,
    )
    problems = task.sample(cfg.steps * cfg.batch_size, "train")
    teacher_rng = random.Random(f"teacher|{cfg.seed}")
    torch.manual_seed(cfg.seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.98),
    )

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))

    model.train()
    losses: list[float] = []
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        batch = problems[step * cfg.batch_size : (step + 1) * cfg.batch_size]
        prompts = [render(cfg.template, p.problem, tokenizer) for p in batch]
        targets = [task.solution(p, forget_rate=cfg.forget_rate, rng=teacher_rng) for p in batch]
        ids, mask, labels = _encode_examples(tokenizer, prompts, targets)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = _sft_loss(model, ids, mask, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if log_every and (step + 1) % log_every == 0:
            recent = sum(losses[-log_every:]) / log_every
            print(
                f"warm start step {step + 1}/{cfg.steps} loss {recent:.4f} ({time.perf_counter() - t0:.0f}s)"
            )
    model.eval()
    return losses


def _generate_chunks(
    model: Any,
    tokenizer: Any,
    problems: list[Any],
    *,
    template: str,
    batch_size: int,
    seed: int,
    **generate: Any,
) -> Iterator[tuple[list[Any], int, Any]]:
    """(problems, prompt length, `model.generate`'s output) per chunk of `batch_size` problems, prompted with
    `template` (left-padded) and generated with `generate`, under a forked RNG seeded with `seed`: the build
    report's measurements, reproducible and without touching the caller's RNG."""
    model.eval()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for s in range(0, len(problems), batch_size):
            chunk = problems[s : s + batch_size]
            enc = tokenizer(
                [render(template, p.problem, tokenizer) for p in chunk],
                add_special_tokens=False,
                padding=True,
                padding_side="left",
                return_tensors="pt",
            )
            out = model.generate(
                **enc, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, **generate
            )
            yield chunk, int(enc["input_ids"].shape[1]), out


@torch.no_grad()
def toy_accuracy(
    model: Any,
    tokenizer: Any,
    problems: list[Any],
    *,
    temperature: float = 0.0,
    max_new_tokens: int = 96,
    template: str = "qwen-math",
    batch_size: int = 100,
    seed: int = 0,
) -> float:
    """Share of `problems` whose completion passes `synthetic.check` (greedy when temperature is 0,
    else plain sampling with top_p 1): a quick measurement for the build report, not the trainer's eval."""

    sampling = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}
    correct = 0
    for chunk, prompt_len, out in _generate_chunks(
        model,
        tokenizer,
        problems,
        template=template,
        batch_size=batch_size,
        seed=seed,
        max_new_tokens=max_new_tokens,
        **(sampling if temperature > 0 else {"do_sample": False}),
    ):
        texts = tokenizer.batch_decode(out[:, prompt_len:], skip_special_tokens=True)
        correct += sum(check(p, t) for p, t in zip(chunk, texts))
    return correct / max(1, len(problems))


def build_toy(
    out_dir: str | Path | None = None, config: WarmStartConfig | None = None, *, log_every: int = 0
) -> Path:
    """Build the toy model (a fresh init, or the shipped warm start `config.init`, then the warm start) and save model + tokenizer to `out_dir`
    (default: the package's asset directory). Returns the directory."""
    cfg = config or WarmStartConfig()
    out = Path(out_dir) if out_dir is not None else TOY_ASSET_DIR
    tok = build_toy_tokenizer()
    if cfg.init:  # continue from a shipped warm start (its tokenizer and architecture are the toy's)
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(toy_variant(cfg.init).asset_dir, dtype=torch.float32)
    else:
        model = build_toy_model(cfg.model, seed=cfg.seed, tokenizer=tok)
    warm_start(model, tok, cfg, log_every=log_every)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "warm_start.json").write_text(json.dumps(asdict(cfg), indent=2, sort_keys=True) + "\n")
    return out


@torch.no_grad()
def tail_report(
    model: Any,
    tokenizer: Any,
    problems: list[Any],
    tail: int,
    *,
    max_new_tokens: int,
    template: str = "qwen-math",
    batch_size: int = 50,
    seed: int = 0,
) -> dict[str, float]:
    """What a toy-tail warm start does after the answer, from one sampled completion (temperature 1) per
    problem: ``tail_entropy``, the mean per-token entropy (nats, full vocabulary) of the tokens labelled
    "tail" (`synthetic.label_chars`: the line break and the letters); ``letter_entropy``, the same over the
    letters only (ln of `TAIL_ALPHABET`'s size at most); ``tail_len_mean`` and ``exact_len``, the mean
    number of tail letters and the share of completions with exactly `tail`; ``after_tail``, the share
    with anything but EOS after the tail, ``box_after`` with a box after it (what a reward could read, so
    the one way a tail token's exact advantage could differ from 0); ``truncated``, the share that hit
    `max_new_tokens`;
    ``longest``, the longest completion in tokens with EOS. For the build report, not the trainer."""
    from tokencredit.data.synthetic import label_chars

    ent_sum = letter_sum = 0.0
    ent_n = letter_n = 0
    lens: list[int] = []
    after = box_after = truncated = 0
    longest = 0
    for chunk, prompt_len, out in _generate_chunks(
        model,
        tokenizer,
        problems,
        template=template,
        batch_size=batch_size,
        seed=seed,
        max_new_tokens=max_new_tokens,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        output_scores=True,
        return_dict_in_generate=True,
    ):
        gen = out.sequences[:, prompt_len:]
        logp = torch.stack(out.scores, dim=1).float().log_softmax(-1)  # [B, T, V]
        entropy = -(logp.exp() * logp).sum(-1)
        for i, p in enumerate(chunk):
            ids = gen[i].tolist()
            n = ids.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in ids else len(ids)
            truncated += tokenizer.eos_token_id not in ids
            longest = max(longest, n)
            pieces = [
                tokenizer.decode([t]) for t in ids[: n - 1 if ids[n - 1] == tokenizer.eos_token_id else n]
            ]
            text = "".join(pieces)
            labels = label_chars(p, text)
            pos, letters, end = 0, 0, 0
            for j, piece in enumerate(pieces):  # the toy tokenizer: one character per token
                lab = labels[pos : pos + len(piece)]
                if lab and all(x == "tail" for x in lab):
                    ent_sum += float(entropy[i, j])
                    ent_n += 1
                    if piece != "\n":
                        letter_sum += float(entropy[i, j])
                        letter_n += 1
                        letters += 1
                    end = pos + len(piece)
                pos += len(piece)
            lens.append(letters)
            after += bool(letters) and bool(text[end:].strip())
            box_after += bool(letters) and "boxed" in text[end:]
    n_rows = max(1, len(problems))
    return {
        "tail_entropy": ent_sum / max(1, ent_n),
        "letter_entropy": letter_sum / max(1, letter_n),
        "tail_len_mean": sum(lens) / n_rows,
        "exact_len": sum(x == tail for x in lens) / n_rows,
        "after_tail": after / n_rows,
        "box_after": box_after / n_rows,
        "truncated": truncated / n_rows,
        "longest": float(longest),
    }

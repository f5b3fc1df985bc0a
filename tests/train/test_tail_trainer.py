"""The trainer on a task with a reward-irrelevant tail: it builds each batch's tail mask from the task's
labels, logs the tail's entropy, and trains the tail-mask arm (algo.zero_tail) with zero credit there."""

from __future__ import annotations

import json

import pytest
import torch

from tokencredit.data.synthetic import label_chars
from tokencredit.errors import ConfigError
from tokencredit.train.config import load_config
from tokencredit.train.trainer import Trainer

SMALL = [
    "run.steps=1",
    "run.progress=false",
    "run.threads=1",
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "data.train_size=20",
    "data.eval_size=2",
    "eval.samples=0",
    "eval.at_start=false",
    "eval.save_groups=2",
    "checkpoint.every=0",
    "algo.zero_tail=true",
]


def saved_tails(run) -> list[tuple[dict, list[bool]]]:
    """Each completion saved at step 1 with its tail positions, from the task's labels (the toy tokenizer:
    one character per token, EOS last when the completion ended)."""
    out = []
    for g in map(json.loads, (run / "rollouts" / "step_000001.jsonl").read_text().splitlines()):
        for c in g["completions"]:
            chars = [t if len(t) == 1 else "" for t in c["tokens"]]
            labels = label_chars(g["problem"], "".join(chars))
            out.append((c, [lab == "tail" for lab in labels] + [False] * (len(chars) - len(labels))))
    return out


def test_zero_tail_on_a_task_without_a_tail_is_one_config_error(tmp_path) -> None:
    cfg = load_config(sets=SMALL)
    with pytest.raises(
        ConfigError, match=r"^algo.zero_tail: data.train = 'toy' has no reward-irrelevant tail"
    ):
        Trainer(cfg, tmp_path / "run")


def test_the_tail_mask_arm_trains_zero_credit_on_the_tail_and_logs_its_entropy(tmp_path) -> None:
    """One GRPO step with algo.zero_tail from the shipped toy-tail-32: every saved tail token has Â = 0,
    every other token GRPO's A, and the step logs the tail's size and entropy."""
    trainer = Trainer(load_config("toy-tail-32", sets=SMALL, recipe="grpo"), tmp_path / "run")
    trainer.fit()
    step = next(json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
    assert step["tail/tokens"] > 20  # the warm start writes its 32-letter tail (and its line break)
    assert 1.0 < step["tail/entropy"] < 3.0  # near ln 8 = 2.08 nats a letter
    tail_credit, graded_tails = [], 0
    for c, tail in saved_tails(tmp_path / "run"):
        for on, adv in zip(tail, c["token_advantages"]):
            if on:
                tail_credit.append(adv)
            else:
                assert adv == pytest.approx(c["advantage"])  # GRPO's A off the tail
        graded_tails += any(tail) and c["advantage"] != 0
    assert graded_tails > 0  # tails that GRPO would have credited with A != 0
    assert tail_credit and all(a == 0 for a in tail_credit)


def test_the_oracle_gives_the_tail_its_known_zero_without_sampling_it(tmp_path, monkeypatch) -> None:
    """The oracle recipe on toy-tail-32 hands the task's tail to the Monte-Carlo values as known zeros
    (`token_advantages` gives them A* = 0 without sampling: tests/oracle): the mask it passes is the labels'
    tail, token for token, and A* is exactly 0 on every saved tail token."""
    import tokencredit.train.trainer as trainer_module

    passed, real = [], trainer_module.mc_signals

    def spy(*args, **kwargs):
        passed.append(kwargs.get("known_zero"))
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "mc_signals", spy)
    sets = [s for s in SMALL if s != "algo.zero_tail=true"] + ["oracle.k=2"]
    trainer = Trainer(load_config("toy-tail-32", sets=sets, recipe="oracle"), tmp_path / "run")
    trainer.fit()
    saved = saved_tails(tmp_path / "run")
    tail_credit = [a for c, tail in saved for on, a in zip(tail, c["token_advantages"]) if on]
    tail_tokens = sum(sum(tail) for _, tail in saved)
    (known,) = passed  # one step, one call
    assert known is not None and known.dtype == torch.bool
    # every rollout is saved (2 groups of 4), each tail over 20 tokens
    assert int(known.sum()) == tail_tokens > 20 * 8
    assert tail_credit and all(a == 0 for a in tail_credit)

"""The toy-tail warm starts (toy-tail-32, toy-tail-128): registered, shipped, within their budget, and
sampling their tails with high entropy."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from tokencredit import cli, models
from tokencredit.data.synthetic import TAIL_ALPHABET, ArithmeticTask
from tokencredit.models import load_model
from tokencredit.models.toy import TOY_TAIL_LENGTHS
from tokencredit.models.warm_start import tail_report
from tokencredit.tasks import tail_task
from tokencredit.train.config import load_config

TAILS = [f"toy-tail-{m}" for m in TOY_TAIL_LENGTHS]


@pytest.mark.parametrize("name", TAILS)
def test_tail_variant_ships_and_its_budget_holds_solution_tail_and_eos(name: str) -> None:
    v = models.toy_variant(name)
    m = v.config.tail
    assert name == f"toy-tail-{m}" and f"--task {name}" in v.rebuild_command
    assert v.config.init == "toy" and v.config.model == {}  # the toy's size, continued from its weights
    files = {p.name: p.stat().st_size for p in v.asset_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "warm_start.json"} <= files.keys()
    assert files["model.safetensors"] == (models.TOY_ASSET_DIR / "model.safetensors").stat().st_size
    assert json.loads((v.asset_dir / "warm_start.json").read_text()) == dataclasses.asdict(v.config)
    task = models.toy_task(seed=1, name=name)
    assert task.tail == m and (task.difficulty, task.digits, task.phrasings) == (3, 2, 0)
    # the same problems as the default toy task: the tail is the only difference
    assert [p.problem for p in task.sample(20)] == [p.problem for p in models.toy_task(seed=1).sample(20)]
    # every solution (character-level tokens), its line break, m letters and EOS fit the rollout budget
    longest = max(len(p.solution) + 1 for p in task.sample(500, "train"))
    assert longest == max(len(p.solution) + 1 for p in models.toy_task().sample(500, "train")) + 1 + m
    assert longest <= v.max_new_tokens
    # its config file trains it with that budget
    cfg = load_config(name)
    assert (cfg.model.name, cfg.data.train, cfg.data.eval) == (name, name, name)
    assert cfg.rollout.max_new_tokens == v.max_new_tokens
    assert tail_task(name, cfg.data) is not None and tail_task(name, cfg.data).tail == m  # type: ignore[union-attr]


def test_m_zero_is_the_default_toy() -> None:
    cfg = load_config()
    assert tail_task("toy", cfg.data) is None and tail_task("toy-free", cfg.data) is None
    assert tail_task("gsm8k", cfg.data) is None
    plain = models.toy_task(seed=2)
    assert plain.tail == 0 and repr(plain) == repr(ArithmeticTask(seed=2, tail=0))


def test_tail_warm_start_samples_its_tail_with_high_entropy_and_leaves_room() -> None:
    """The shipped toy-tail-32 writes its tail from the whole alphabet with nearly uniform letters (the
    build measured about ln 8 nats a letter on 200 held-out problems), and stops near m letters."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        v = models.toy_variant("toy-tail-32")
        model, tok = load_model("toy-tail-32")
        probs = models.toy_task(name="toy-tail-32").sample(16, "heldout")
        r = tail_report(model, tok, probs, 32, max_new_tokens=v.max_new_tokens)
        acc = models.toy_accuracy(model, tok, probs, temperature=0.0, max_new_tokens=v.max_new_tokens)
    finally:
        torch.set_num_threads(threads)
    assert r["letter_entropy"] > 0.8 * math.log(len(TAIL_ALPHABET)), r
    assert abs(r["tail_len_mean"] - 32) < 4 and r["truncated"] == 0, r
    assert 0.1 <= acc <= 0.85, acc


def test_build_toy_cli_tail_variant(tmp_path) -> None:
    threads = torch.get_num_threads()
    try:
        args = ["build-toy", "--task", "toy-tail-32", "--out", str(tmp_path), "--steps", "1", "--eval", "0"]
        assert cli.main(args) == 0
    finally:
        torch.set_num_threads(threads)
    built = json.loads((tmp_path / "warm_start.json").read_text())
    assert built["tail"] == 32 and built["init"] == "toy" and built["steps"] == 1
    assert models.toy_task(path=tmp_path / "warm_start.json").tail == 32

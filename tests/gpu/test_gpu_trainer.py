"""A LoRA trainer step on the device: the tiny toy model, 2 prompts x 4 completions, float32 and bf16.

Two steps of `Trainer.step` with run.device set to the device: every parameter stays on it, the record is
finite, the LoRA adapter's weights move and the base weights do not (recipe grpo, one update per step;
and delta, whose hidden-state signals take the separate old-policy pass).
"""

from __future__ import annotations

import math

import pytest
import torch
from _gpu import DEVICE, MARKS

pytestmark = MARKS


def _trainer(model_dir: str, run_dir, dtype: str, recipe: str):
    from rich.console import Console

    from tokencredit.train.config import TrainConfig
    from tokencredit.train.trainer import Trainer

    cfg = TrainConfig()
    cfg.run.steps, cfg.run.device, cfg.run.threads, cfg.run.progress = 2, DEVICE.type, 2, False
    cfg.run.out_dir = str(run_dir.parent)
    cfg.model.name, cfg.model.dtype, cfg.model.lora_rank, cfg.model.lora_alpha = model_dir, dtype, 4, 8.0
    cfg.data.difficulty, cfg.data.train_size, cfg.data.eval_size = 1, 40, 3
    r = cfg.rollout
    r.prompts_per_step, r.group_size, r.max_new_tokens, r.max_resample_rounds = 2, 4, 12, 1
    cfg.optim.lr, cfg.optim.warmup_steps = 1e-2, 0
    cfg.eval.every, cfg.eval.at_start, cfg.checkpoint.every = 0, False, 0
    cfg.reward.function = "_toy_rewards:has_digit_seven"
    cfg.algo.recipe = recipe
    return Trainer(cfg, run_dir, console=Console(quiet=True))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("recipe", ["grpo", "delta"])
def test_lora_steps_on_the_device(tiny_model_dir, toy_rewards, tmp_path, dtype, recipe):
    trainer = _trainer(tiny_model_dir, tmp_path / "run", dtype, recipe)
    try:
        params = dict(trainer.model.named_parameters())
        assert all(p.device.type == DEVICE.type for p in params.values())
        lora = {n: p.detach().clone() for n, p in params.items() if p.requires_grad}
        base = {n: p.detach().clone() for n, p in params.items() if not p.requires_grad}
        assert lora and all("lora_" in n for n in lora)
        for step in range(2):
            rec = trainer.step(step).record
            assert rec["rollouts"] == 8, rec
            for key in ("grad_norm", "entropy", "time_update"):
                assert math.isfinite(float(rec[key])), (key, rec[key])
    finally:
        trainer.reward_fn.close()
    params = dict(trainer.model.named_parameters())
    assert all(p.device.type == DEVICE.type for p in params.values())
    assert any(not torch.equal(params[n].detach(), v) for n, v in lora.items()), "the adapter did not move"
    assert all(torch.equal(params[n].detach(), v) for n, v in base.items()), "a frozen base weight moved"
    assert {p.dtype for n, p in params.items() if not p.requires_grad} == {getattr(torch, dtype)}

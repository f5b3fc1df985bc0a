"""bf16 signals and credit on the device (CUDA; TOKENCREDIT_TEST_DEVICE=cpu for the CPU).

A tiny random Qwen3 with a LoRA adapter (random B, so the adapter changes the hidden states) gives the
per-token signals of `tokencredit.signals.compute_signals` in bf16 on the device; the reference is the
same weights (rounded to bf16) in float32 on the CPU. The credit of several recipes is then computed
from the device's signals on the device and from the same signals on the CPU (same inputs: equal to
1e-5), and from the float32 reference signals (bf16 against float32: within a few bf16 roundings).
"""

from __future__ import annotations

import copy

import pytest
import torch
from _gpu import DEVICE, MARKS

from conftest import byte_tokenizer, tiny_qwen3
from tokencredit import diagnostics, models
from tokencredit.batch import RolloutBatch
from tokencredit.recipes import token_credit
from tokencredit.signals import compute_signals

pytestmark = MARKS

N, P, T = 8, 6, 10
NEEDS = {"old_log_probs", "entropy", "hidden", "base_hidden", "base_log_probs"}
# Largest error of bf16 against float32 allowed: observed on the CPU about 5x below these (log-probs
# 3e-3, entropy 3e-5, hidden 1.7% of its largest value); a shifted position or a dropped adapter is O(1).
TOL = {"old_log_probs": 0.02, "base_log_probs": 0.02, "entropy": 0.01, "hidden": 0.05, "base_hidden": 0.05}
RECIPES = ("grpo", "dapo+ktae", "delta", "arca", "surprisal", "entropy-80-20", "strace")
SMOOTH = (
    "delta",
    "arca",
    "surprisal",
)  # credit continuous in the signals (a top-k set can flip on a near-tie)


def _model() -> torch.nn.Module:
    tok = byte_tokenizer()
    model = models.add_lora(tiny_qwen3(len(tok)), rank=4, alpha=8.0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.2, generator=gen)
    return model.to(torch.bfloat16).float()  # weights exactly representable in bf16


def _rows(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids [N, P+T], attention [N, P+T], response mask [N, T]): left-padded prompts, right-padded responses."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(2, vocab, (N, P + T), generator=gen)
    prompt_len = torch.randint(2, P + 1, (N,), generator=gen)
    response_len = torch.randint(1, T + 1, (N,), generator=gen)
    response_len[0] = T
    mask = torch.arange(T)[None, :] < response_len[:, None]
    att = torch.cat([(torch.arange(P)[None, :] >= P - prompt_len[:, None]), mask], 1).long()
    return ids, att, mask


@pytest.fixture(scope="module")
def signals() -> dict[str, object]:
    model = _model()
    ids, att, mask = _rows(model.config.vocab_size)
    ref = compute_signals(model, ids, att, P, mask, NEEDS)
    dev_model = copy.deepcopy(model).to(DEVICE, torch.bfloat16)
    got = compute_signals(dev_model, ids.to(DEVICE), att.to(DEVICE), P, mask.to(DEVICE), NEEDS)
    return {"ids": ids, "mask": mask, "ref": ref, "got": got}


@pytest.mark.parametrize("name", sorted(NEEDS))
def test_bf16_signals_match_float32(signals, name):
    ref, got, mask = signals["ref"][name], signals["got"][name], signals["mask"]
    assert got.device.type == DEVICE.type and got.dtype == torch.float32  # statistics in float32
    assert got.shape == ref.shape
    got = got.cpu()
    valid = mask[..., None] if got.dim() == 3 else mask
    assert torch.all(got.masked_select(~valid.expand_as(got)) == 0), "masked positions must be exactly 0"
    err = (got - ref).abs()
    limit = TOL[name] * (float(ref.abs().max()) if "hidden" in name else 1.0)
    assert float(err.max()) < limit, (name, float(err.max()), limit)
    assert float(err.mean()) < limit / 5, (name, float(err.mean()))


def _batch(signals: dict[str, object], which: str, device: torch.device) -> RolloutBatch:
    scores = torch.tensor([1.0, 0, 0, 1, 0, 1, 1, 0])
    group_ids = torch.arange(N) // 4
    values = {k: v.to(device) for k, v in signals[which].items()}
    return RolloutBatch(
        signals["ids"][:, P:].to(device),
        signals["mask"].to(device),
        group_ids.to(device),
        scores.to(device),
        **values,
    )


@pytest.mark.parametrize("recipe", RECIPES)
def test_credit_on_the_device_equals_the_cpu(signals, recipe):
    on_device = token_credit(recipe, _batch(signals, "got", DEVICE)).token_advantages
    on_cpu = token_credit(recipe, _batch(signals, "got", torch.device("cpu"))).token_advantages
    assert on_device.device.type == DEVICE.type and on_device.dtype == torch.float32
    assert bool(on_cpu.abs().max() > 0), recipe  # a batch whose credit is not all zero
    torch.testing.assert_close(on_device.cpu(), on_cpu, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("recipe", SMOOTH)
def test_credit_of_bf16_signals_matches_float32(signals, recipe):
    got = token_credit(recipe, _batch(signals, "got", DEVICE)).token_advantages.cpu()
    ref = token_credit(recipe, _batch(signals, "ref", torch.device("cpu"))).token_advantages
    err = float((got - ref).abs().max())
    assert err < 0.02 * float(ref.abs().max()), (recipe, err)  # observed ~0.3% on the CPU


def test_credit_diagnostics_on_the_device_equal_the_cpu(signals):
    """Every per-step diagnostic (Gini, EffN/T, sign flips, entropy quadrants) and the rank correlation,
    computed on the device, equals the CPU's: no helper tensor is made on the CPU beside device inputs (the
    first run on an H100 found Gini's position index on the CPU)."""
    cpu = torch.device("cpu")
    credit = {d: token_credit("dapo+ktae", _batch(signals, "got", d)) for d in (DEVICE, cpu)}
    batch = {d: _batch(signals, "got", d) for d in (DEVICE, cpu)}
    got, ref = (
        diagnostics.summary(
            credit[d].token_advantages,
            credit[d].mask,
            credit[d].seq_advantages,
            batch[d].entropy,
        )
        for d in (DEVICE, cpu)
    )
    assert got.keys() == ref.keys() and "credit_gini" in got
    for key in got:
        assert got[key] == pytest.approx(ref[key], abs=1e-6), key
    rho = {
        d: diagnostics.rank_correlation(credit[d].token_advantages, batch[d].entropy, credit[d].mask)
        for d in (DEVICE, cpu)
    }
    torch.testing.assert_close(rho[DEVICE].cpu(), rho[cpu])

"""The shared-prompt forward (tokencredit.signals.prefix) against the plain [N, P+T] forward it replaces.

"plain" is the same code with the sharing switched off (`_full_attention_cache` patched to None), i.e.
the path every signal and the training forward took before: log-probs, entropy, hidden states, the
loss and every parameter gradient must agree to float rounding (fp32) or bf16 rounding.
"""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model

import tokencredit.signals.prefix as prefix
from conftest import tiny_qwen3
from tokencredit.signals import compute_signals, token_log_probs
from tokencredit.signals.prefix import distinct_prompts

VOCAB = 150
P, T = 9, 7
# three prompts of 9, 4 and 6 tokens (left-padded), four rollouts each, the groups interleaved
PROMPT_OF_ROW = [0, 0, 1, 0, 2, 1, 1, 2, 0, 2, 1, 2]
PROMPT_LENS = [9, 4, 6]
RESP_LENS = [7, 3, 0, 5, 1, 7, 2, 6, 4, 7, 5, 1]  # a full row, a one-token row and an empty row


def grouped_batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[12, P+T] rows of three shared left-padded prompts and random right-padded responses (pad id 0)."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1, VOCAB, (len(PROMPT_LENS), P), generator=g)
    seq = torch.cat(
        [prompts[PROMPT_OF_ROW], torch.randint(1, VOCAB, (len(PROMPT_OF_ROW), T), generator=g)], 1
    )
    am = torch.zeros_like(seq)
    for i, (k, rl) in enumerate(zip(PROMPT_OF_ROW, RESP_LENS)):
        am[i, P - PROMPT_LENS[k] : P + rl] = 1
    return seq.masked_fill(am == 0, 0), am, am[:, P:].bool()


class CountForwards:
    """Decoder calls inside the block (the shared path makes two per pass: the prompts, then the rows)."""

    def __init__(self, model: torch.nn.Module) -> None:
        core = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.n = 0
        self.handle = core.model.register_forward_pre_hook(self._hook)

    def _hook(self, module, args) -> None:
        self.n += 1

    def __enter__(self) -> CountForwards:
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()


def training_forward(model, seq, am, p, rm, *, shared: bool, monkeypatch) -> tuple:
    """(log_p, entropy, loss, {name: grad}, decoder calls) of the training forward, shared or plain."""
    with monkeypatch.context() as m:
        if not shared:
            m.setattr(prefix, "_full_attention_cache", lambda decoder: None)
        model.zero_grad(set_to_none=True)
        with CountForwards(model) as calls:
            log_p, ent = token_log_probs(model, seq, am, p, response_mask=rm, with_entropy=True)
        weights = torch.linspace(-1.0, 1.0, rm.numel()).view_as(rm) * rm
        loss = (log_p * weights).sum() / rm.sum() + 0.1 * (ent * rm).sum() / rm.sum()
        loss.backward()
    grads = {n: q.grad.detach().clone() for n, q in model.named_parameters() if q.requires_grad}
    return log_p.detach(), ent.detach(), float(loss.detach()), grads, calls.n


def assert_same_training_forward(
    model, seq, am, p, rm, monkeypatch, rtol: float, atol: float, shared_calls: int = 2
) -> None:
    """`shared_calls`: 2 (the distinct prompts, then the rows) or 3 (their common beginning, each prompt's
    rest, the rows)."""
    shared = training_forward(model, seq, am, p, rm, shared=True, monkeypatch=monkeypatch)
    plain = training_forward(model, seq, am, p, rm, shared=False, monkeypatch=monkeypatch)
    assert (shared[4], plain[4]) == (shared_calls, 1)  # the shared path ran, and the plain one did not share
    torch.testing.assert_close(shared[0], plain[0], rtol=rtol, atol=atol)
    torch.testing.assert_close(shared[1], plain[1], rtol=rtol, atol=atol)
    assert shared[2] == pytest.approx(plain[2], rel=rtol, abs=atol)
    assert shared[3].keys() == plain[3].keys() and shared[3]
    for name, g in plain[3].items():
        scale = float(g.abs().max()) or 1.0
        torch.testing.assert_close(shared[3][name], g, rtol=rtol, atol=atol * scale, msg=name)
    assert bool((shared[0][~rm] == 0).all()) and bool((shared[1][~rm] == 0).all())


def test_distinct_prompts_groups_rows_by_ids_and_padding():
    seq, am, _ = grouped_batch()
    first, rows = distinct_prompts(seq, am, 0, P - 1)
    assert first.tolist() == [0, 2, 4]  # distinct prompts in order of their first row
    assert rows.tolist() == PROMPT_OF_ROW
    # the same ids under another padding are another prompt
    am2 = am.clone()
    am2[1, : P - PROMPT_LENS[0] + 2] = 0
    first2, rows2 = distinct_prompts(seq, am2, 0, P - 1)
    assert len(first2) == 4 and rows2[1] != rows2[0]


def test_shared_prompt_training_forward_equals_the_plain_one_fp32(monkeypatch):
    model = tiny_qwen3(VOCAB, max_position_embeddings=64, tie_word_embeddings=False).train()
    seq, am, rm = grouped_batch()
    assert_same_training_forward(model, seq, am, P, rm, monkeypatch, rtol=1e-5, atol=1e-6)


def test_shared_prompt_training_forward_with_lora(monkeypatch):
    model = tiny_qwen3(VOCAB, max_position_embeddings=64, tie_word_embeddings=False)
    cfg = LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "up_proj"]
    )
    model = get_peft_model(model, cfg)
    for name, q in model.named_parameters():  # LoRA B starts at 0: move it so the adapter matters
        if "lora_B" in name:
            torch.nn.init.normal_(q, std=0.2, generator=torch.Generator().manual_seed(len(name)))
    model.train()
    seq, am, rm = grouped_batch()
    assert_same_training_forward(model, seq, am, P, rm, monkeypatch, rtol=1e-5, atol=1e-6)


def test_shared_prompt_training_forward_bf16(monkeypatch):
    model = (
        tiny_qwen3(VOCAB, max_position_embeddings=64, tie_word_embeddings=False).to(torch.bfloat16).train()
    )
    seq, am, rm = grouped_batch()
    shared = training_forward(model, seq, am, P, rm, shared=True, monkeypatch=monkeypatch)
    plain = training_forward(model, seq, am, P, rm, shared=False, monkeypatch=monkeypatch)
    assert (shared[4], plain[4]) == (2, 1)
    # bf16 keeps 8 bits of mantissa: the two paths may round hidden states differently (a relative
    # 2**-8 per rounding), the log-probs after the float32 head agree to a few hundredths
    torch.testing.assert_close(shared[0], plain[0], rtol=0.02, atol=0.05)
    torch.testing.assert_close(shared[1], plain[1], rtol=0.02, atol=0.05)
    for name, g in plain[3].items():
        cos = torch.nn.functional.cosine_similarity(
            shared[3][name].float().flatten(), g.float().flatten(), dim=0
        )
        assert float(cos) > 0.99, name


def test_the_shipped_toy_model_on_a_qwen_math_batch(monkeypatch):
    """The default run's shape: "qwen-math" prompts of 121-122 tokens (left-padded), G = 4 samples each."""
    from tokencredit.data.templates import render
    from tokencredit.models import load_model, toy_task

    model, tok = load_model("toy")
    # held-out problems 3 and 4 have prompts of 122 and 121 tokens
    problems = toy_task(0).sample(5, "heldout")[2:5]
    enc = tok([render("qwen-math", p.problem, tok) for p in problems], return_tensors="pt", padding=True)
    assert len(set(enc["attention_mask"].sum(1).tolist())) == 2
    g = torch.Generator().manual_seed(0)
    rows = torch.arange(3).repeat_interleave(4)
    resp = torch.randint(3, tok.vocab_size, (12, 20), generator=g)
    rmask = torch.arange(20)[None] < torch.tensor([20, 5, 13, 1, 20, 17, 9, 2, 20, 11, 7, 15])[:, None]
    seq = torch.cat([enc["input_ids"][rows], resp.masked_fill(~rmask, tok.pad_token_id)], 1)
    am = torch.cat([enc["attention_mask"][rows], rmask.long()], 1)
    p = enc["input_ids"].shape[1]
    model.train()
    # The 94 tokens of the template before the problem run once: three calls.
    assert prefix.common_prefix(enc["input_ids"][:, :-1], enc["attention_mask"][:, :-1]) >= prefix.MIN_COMMON
    assert_same_training_forward(model, seq, am, p, rmask, monkeypatch, rtol=1e-5, atol=1e-5, shared_calls=3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_common_beginning_with_lora_and_uneven_rests(monkeypatch, dtype):
    """Prompts that share a 20-token beginning and differ after it by 1 to 6 tokens (so the rests are
    left-padded to different lengths), LoRA on: values and gradients as the plain forward's."""
    model = tiny_qwen3(VOCAB, max_position_embeddings=64, tie_word_embeddings=False)
    model = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    )
    for name, q in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(q, std=0.2, generator=torch.Generator().manual_seed(len(name)))
    model = model.to(dtype).train()
    g = torch.Generator().manual_seed(3)
    head = torch.randint(1, VOCAB, (20,), generator=g)
    rests = [torch.randint(1, VOCAB, (k,), generator=g) for k in (6, 1, 3)]
    width = 20 + 6
    prompts = torch.zeros(3, width, dtype=torch.long)
    for i, r in enumerate(rests):
        prompts[i, width - 20 - len(r) :] = torch.cat([head, r])
    rows = torch.tensor([0, 1, 2, 1, 0, 2, 2, 1])
    resp_len = torch.tensor([5, 1, 4, 0, 5, 2, 3, 5])
    rm = torch.arange(5)[None] < resp_len[:, None]
    seq = torch.cat([prompts[rows], torch.randint(1, VOCAB, (8, 5), generator=g).masked_fill(~rm, 0)], 1)
    am = torch.cat([(prompts[rows] != 0).long(), rm.long()], 1)
    if dtype == torch.float32:
        assert_same_training_forward(
            model, seq, am, width, rm, monkeypatch, rtol=1e-5, atol=1e-6, shared_calls=3
        )
        return
    shared = training_forward(model, seq, am, width, rm, shared=True, monkeypatch=monkeypatch)
    plain = training_forward(model, seq, am, width, rm, shared=False, monkeypatch=monkeypatch)
    assert (shared[4], plain[4]) == (3, 1)
    torch.testing.assert_close(shared[0], plain[0], rtol=0.02, atol=0.05)  # as in the bf16 test above
    for name, grad in plain[3].items():
        cos = torch.nn.functional.cosine_similarity(
            shared[3][name].float().flatten(), grad.float().flatten(), dim=0
        )
        assert float(cos) > 0.99, name


def test_compute_signals_share_the_prompt_in_every_pass(monkeypatch):
    """Old-policy, adapter-disabled (base + reference) passes, in micro-batches that cut groups."""
    model = tiny_qwen3(VOCAB, max_position_embeddings=64, tie_word_embeddings=False)
    model = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.3, target_modules=["q_proj", "v_proj"])
    )
    for name, q in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(q, std=0.2, generator=torch.Generator().manual_seed(len(name)))
    seq, am, rm = grouped_batch()
    needs = {
        "old_log_probs",
        "entropy",
        "hidden",
        "sum_sq_probs",
        "base_hidden",
        "base_log_probs",
        "ref_log_probs",
    }
    out = {}
    for shared in (True, False):
        with monkeypatch.context() as m:
            if not shared:
                m.setattr(prefix, "_full_attention_cache", lambda decoder: None)
            with CountForwards(model) as calls:
                out[shared] = compute_signals(model, seq, am, P, rm, needs, batch_size=5)
        # 3 micro-batches (rows 0-4, 5-9, 10-11) x 2 passes; shared: 2 calls for each of the first two
        # (each repeats a prompt), 1 for the last (prompts 1 and 2, one row each: nothing to share)
        assert calls.n == (10 if shared else 6)
    for name in needs:
        torch.testing.assert_close(out[True][name], out[False][name], rtol=1e-5, atol=1e-6, msg=name)


def test_dropout_and_gradient_checkpointing_keep_the_plain_forward():
    seq, am, rm = grouped_batch()
    lora = get_peft_model(
        tiny_qwen3(VOCAB, max_position_embeddings=64),
        LoraConfig(r=4, lora_alpha=8, lora_dropout=0.2, target_modules=["q_proj", "v_proj"]),
    )
    attn_dropout = tiny_qwen3(VOCAB, max_position_embeddings=64, attention_dropout=0.1)
    checkpointed = tiny_qwen3(VOCAB, max_position_embeddings=64)
    checkpointed.gradient_checkpointing_enable()
    for model in (lora, attn_dropout, checkpointed):
        model.train()
        with CountForwards(model) as calls:
            token_log_probs(model, seq, am, P, response_mask=rm).sum().backward()
        assert calls.n == 1, type(model).__name__
        model.eval()  # eval mode: no dropout, and the checkpointing is off, so the prompts are shared
        with torch.no_grad(), CountForwards(model) as calls:
            token_log_probs(model, seq, am, P, response_mask=rm)
        assert calls.n == 2


def test_sliding_window_layers_and_unshared_prompts_keep_the_plain_forward():
    seq, am, rm = grouped_batch()
    sliding = tiny_qwen3(
        VOCAB,
        max_position_embeddings=64,
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=0,
        layer_types=["sliding_attention", "sliding_attention"],
    )
    with torch.no_grad(), CountForwards(sliding) as calls:
        token_log_probs(sliding, seq, am, P, response_mask=rm)
    assert calls.n == 1
    model = tiny_qwen3(VOCAB, max_position_embeddings=64)
    one_each = [0, 4, 2]  # three rows, three different prompts
    with torch.no_grad(), CountForwards(model) as calls:
        token_log_probs(model, seq[one_each], am[one_each], P, response_mask=rm[one_each])
    assert calls.n == 1

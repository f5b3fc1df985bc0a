"""tokencredit.signals on a tiny random Qwen3 (+ peft LoRA), against a naive full-vocabulary computation."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen3ForCausalLM

from conftest import tiny_qwen3
from tokencredit.batch import SIGNALS
from tokencredit.errors import ConfigError
from tokencredit.signals import chunked_log_probs, compute_signals, has_lora_adapter, token_log_probs

VOCAB = 150
P, T = 6, 9
PROMPT_LENS = [6, 3, 5, 1, 4]
RESP_LENS = [9, 4, 1, 7, 0]  # includes a full row, a one-token row and an empty row


def tiny_model(seed: int = 0) -> Qwen3ForCausalLM:
    return tiny_qwen3(VOCAB, seed, max_position_embeddings=64, tie_word_embeddings=False)


def tiny_lora(seed: int = 0):
    # dropout > 0 so that a pass left in train mode would be visibly non-deterministic
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.2, target_modules=["q_proj", "v_proj", "up_proj"])
    return get_peft_model(tiny_model(seed), cfg)


def make_batch(prompt_lens=PROMPT_LENS, resp_lens=RESP_LENS, p=P, t=T, seed=1):
    g = torch.Generator().manual_seed(seed)
    n = len(prompt_lens)
    seq = torch.randint(1, VOCAB, (n, p + t), generator=g)
    am = torch.zeros(n, p + t, dtype=torch.long)
    for i, (pl, rl) in enumerate(zip(prompt_lens, resp_lens)):
        am[i, p - pl : p + rl] = 1
    seq = seq.masked_fill(am == 0, 0)  # pad id 0
    return seq, am, am[:, p:].bool()


def naive(model, seq, am, p, rmask, temperature=1.0):
    """Full [N, T, V] log_softmax from a plain forward (position ids as generate() builds them)."""
    pos = (am.cumsum(-1) - 1).clamp(min=0) * am
    out = model(input_ids=seq, attention_mask=am, position_ids=pos, output_hidden_states=True)
    logp_all = torch.log_softmax(out.logits[:, p - 1 : -1].float() / temperature, -1)
    lp = logp_all.gather(-1, seq[:, p:, None]).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    hid = out.hidden_states[-1][:, p - 1 : -1].float()
    m = rmask.float()
    return lp * m, ent * m, hid * m[..., None]


def decoder_of(model):
    core = model.get_base_model() if hasattr(model, "get_base_model") else model
    return core.model


class CountForwards:
    def __init__(self, model):
        self.n = 0
        self.handle = decoder_of(model).register_forward_pre_hook(self._hook)

    def _hook(self, module, args):
        self.n += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


# --------------------------------------------------------------------------- values
@pytest.mark.parametrize("chunk_size", [1, 4, 7, 10_000])
@pytest.mark.parametrize("batch_size", [None, 2])
def test_chunked_log_probs_and_entropy_match_naive(chunk_size, batch_size):
    model = tiny_model()
    seq, am, rm = make_batch()
    for temperature in (1.0, 0.7):
        got = compute_signals(
            model,
            seq,
            am,
            P,
            rm,
            {"old_log_probs", "entropy"},
            temperature=temperature,
            chunk_size=chunk_size,
            batch_size=batch_size,
        )
        with torch.no_grad():
            lp, ent, _ = naive(model, seq, am, P, rm, temperature)
        assert set(got) == {"old_log_probs", "entropy"}
        for name, want in (("old_log_probs", lp), ("entropy", ent)):
            v = got[name]
            assert v.dtype == torch.float32 and v.shape == (5, T) and not v.requires_grad
            torch.testing.assert_close(v, want, atol=1e-5, rtol=0)
            assert torch.equal(v[~rm], torch.zeros(int((~rm).sum())))
        assert bool((got["entropy"][rm] > 0).all())


def test_chunked_log_probs_direct_against_log_softmax():
    torch.manual_seed(3)
    head = torch.nn.Linear(16, 97, bias=False)
    h = torch.randn(23, 16) * 3
    y = torch.randint(0, 97, (23,))
    with torch.no_grad():
        lp, ent = chunked_log_probs(h, head, y, temperature=1.3, with_entropy=True, chunk_size=5)
        full = torch.log_softmax(head(h) / 1.3, -1)
    torch.testing.assert_close(lp, full.gather(-1, y[:, None]).squeeze(-1), atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, -(full.exp() * full).sum(-1), atol=1e-5, rtol=0)
    lp_only, none = chunked_log_probs(h, head, y, temperature=1.3, chunk_size=5)
    assert none is None
    torch.testing.assert_close(lp_only, lp, atol=1e-6, rtol=0)


def test_token_log_probs_with_grad_matches_naive_values_and_gradients():
    model = tiny_model()
    seq, am, rm = make_batch()
    g = torch.Generator().manual_seed(7)
    w1, w2 = torch.randn(5, T, generator=g), torch.randn(5, T, generator=g)

    lp, ent = token_log_probs(
        model, seq, am, P, temperature=0.8, with_entropy=True, chunk_size=3, response_mask=rm
    )
    assert lp.requires_grad and ent.requires_grad
    ((lp * w1).sum() + (ent * w2).sum()).backward()
    got = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()

    nlp, nent, _ = naive(model, seq, am, P, rm, 0.8)
    ((nlp * w1).sum() + (nent * w2).sum()).backward()
    torch.testing.assert_close(lp.detach(), nlp.detach(), atol=1e-5, rtol=0)
    torch.testing.assert_close(ent.detach(), nent.detach(), atol=1e-5, rtol=0)
    assert torch.equal(lp.detach()[~rm], torch.zeros(int((~rm).sum())))
    for k, p in model.named_parameters():
        torch.testing.assert_close(got[k], p.grad, atol=1e-5, rtol=1e-4, msg=f"gradient of {k}")
    assert any(float(v.abs().max()) > 0 for v in got.values())


def test_token_log_probs_without_response_mask_scores_every_column():
    model = tiny_model()
    seq, am, rm = make_batch()
    full_rm = torch.ones_like(rm)
    with torch.no_grad():
        lp = token_log_probs(model, seq, am, P, chunk_size=4)
        want, _, _ = naive(model, seq, am, P, full_rm)
    assert not lp.requires_grad
    torch.testing.assert_close(lp[rm], want[rm], atol=1e-5, rtol=0)


def test_hidden_is_the_post_norm_state_that_predicts_each_token():
    model = tiny_lora()
    seq, am, rm = make_batch()
    got = compute_signals(model, seq, am, P, rm, {"hidden"}, batch_size=3)
    with torch.no_grad():
        _, _, want = naive(model, seq, am, P, rm)
        # the LM head applied to it reproduces the model's own logits
        lp_from_hidden = torch.log_softmax(model.get_output_embeddings()(got["hidden"]), -1)
        lp_from_hidden = lp_from_hidden.gather(-1, seq[:, P:, None]).squeeze(-1) * rm
        lp_naive, _, _ = naive(model, seq, am, P, rm)
    assert got["hidden"].shape == (5, T, 32) and got["hidden"].dtype == torch.float32
    torch.testing.assert_close(got["hidden"], want, atol=1e-5, rtol=0)
    torch.testing.assert_close(lp_from_hidden, lp_naive, atol=1e-5, rtol=0)
    assert torch.equal(got["hidden"][~rm], torch.zeros(int((~rm).sum()), 32))


def test_left_padding_gives_the_values_of_the_unpadded_row():
    model = tiny_model()
    seq, am, rm = make_batch()
    batch = compute_signals(model, seq, am, P, rm, {"old_log_probs", "entropy"})
    i = 1  # prompt of 3 behind 3 pads, 4 response tokens
    lo, hi = P - PROMPT_LENS[i], P + RESP_LENS[i]
    alone = compute_signals(
        model,
        seq[i : i + 1, lo:hi],
        am[i : i + 1, lo:hi],
        PROMPT_LENS[i],
        rm[i : i + 1, : RESP_LENS[i]],
        {"old_log_probs", "entropy"},
    )
    for k in alone:
        torch.testing.assert_close(alone[k][0], batch[k][i, : RESP_LENS[i]], atol=1e-5, rtol=0)


def test_bf16_model_gives_float32_signals():
    model = tiny_model().to(torch.bfloat16)
    seq, am, rm = make_batch()
    got = compute_signals(model, seq, am, P, rm, {"old_log_probs", "entropy", "hidden"}, chunk_size=4)
    assert all(v.dtype == torch.float32 for v in got.values())
    with torch.no_grad():
        lp, ent, hid = naive(model, seq, am, P, rm)
    torch.testing.assert_close(got["old_log_probs"], lp, atol=0.1, rtol=0)
    torch.testing.assert_close(got["hidden"], hid, atol=0.1, rtol=0.05)


def test_final_logit_softcapping_is_applied_and_unknown_rescaling_refused():
    model = tiny_model()
    model.config.final_logit_softcapping = 0.5
    seq, am, rm = make_batch()
    got = compute_signals(model, seq, am, P, rm, {"old_log_probs"}, chunk_size=5)["old_log_probs"]
    with torch.no_grad():
        pos = (am.cumsum(-1) - 1).clamp(min=0) * am
        z = model(input_ids=seq, attention_mask=am, position_ids=pos).logits[:, P - 1 : -1]
        logp = torch.log_softmax(torch.tanh(z / 0.5) * 0.5, -1).gather(-1, seq[:, P:, None]).squeeze(-1) * rm
    torch.testing.assert_close(got, logp, atol=1e-5, rtol=0)

    model.config.logits_scaling = 4.0
    with pytest.raises(ConfigError, match="logits_scaling"):
        compute_signals(model, seq, am, P, rm, {"old_log_probs"})


# --------------------------------------------------------------------------- passes and memory
def test_forward_counts_one_pass_per_signal_group_and_micro_batch():
    model = tiny_lora()
    seq, am, rm = make_batch()
    neg_seq, neg_am, neg_p = negative_prompt_batch(seq, am)
    n_micro = 3  # 5 rows, batch_size 2
    cases = [
        ({"old_log_probs", "entropy", "hidden"}, 1),
        ({"old_log_probs", "entropy", "hidden", "base_hidden", "base_log_probs"}, 2),
        ({"base_hidden", "base_log_probs", "ref_log_probs"}, 1),  # LoRA base is the reference: shared pass
        ({"old_log_probs", "neg_log_probs"}, 2),
        ({"old_log_probs"}, 1),
        (set(), 0),
    ]
    for needs, passes in cases:
        with CountForwards(model) as c:
            got = compute_signals(
                model,
                seq,
                am,
                P,
                rm,
                needs,
                batch_size=2,
                neg_sequences=neg_seq,
                neg_attention_mask=neg_am,
                neg_prompt_len=neg_p,
            )
        assert c.n == passes * n_micro, needs
        assert set(got) == needs
        for name, v in got.items():
            assert v.dim() == (3 if SIGNALS[name] == "TH" else 2), name
    only = compute_signals(model, seq, am, P, rm, {"old_log_probs"})
    assert all(v.dim() == 2 for v in only.values())


def test_lm_head_sees_at_most_chunk_size_tokens_and_only_valid_ones():
    model = tiny_model()
    seq, am, rm = make_batch()
    rows: list[int] = []
    handle = model.get_output_embeddings().register_forward_hook(lambda m, a, out: rows.append(out.shape[0]))
    try:
        compute_signals(model, seq, am, P, rm, {"old_log_probs", "entropy"}, chunk_size=4)
        assert max(rows) <= 4 and sum(rows) == int(rm.sum())
        rows.clear()
        lp = token_log_probs(model, seq, am, P, chunk_size=4, response_mask=rm)
        lp.sum().backward()  # checkpointed: each chunk runs again in the backward
        assert max(rows) <= 4 and sum(rows) == 2 * int(rm.sum())
    finally:
        handle.remove()


# --------------------------------------------------------------------------- LoRA / ARCA
def test_arca_residual_zero_at_init_nonzero_after_a_step_and_adapter_restored():
    model = tiny_lora()
    model.train()
    modes = {name: m.training for name, m in model.named_modules()}
    seq, am, rm = make_batch()
    needs = {"old_log_probs", "hidden", "base_hidden", "base_log_probs"}

    s0 = compute_signals(model, seq, am, P, rm, needs, batch_size=2)
    assert torch.equal((s0["hidden"] - s0["base_hidden"]).norm(dim=-1), torch.zeros(5, T))
    assert torch.equal(s0["old_log_probs"], s0["base_log_probs"])
    assert {name: m.training for name, m in model.named_modules()} == modes

    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    loss = -token_log_probs(model, seq, am, P, response_mask=rm)[rm].mean()
    loss.backward()
    opt.step()

    s1 = compute_signals(model, seq, am, P, rm, needs, batch_size=2)
    again = compute_signals(model, seq, am, P, rm, needs, batch_size=5)
    for k in needs:  # eval mode: LoRA dropout off, micro-batching does not change values
        torch.testing.assert_close(s1[k], again[k], atol=1e-6, rtol=0)
    residual = (s1["hidden"] - s1["base_hidden"]).norm(dim=-1)
    assert bool((residual[rm] > 1e-6).all())
    assert torch.equal(residual[~rm], torch.zeros(int((~rm).sum())))

    model.eval()
    with torch.no_grad():
        adapted_lp, _, adapted_h = naive(model, seq, am, P, rm)
        with model.disable_adapter():
            base_lp, _, base_h = naive(model, seq, am, P, rm)
        after_lp, _, _ = naive(model, seq, am, P, rm)  # adapter back on
    torch.testing.assert_close(s1["old_log_probs"], adapted_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(s1["hidden"], adapted_h, atol=1e-5, rtol=0)
    torch.testing.assert_close(s1["base_log_probs"], base_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(s1["base_hidden"], base_h, atol=1e-5, rtol=0)
    torch.testing.assert_close(after_lp, adapted_lp, atol=0, rtol=0)
    assert float((adapted_lp - base_lp).abs().max()) > 1e-4


def test_has_lora_adapter_and_base_signals_without_lora_are_a_config_error():
    plain, lora = tiny_model(), tiny_lora()
    assert has_lora_adapter(lora) and not has_lora_adapter(plain)
    seq, am, rm = make_batch()
    for needs in ({"base_hidden"}, {"base_log_probs", "old_log_probs"}):
        with pytest.raises(
            ConfigError, match=r"ARCA / policy-divergence need a LoRA adapter \(set lora.rank > 0\)"
        ):
            compute_signals(plain, seq, am, P, rm, needs)
    with pytest.raises(ConfigError, match="ref_model"):
        compute_signals(plain, seq, am, P, rm, {"ref_log_probs"})
    with pytest.raises(ConfigError, match="entropy"):
        compute_signals(plain, seq, am, P, rm, {"entropyy"})


def test_ref_log_probs_from_a_ref_model_or_the_lora_base():
    model, ref = tiny_lora(), tiny_model(seed=5)
    seq, am, rm = make_batch()
    with CountForwards(ref) as c:
        got = compute_signals(model, seq, am, P, rm, {"ref_log_probs"}, ref_model=ref)
    assert c.n == 1
    with torch.no_grad():
        want, _, _ = naive(ref, seq, am, P, rm)
    torch.testing.assert_close(got["ref_log_probs"], want, atol=1e-5, rtol=0)

    shared = compute_signals(model, seq, am, P, rm, {"ref_log_probs", "base_log_probs"})
    torch.testing.assert_close(shared["ref_log_probs"], shared["base_log_probs"], atol=0, rtol=0)


# --------------------------------------------------------------------------- GCPO negative prompt
def negative_prompt_batch(seq, am, neg_p=8):
    """Same response columns behind different (longer) negative prompts."""
    n = seq.shape[0]
    g = torch.Generator().manual_seed(11)
    neg_lens = [8, 2, 5, 7, 3]
    neg_seq = torch.zeros(n, neg_p + T, dtype=torch.long)
    neg_am = torch.zeros_like(neg_seq)
    for i, pl in enumerate(neg_lens):
        neg_seq[i, neg_p - pl : neg_p] = torch.randint(1, VOCAB, (pl,), generator=g)
        neg_am[i, neg_p - pl : neg_p] = 1
    neg_seq[:, neg_p:] = seq[:, P:]
    neg_am[:, neg_p:] = am[:, P:]
    return neg_seq, neg_am, neg_p


def test_neg_log_probs_score_the_same_response_under_the_negative_prompt():
    model = tiny_model()
    seq, am, rm = make_batch()
    neg_seq, neg_am, neg_p = negative_prompt_batch(seq, am)
    got = compute_signals(
        model,
        seq,
        am,
        P,
        rm,
        {"old_log_probs", "neg_log_probs"},
        neg_sequences=neg_seq,
        neg_attention_mask=neg_am,
        neg_prompt_len=neg_p,
        chunk_size=3,
    )
    with torch.no_grad():
        want, _, _ = naive(model, neg_seq, neg_am, neg_p, rm)
    torch.testing.assert_close(got["neg_log_probs"], want, atol=1e-5, rtol=0)
    assert float((got["neg_log_probs"] - got["old_log_probs"]).abs().max()) > 1e-4

    bad = neg_seq.clone()
    bad[3, neg_p + 2] = (bad[3, neg_p + 2] % (VOCAB - 1)) + 1 if bad[3, neg_p + 2] != 1 else 2
    with pytest.raises(ValueError, match="response token 2 of rollout 3"):
        compute_signals(
            model,
            seq,
            am,
            P,
            rm,
            {"neg_log_probs"},
            neg_sequences=bad,
            neg_attention_mask=neg_am,
            neg_prompt_len=neg_p,
        )
    with pytest.raises(ValueError, match="neg_sequences"):
        compute_signals(model, seq, am, P, rm, {"neg_log_probs"})


# --------------------------------------------------------------------------- input validation
def test_bad_layouts_are_clear_errors():
    model = tiny_model()
    seq, am, rm = make_batch()
    with pytest.raises(ValueError, match="prompt_len"):
        compute_signals(model, seq, am, 0, rm, {"old_log_probs"})
    with pytest.raises(ValueError, match=r"response_mask: expected shape \(5, 9\)"):
        compute_signals(model, seq, am, P, rm[:, :-1], {"old_log_probs"})
    bad_rm = rm.clone()
    bad_rm[4, 0] = True  # row 4 has no response: attention_mask is 0 there
    with pytest.raises(ValueError, match="token 0 of rollout 4"):
        compute_signals(model, seq, am, P, bad_rm, {"old_log_probs"})
    bad_seq = seq.clone()
    bad_seq[0, P] = VOCAB + 3
    with pytest.raises(ValueError, match=r"token id 153 at rollout 0, column 6 .*\[0, 150\)"):
        compute_signals(model, bad_seq, am, P, rm, {"old_log_probs"})

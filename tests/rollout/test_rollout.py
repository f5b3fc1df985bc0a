import copy
import functools

import pytest
import torch

from conftest import BYTE_EOS, BYTE_PAD, byte_tokenizer, tiny_qwen3
from tokencredit.rollout import Rollouts, generate, response_mask_from_ids
from tokencredit.rollout import decode as decode_module

PAD, EOS = BYTE_PAD, BYTE_EOS


@pytest.fixture(scope="module")
def tiny():
    tok = byte_tokenizer()
    model = tiny_qwen3(len(tok), max_position_embeddings=256, tie_word_embeddings=True)
    return model.eval(), tok


def force_eos_at(model, total_len: int):
    """Forward hook: EOS is impossible until a sequence holds `total_len` real tokens, then certain."""
    seen = {"calls": []}

    def hook(mod, args, kwargs, out):
        pos = kwargs["position_ids"][:, -1]
        cache = kwargs.get("cache", kwargs.get("past_key_values"))  # renamed in transformers 5.24
        seen["calls"].append(
            (tuple(kwargs["input_ids"].shape), int(cache.get_seq_length()) if cache is not None else 0)
        )
        seen["layers"] = {type(x).__name__ for x in cache.layers} if cache is not None else set()
        last = out.logits[:, -1, :]
        last[:, EOS] = torch.where(pos + 1 >= total_len, 1e4, -1e4).to(last.dtype)
        return out

    return model.register_forward_hook(hook, with_kwargs=True), seen


PROMPTS = ["Hi", "Hello", "A long prompt."]  # 2, 5 and 14 byte tokens
# The same after a chat-template-like beginning of 62 byte tokens: the common-prefix cascade level.
TEMPLATED = ["<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\n" + p for p in PROMPTS]


def test_shapes_masks_and_eos(tiny):
    model, tok = tiny
    handle, seen = force_eos_at(model, 6)
    try:
        r = generate(model, tok, PROMPTS, 2, temperature=1.0, max_new_tokens=8, seed=0)
    finally:
        handle.remove()
    assert isinstance(r, Rollouts)
    assert r.prompt_ids.shape == (6, 14) and r.prompt_mask.dtype == torch.bool
    assert r.prompt_index.tolist() == [0, 0, 1, 1, 2, 2]
    # Left padding: real prompt tokens are flush right.
    assert r.prompt_mask.sum(1).tolist() == [2, 2, 5, 5, 14, 14]
    assert r.prompt_mask[:, -1].all() and not r.prompt_mask[0, 0]
    assert (r.prompt_ids[~r.prompt_mask] == PAD).all()
    # EOS after 6 real tokens: responses of 5, 2 and 1 tokens, EOS included and last.
    lengths = [5, 5, 2, 2, 1, 1]
    assert r.response_ids.shape == (6, 5)
    assert r.response_lengths.tolist() == lengths
    for i, n in enumerate(lengths):
        assert r.response_mask[i, :n].all() and not r.response_mask[i, n:].any()
        assert r.response_ids[i, n - 1] == EOS and (r.response_ids[i, : n - 1] != EOS).all()
        assert (r.response_ids[i, n:] == PAD).all()
    assert not r.truncated.any()
    assert r.texts[4] == "" and len(r.texts[0]) >= 1 and "<eos>" not in "".join(r.texts)
    # Shared prefill: the 3 distinct prompts run once (all but their last token) into the cache; then
    # every forward feeds one token per row and the cache (after the call) grows by one position.
    assert seen["calls"][0] == ((3, 13), 13)
    assert seen["calls"][1:] == [((6, 1), 14 + i) for i in range(len(seen["calls"]) - 1)]
    # Each prompt's 2 samples attend to its prompt part held once (shared-prefix attention), their own
    # tokens appended in place (not DynamicCache's torch.cat).
    assert seen["layers"] == {"CascadeLayer"}
    assert tok.padding_side == "right"


def test_truncation_flag(tiny):
    model, tok = tiny
    handle, _ = force_eos_at(model, 6)
    try:
        r = generate(model, tok, PROMPTS, 1, temperature=0.0, max_new_tokens=3)
    finally:
        handle.remove()
    assert r.response_ids.shape == (3, 3)
    assert r.truncated.tolist() == [True, False, False]
    assert r.response_mask.tolist() == [[True] * 3, [True, True, False], [True, False, False]]


def test_pad_equal_to_eos(tiny):
    model, _ = tiny
    tok = byte_tokenizer(with_pad=False)
    handle, _ = force_eos_at(model, 6)
    try:
        r = generate(model, tok, PROMPTS, 1, temperature=0.0, max_new_tokens=8)
    finally:
        handle.remove()
    assert r.pad_token_id == EOS
    assert r.response_lengths.tolist() == [5, 2, 1]
    assert (r.response_ids[~r.response_mask] == EOS).all()
    assert tok.pad_token is None and tok.padding_side == "right"


def test_response_mask_from_ids():
    ids = torch.tensor([[5, 1, 0, 0], [5, 6, 7, 8], [1, 1, 1, 1]])
    mask, trunc = response_mask_from_ids(ids, [1])
    assert mask.tolist() == [[True, True, False, False], [True] * 4, [True, False, False, False]]
    assert trunc.tolist() == [False, True, False]


def test_seed_determinism_and_global_rng_untouched(tiny):
    model, tok = tiny
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a = generate(model, tok, PROMPTS, 2, temperature=1.0, max_new_tokens=10, seed=7)
    assert torch.equal(torch.rand(3), expected_next)  # sampling used a forked RNG
    b = generate(model, tok, PROMPTS, 2, temperature=1.0, max_new_tokens=10, seed=7)
    c = generate(model, tok, PROMPTS, 2, temperature=1.0, max_new_tokens=10, seed=8)
    assert torch.equal(a.response_ids, b.response_ids) and a.texts == b.texts
    assert not torch.equal(a.response_ids, c.response_ids)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    d = generate(model, tok, PROMPTS, 2, temperature=1.0, max_new_tokens=10, generator=g1)
    e = generate(model, tok, PROMPTS, 2, temperature=1.0, max_new_tokens=10, generator=g2)
    assert torch.equal(d.response_ids, e.response_ids)
    with pytest.raises(ValueError, match="either seed or generator"):
        generate(model, tok, PROMPTS, 1, seed=1, generator=g1)


def test_greedy_is_argmax_and_batch_size_chunks(tiny):
    model, tok = tiny
    r = generate(model, tok, PROMPTS, 3, temperature=0.0, max_new_tokens=6)
    # All samples of a prompt agree, and the first token is the model's argmax.
    for p in range(3):
        assert torch.equal(r.response_ids[3 * p], r.response_ids[3 * p + 2])
    enc = tok(PROMPTS[1], return_tensors="pt")
    with torch.no_grad():
        first = model(**enc).logits[0, -1].argmax()
    assert r.response_ids[3, 0] == first
    chunked = generate(model, tok, PROMPTS, 3, temperature=0.0, max_new_tokens=6, batch_size=4)
    assert torch.equal(chunked.response_ids, r.response_ids)
    assert torch.equal(chunked.response_mask, r.response_mask)


class CountingTokenizer:
    """Forwards everything to a tokenizer and records each text it is asked to encode."""

    def __init__(self, tok):
        object.__setattr__(self, "_tok", tok)
        object.__setattr__(self, "encoded", [])

    def __call__(self, text, **kw):
        self.encoded.extend(text if isinstance(text, list) else [text])
        return self._tok(text, **kw)

    def encode(self, text, **kw):
        self.encoded.append(text)
        return self._tok.encode(text, **kw)

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __setattr__(self, name, value):
        setattr(self._tok, name, value)


def test_prompt_tokenised_once(tiny):
    model, tok = tiny
    counting = CountingTokenizer(tok)
    r = generate(model, counting, PROMPTS, 4, temperature=1.0, max_new_tokens=3, seed=0, batch_size=5)
    assert counting.encoded == PROMPTS
    assert r.prompt_ids.shape[0] == 12
    assert torch.equal(r.prompt_ids[0], r.prompt_ids[3]) and torch.equal(r.prompt_ids[4], r.prompt_ids[7])


def test_training_mode_restored_and_errors(tiny):
    model, tok = tiny
    model.train()
    try:
        generate(model, tok, ["x"], 1, temperature=0.0, max_new_tokens=2)
        assert model.training
    finally:
        model.eval()
    with pytest.raises(ValueError, match="num_samples"):
        generate(model, tok, ["x"], 0)
    with pytest.raises(ValueError, match="no prompts"):
        generate(model, tok, [], 1)
    with pytest.raises(ValueError, match="top_p"):
        generate(model, tok, ["x"], 1, top_p=0.0)


# ---------------------------------------------------------------- equivalence with plain model.generate


def reference(
    model, tok, prompts, n, *, temperature, top_p=1.0, top_k=0, max_new_tokens, seed, eos, batch_size=None
):
    """[N, T] new tokens of plain ``model.generate`` calls (transformers' own cache and prefill) on the
    left-padded, repeated prompts, `batch_size` rows a call, seeded as `generate` seeds; finished
    rows are padded with the pad id."""
    from tokencredit.rollout import generation_config

    cfg = generation_config(temperature, top_p, top_k, max_new_tokens, eos, tok.pad_token_id)
    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
    ids, att = enc["input_ids"].repeat_interleave(n, 0), enc["attention_mask"].repeat_interleave(n, 0)
    step = batch_size or ids.shape[0]
    outs = []
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        for s in range(0, ids.shape[0], step):
            out = model.generate(
                input_ids=ids[s : s + step], attention_mask=att[s : s + step], generation_config=cfg
            )
            outs.append(out[:, ids.shape[1] :])
    width = max(o.shape[1] for o in outs)
    return torch.cat(
        [torch.nn.functional.pad(o, (0, width - o.shape[1]), value=tok.pad_token_id) for o in outs]
    )


# Frequent stop ids so that rows end at different, random lengths and some hit max_new_tokens.
def frequent_stops(tok, k: int = 30) -> list[int]:
    return [EOS, *tok.convert_tokens_to_ids(list("etaoinshrdlucmfwypvbgkqjxzETAOINSHRD"))[:k]]


SETTINGS = [
    dict(temperature=0.0),
    dict(temperature=1.0),
    dict(temperature=0.7, top_p=0.9, top_k=20),
]


def decoding_logits(model, run):
    """(run()'s result, last-position logits [n, V] of each decoding step, one query token a row, and the
    number of steps our decoding loop made). Recorded without a forward hook on the model, which would
    send generation to ``generate`` (`rollout.decode.layered_supported`): the loop's step function and
    the model's forward (``generate``'s steps) are wrapped instead."""
    seen, ours = [], []
    plain_forward, plain_step = model.forward, decode_module._step

    @functools.wraps(plain_forward)  # generate reads the signature to choose its inputs
    def forward(*args, **kwargs):
        out = plain_forward(*args, **kwargs)
        if kwargs["input_ids"].shape[1] == 1:
            seen.append(out.logits[:, -1].float().clone())
        return out

    def step(*args, **kwargs):
        logits = plain_step(*args, **kwargs)
        seen.append(logits.clone())
        ours.append(1)
        return logits

    model.forward, decode_module._step = forward, step
    try:
        return run(), seen, len(ours)
    finally:
        del model.forward
        decode_module._step = plain_step


@pytest.mark.parametrize("prompts", [PROMPTS, TEMPLATED], ids=["short", "templated"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kw", SETTINGS, ids=["greedy", "sample", "sample-top-p-k"])
def test_same_tokens_as_model_generate_tiny_qwen3(tiny, kw, dtype, prompts):
    """fp32: the same tokens as plain ``generate``. bf16: the same greedy tokens; sampled, the same up to
    bf16 rounding (plain ``generate``'s own logits move by ~2e-3 with the batch around a row, enough to
    flip a draw on this random model's flat distributions), so there every decoding step's logits are
    checked against a plain full forward of the finished rows."""
    model, tok = tiny
    model = copy.deepcopy(model).to(dtype)
    stops = frequent_stops(tok)
    # (samples per prompt, rows per generate call): shared prefill; groups split across calls; no sharing.
    for seed, (n, batch_size) in enumerate([(4, None), (3, 5), (1, None)]):
        # Rows that share nothing (n = 1, no common beginning) take plain generate's path: exact too.
        exact = dtype == torch.float32 or kw["temperature"] == 0 or (n == 1 and prompts is PROMPTS)
        run = functools.partial(
            generate,
            model,
            tok,
            prompts,
            n,
            max_new_tokens=12,
            seed=seed,
            eos_token_id=stops,
            batch_size=batch_size,
            **kw,
        )
        r, steps, ours = decoding_logits(model, run)
        # Rows with a common beginning, or in equal groups of a shared prompt, decode in our loop (the
        # cascade); the others (no sharing, or groups split across calls) in generate.
        assert (ours > 0) == (prompts is TEMPLATED or (n > 1 and batch_size is None)), (seed, n, ours)
        if exact:
            ref = reference(
                model, tok, prompts, n, max_new_tokens=12, seed=seed, eos=stops, batch_size=batch_size, **kw
            )
            assert torch.equal(r.response_ids, ref), (seed, n, batch_size)
        else:
            with torch.no_grad():
                full = model(input_ids=r.sequences, attention_mask=r.attention_mask).logits.float()
            p = r.prompt_ids.shape[1]
            chunk = batch_size or len(r.response_ids)
            for c, start in enumerate(range(0, len(r.response_ids), chunk)):
                rows = slice(start, start + chunk)
                chunk_steps = steps[: int(r.response_lengths[rows].max())] if c == 0 else None
                if chunk_steps is None:
                    break  # the hook's steps of later chunks follow; the first chunk suffices
                for t, logits in enumerate(chunk_steps):
                    live = r.response_mask[rows, t]
                    torch.testing.assert_close(
                        logits[live], full[rows][live, p + t - 1], atol=8e-3, rtol=0
                    )  # 2 ulps
        if kw["temperature"] > 0 and n > 1:
            # The comparison covers EOS and truncation: rows end at different lengths, some truncated.
            lengths = r.response_lengths
            assert lengths.min() < lengths.max() and r.truncated.any() and not r.truncated.all()


@pytest.fixture(scope="module")
def toy():
    from tokencredit.data.templates import render
    from tokencredit.models import load_model, toy_task

    model, tok = load_model("toy")
    task = toy_task(0)
    # Held-out problems of 121 and 122 tokens: the batch is left-padded.
    prompts = [render("qwen-math", p.problem, tok) for p in task.sample(6, "heldout")]
    return model, tok, prompts


@pytest.mark.parametrize(
    "n, max_new, kw",
    [(1, 80, SETTINGS[0]), (3, 80, SETTINGS[1]), (2, 30, SETTINGS[1])],  # 30: every answer truncated
    ids=["greedy", "sample", "sample-truncated"],
)
def test_same_tokens_as_model_generate_toy(toy, n, max_new, kw):
    model, tok, prompts = toy
    assert len({len(tok(p)["input_ids"]) for p in prompts}) > 1
    ref = reference(model, tok, prompts, n, max_new_tokens=max_new, seed=5, eos=[tok.eos_token_id], **kw)
    r = generate(model, tok, prompts, n, max_new_tokens=max_new, seed=5, **kw)
    assert torch.equal(r.response_ids, ref)
    assert bool(r.truncated.all()) == (max_new == 30) and bool(r.truncated.any()) == (max_new == 30)


def test_lora_wrapped_model(tiny):
    from peft import LoraConfig, get_peft_model

    base, tok = tiny
    model = get_peft_model(
        tiny_qwen3(len(tok), max_position_embeddings=256, tie_word_embeddings=True),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    ).eval()
    stops = frequent_stops(tok)
    for temperature, prompts, n in (
        (1.0, TEMPLATED, 3),
        (0.0, TEMPLATED, 1),
        (1.0, PROMPTS, 3),
        (0.0, PROMPTS, 3),
    ):
        ref = reference(model, tok, prompts, n, temperature=temperature, max_new_tokens=10, seed=2, eos=stops)
        r = generate(
            model, tok, prompts, n, temperature=temperature, max_new_tokens=10, seed=2, eos_token_id=stops
        )
        assert torch.equal(r.response_ids, ref), (temperature, n)
    # The adapter is active while generating: the base model decodes something else (greedy; sampling
    # from the random model's near-uniform distributions hardly notices the adapter).
    plain = generate(base, tok, PROMPTS, 3, temperature=0.0, max_new_tokens=10, eos_token_id=stops)
    assert not torch.equal(plain.response_ids, r.response_ids)


def test_append_layer_matches_dynamic_layer():
    from transformers.cache_utils import DynamicLayer

    from tokencredit.rollout.cache import _append_layer_class

    torch.manual_seed(0)
    ours, ref = _append_layer_class()(room=3), DynamicLayer()

    def step(n: int, batch: int = 2) -> None:
        k, v = torch.randn(batch, 3, n, 4), torch.randn(batch, 3, n, 4)
        a, b = ours.update(k, v), ref.update(k, v)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])

    step(5)
    buf = ours._kbuf
    for _ in range(3):
        step(1)  # written in place into the room left after the prefill
    assert ours._kbuf is buf and ours.keys.data_ptr() == buf.data_ptr() and buf.shape[2] == 5 + 3
    step(1)  # past the room: new, larger buffers
    assert ours._kbuf is not buf and ours.get_seq_length() == ref.get_seq_length() == 9
    for layer in (ours, ref):
        layer.crop(-2)
    step(2)  # overwrites the cropped positions
    idx = torch.tensor([1, 1, 0])
    for layer in (ours, ref):
        layer.batch_select_indices(idx)
    step(1, batch=3)  # the selected rows are copied into new buffers
    assert ours.keys.shape == (3, 3, 10, 4)
    for layer in (ours, ref):
        layer.batch_repeat_interleave(2)
    step(1, batch=6)
    assert ours.keys.shape == (6, 3, 11, 4)


def test_append_layer_grows_geometrically():
    """Spare room as large as what is held (at most `room`): a long generation copies its cache
    O(log T) times, and memory stays within 2x of what it holds."""
    from tokencredit.rollout.cache import _append_layer_class

    layer = _append_layer_class()(room=1000)
    sizes = []
    for n in [20] + [1] * 60:
        layer.update(torch.zeros(1, 1, n, 2), torch.zeros(1, 1, n, 2))
        sizes.append(layer._kbuf.shape[2])
    assert sorted(set(sizes)) == [40, 82]  # 20 + 20 spare; full at 40, then 41 + 41
    assert layer.get_seq_length() == 80


def test_model_asking_for_its_own_cache_keeps_it(tiny):
    """A model whose generation config names a cache implementation gets it from ``generate``."""
    model, tok = tiny
    model.generation_config.cache_implementation = "static"
    handle, seen = force_eos_at(model, 9)
    try:
        ref = reference(model, tok, PROMPTS, 2, temperature=1.0, max_new_tokens=6, seed=4, eos=[EOS])
        r = generate(model, tok, PROMPTS, 2, temperature=1.0, max_new_tokens=6, seed=4)
    finally:
        handle.remove()
        model.generation_config.cache_implementation = None
    assert seen["layers"] == {"StaticLayer"} and seen["calls"][0][0] == (6, 14)  # no shared prefill
    assert torch.equal(r.response_ids, ref)

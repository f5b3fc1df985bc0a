import dataclasses
import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file

from tokencredit import cli, hf_progress, models
from tokencredit.data.synthetic import CONNECTIVES, ENDINGS, ArithmeticTask
from tokencredit.data.templates import QWEN_MATH_SYSTEM, render
from tokencredit.errors import ConfigError
from tokencredit.models import (
    EOS_TOKEN,
    PAD_TOKEN,
    TOY_ASSET_DIR,
    WarmStartConfig,
    build_toy,
    build_toy_model,
    build_toy_tokenizer,
    load_model,
    warm_start,
)

TINY = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
}


@pytest.fixture(scope="module")
def tok():
    return build_toy_tokenizer()


def test_tokenizer_is_character_level(tok):
    text = "47 + 38 = 85\nThe answer is \\boxed{85}."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert tok.convert_ids_to_tokens(ids)[:3] == ["4", "7", " "]
    # every printable ASCII character and newline has its own id; special tokens are single ids
    assert len(tok) == 3 + 1 + 95
    assert tok.eos_token == EOS_TOKEN and tok.pad_token == PAD_TOKEN and tok.eos_token_id != tok.pad_token_id
    assert tok(EOS_TOKEN + "<|im_start|>", add_special_tokens=False)["input_ids"] == [tok.eos_token_id, 1]
    assert tok.decode([tok.eos_token_id, tok.convert_tokens_to_ids(" ")], skip_special_tokens=True) == " "


def test_chat_template_renders_qwen_math(tok):
    prompt = render("qwen-math", "Compute 1 + 2.", tok)
    assert prompt == (
        f"<|im_start|>system\n{QWEN_MATH_SYSTEM}<|im_end|>\n<|im_start|>user\nCompute 1 + 2.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == prompt
    assert tok.unk_token_id not in ids[1:]  # pad doubles as unk: no character was unknown
    # the r1-zero template (plain text) encodes without unknown characters too
    r1 = tok(render("r1-zero", "Compute 1 + 2.", tok), add_special_tokens=False)["input_ids"]
    assert tok.pad_token_id not in r1


def test_build_toy_model_is_a_qwen3_and_deterministic(tok):
    from transformers import Qwen3ForCausalLM

    a, b, c = (build_toy_model(TINY, seed=s, tokenizer=tok) for s in (0, 0, 1))
    assert isinstance(a, Qwen3ForCausalLM)
    assert a.config.vocab_size == len(tok) and a.config.eos_token_id == tok.eos_token_id
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    ids = torch.tensor([tok("1 + 2 =")["input_ids"]])
    out = a(input_ids=ids, output_hidden_states=True)
    assert out.logits.shape == (1, ids.shape[1], len(tok))
    assert out.hidden_states[-1].shape == (1, ids.shape[1], TINY["hidden_size"])


def test_shared_prefix_loss_equals_the_plain_loss(tok):
    from tokencredit.models.warm_start import _encode_examples, _sft_loss

    probs = ArithmeticTask(difficulty=2).sample(5)
    prompts = [render("qwen-math", p.problem, tok) for p in probs]
    ids, mask, labels = _encode_examples(tok, prompts, [p.solution for p in probs])
    grads = []
    for fn in (
        lambda m: m(input_ids=ids, attention_mask=mask, labels=labels).loss,
        lambda m: _sft_loss(m, ids, mask, labels),
    ):
        m = build_toy_model(TINY, tokenizer=tok)
        loss = fn(m)
        loss.backward()
        grads.append((loss.detach(), [p.grad for p in m.parameters()]))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    for a, b in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    # no shared prefix (different first tokens): falls back to the plain forward
    ids2 = ids.clone()
    ids2[0, 0] = 5
    m = build_toy_model(TINY, tokenizer=tok)
    torch.testing.assert_close(
        _sft_loss(m, ids2, mask, labels), m(input_ids=ids2, attention_mask=mask, labels=labels).loss
    )


def test_warm_start_few_steps_is_deterministic(tok):
    cfg = WarmStartConfig(steps=3, batch_size=4, warmup_steps=1, model=TINY)
    states, losses = [], []
    for _ in range(2):
        m = build_toy_model(cfg.model, seed=cfg.seed, tokenizer=tok)
        losses.append(warm_start(m, tok, cfg))
        states.append(m.state_dict())
    assert losses[0] == losses[1] and len(losses[0]) == 3
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert not m.training


def test_build_toy_writes_loadable_deterministic_files(tmp_path):
    cfg = WarmStartConfig(steps=2, batch_size=4, warmup_steps=1, model=TINY)
    d1, d2 = build_toy(tmp_path / "a", cfg), build_toy(tmp_path / "b", cfg)
    w1, w2 = load_file(d1 / "model.safetensors"), load_file(d2 / "model.safetensors")
    assert w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1)
    assert json.loads((d1 / "warm_start.json").read_text())["steps"] == 2
    model, tk = load_model(str(d1))
    assert model.config.num_hidden_layers == 1 and tk.eos_token == EOS_TOKEN and tk.padding_side == "left"
    # the loaded tokenizer is the same character-level tokenizer (chat template included)
    assert render("qwen-math", "Compute 1 + 2.", tk) == render(
        "qwen-math", "Compute 1 + 2.", build_toy_tokenizer()
    )


def test_build_toy_cli(tmp_path, capsys):
    threads = torch.get_num_threads()
    try:
        assert cli.main(["build-toy", "--out", str(tmp_path), "--steps", "1", "--eval", "0"]) == 0
    finally:
        torch.set_num_threads(threads)
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "tokenizer.json").is_file()
    assert "built the toy model" in capsys.readouterr().out


def test_shipped_toy_loads_and_answers():
    files = {p.name: p.stat().st_size for p in TOY_ASSET_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "warm_start.json"} <= files.keys()
    assert sum(files.values()) < 5 * 2**20
    model, tk = load_model("toy")
    assert type(model).__name__ == "Qwen3ForCausalLM" and tk.eos_token == EOS_TOKEN
    built = json.loads((TOY_ASSET_DIR / "warm_start.json").read_text())
    task = ArithmeticTask(difficulty=built["difficulty"], digits=built["digits"])
    probs = task.sample(8, "heldout")
    enc = tk([render("qwen-math", p.problem, tk) for p in probs], return_tensors="pt", padding=True)
    out = model.generate(**enc, max_new_tokens=96, do_sample=False)
    texts = tk.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    # the warm start writes the solution format (one "a op b = c" step per line, a boxed answer)
    for t in texts:
        lines = t.strip().split("\n")
        assert len(lines) == built["difficulty"] + 1, t
        assert lines[-1].startswith("The answer is \\boxed{"), t
    assert (out[:, enc["input_ids"].shape[1] :] == tk.eos_token_id).any(dim=1).all()


def test_toy_supports_lora(tok):
    from peft import LoraConfig, get_peft_model

    m = get_peft_model(
        build_toy_model(TINY, tokenizer=tok), LoraConfig(r=2, target_modules=["q_proj", "v_proj"])
    )
    ids = torch.tensor([tok("12 + 3")["input_ids"]])
    m(input_ids=ids, labels=ids).loss.backward()
    assert any(p.grad is not None for n, p in m.named_parameters() if "lora_" in n)


def test_load_model_errors(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="no/such/dir"):
        load_model(str(tmp_path / "no/such/dir"))
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        load_model(str(f))
    with pytest.raises(ConfigError, match="dtype"):
        load_model("toy", dtype="float64")
    for name in models.TOY_VARIANTS:
        empty = dataclasses.replace(models.TOY_VARIANTS[name], asset_dir=tmp_path / "empty")
        monkeypatch.setitem(models.TOY_VARIANTS, name, empty)
    with pytest.raises(ConfigError, match="build-toy`"):
        load_model("toy")
    with pytest.raises(ConfigError, match="build-toy --task toy-hard"):
        load_model("toy-hard")


def test_load_model_needs_an_eos_token(tmp_path, tok):
    from transformers import PreTrainedTokenizerFast

    build_toy_model(TINY, tokenizer=tok).save_pretrained(tmp_path)
    no_eos = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, pad_token=PAD_TOKEN)
    no_eos.save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="no EOS token"):
        load_model(str(tmp_path))


def test_load_model_local_path_dtype_and_pad_default(tmp_path, tok):
    from transformers import PreTrainedTokenizerFast

    build_toy_model(TINY, tokenizer=tok).save_pretrained(tmp_path)
    PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, eos_token=EOS_TOKEN).save_pretrained(
        tmp_path
    )
    model, tk = load_model(str(tmp_path), dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    assert tk.pad_token == EOS_TOKEN  # a missing pad token falls back to EOS


# ---------------------------------------------------------------------------- the toy variants
# SHA-256 of the shipped default warm start: adding the hard variant must not change it.
TOY_WEIGHTS_SHA256 = "2ce818fe09c76a8ded2c4fb203c6cf711d2da283ffaf2b25a4229a537c4036c9"


def test_default_toy_is_unchanged_by_the_variants():
    toy = models.toy_variant("toy")
    assert toy.asset_dir == TOY_ASSET_DIR and toy.rebuild_command == models.REBUILD_COMMAND
    assert (
        hashlib.sha256((TOY_ASSET_DIR / "model.safetensors").read_bytes()).hexdigest() == TOY_WEIGHTS_SHA256
    )
    # the variant's build settings are the ones the shipped toy was built with
    assert json.loads((TOY_ASSET_DIR / "warm_start.json").read_text()) == dataclasses.asdict(toy.config)
    assert toy.config == WarmStartConfig()
    t = models.toy_task()
    assert (t.difficulty, t.digits, t.operand_digits) == (3, 2, 1)


def test_toy_variant_errors_name_the_closest():
    with pytest.raises(ConfigError, match="closest: toy-hard"):
        models.toy_variant("toy-hrad")
    with pytest.raises(ConfigError, match="unknown toy model"):
        models.toy_task(name="tiny")


def test_hard_variant_ships_and_fits_its_budget():
    hard = models.toy_variant("toy-hard")
    assert hard.asset_dir == models.TOY_HARD_ASSET_DIR and "--task toy-hard" in hard.rebuild_command
    files = {p.name: p.stat().st_size for p in hard.asset_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "warm_start.json"} <= files.keys()
    assert sum(files.values()) < 5 * 2**20
    assert json.loads((hard.asset_dir / "warm_start.json").read_text()) == dataclasses.asdict(hard.config)
    task = models.toy_task(seed=3, name="toy-hard")
    assert (task.difficulty, task.digits, task.operand_digits) == (hard.config.difficulty, 2, 1)
    assert task.difficulty == 6 and task.seed == 3
    # the rollout budget holds every reference solution plus EOS (character-level tokens)
    longest = max(len(p.solution) + 1 for p in task.sample(500, "train"))
    assert longest <= hard.max_new_tokens
    assert (
        max(len(p.solution) + 1 for p in models.toy_task().sample(500, "train"))
        <= models.toy_variant("toy").max_new_tokens
    )
    # the same tokenizer as the toy (one token per character, same chat template)
    _, tk = load_model("toy-hard")
    assert render("qwen-math", "Compute 1 + 2.", tk) == render(
        "qwen-math", "Compute 1 + 2.", build_toy_tokenizer()
    )


@pytest.fixture
def one_thread():
    """torch on one CPU thread inside the test (the shipped builds' measurements), restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_hard_warm_start_answers_in_format_and_leaves_room(one_thread):
    """Greedy answers on held-out problems are six-step chains; accuracy is neither near 0 nor near 1
    (the shipped build measured 30-60% on 400 held-out problems; see models.TOY_HARD_CONFIG)."""
    model, tk = load_model("toy-hard")
    probs = models.toy_task(name="toy-hard").sample(40, "heldout")
    acc = models.toy_accuracy(model, tk, probs, temperature=0.0, max_new_tokens=128)
    enc = tk([render("qwen-math", p.problem, tk) for p in probs[:6]], return_tensors="pt", padding=True)
    out = model.generate(**enc, max_new_tokens=128, do_sample=False)
    for t in tk.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True):
        lines = t.strip().split("\n")
        assert len(lines) == 7 and lines[-1].startswith("The answer is \\boxed{"), t
    assert 0.1 <= acc <= 0.85, acc


def test_build_toy_cli_hard_variant(tmp_path, capsys):
    threads = torch.get_num_threads()
    try:
        args = ["build-toy", "--task", "toy-hard", "--out", str(tmp_path), "--steps", "1", "--eval", "0"]
        assert cli.main(args) == 0
    finally:
        torch.set_num_threads(threads)
    built = json.loads((tmp_path / "warm_start.json").read_text())
    assert built["difficulty"] == 6 and built["steps"] == 1
    assert built["forget_rate"] == models.TOY_HARD_CONFIG.forget_rate
    assert (tmp_path / "model.safetensors").is_file()


def test_loading_bars_are_off_unless_the_environment_asks(monkeypatch, capfd):
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    try:
        for switch in (hf_logging.enable_progress_bar, hf_logging.disable_progress_bar):
            switch()  # whatever transformers' own switch says before, ours decides the load
            before = hf_logging.is_progress_bar_enabled()
            monkeypatch.delenv(hf_progress.ENV, raising=False)
            capfd.readouterr()
            load_model("toy")
            assert "Loading weights" not in capfd.readouterr().err
            monkeypatch.setenv(hf_progress.ENV, "1")
            load_model("toy")
            assert "Loading weights" in capfd.readouterr().err
            assert hf_logging.is_progress_bar_enabled() == before  # and is put back after it
    finally:
        (hf_logging.enable_progress_bar if was_on else hf_logging.disable_progress_bar)()
    monkeypatch.setenv(hf_progress.ENV, "maybe")
    with pytest.raises(ConfigError, match="TOKENCREDIT_PROGRESS_BARS='maybe'"):
        load_model("toy")


def test_free_variant_ships_fits_its_budget_and_is_the_default_task_with_free_words():
    free = models.toy_variant("toy-free")
    assert "--task toy-free" in free.rebuild_command
    assert json.loads((free.asset_dir / "warm_start.json").read_text()) == dataclasses.asdict(free.config)
    task = models.toy_task(seed=2, name="toy-free")
    assert task.phrasings == free.config.phrasings > 0
    plain = models.toy_task(seed=2)
    assert [p.problem for p in task.sample(50)] == [p.problem for p in plain.sample(50)]
    # the longest possible free-phrased solution (every step with the longest words) fits the budget
    longest_words = max(len(c) + 1 for c in CONNECTIVES[: task.phrasings]) + max(
        map(len, ENDINGS[: task.phrasings])
    )
    longest = max(len(p.solution) - len("Then ") * task.difficulty + 1 for p in task.sample(500, "train"))
    assert longest + longest_words * task.difficulty <= free.max_new_tokens


def test_free_warm_start_samples_free_words_and_leaves_room(one_thread):
    """Sampled held-out answers use several of the free connectives (high entropy where the reward does
    not look) and are right neither almost never nor almost always."""
    model, tk = load_model("toy-free")
    probs = models.toy_task(name="toy-free").sample(40, "heldout")
    acc = models.toy_accuracy(model, tk, probs, temperature=0.0, max_new_tokens=128)
    enc = tk([render("qwen-math", p.problem, tk) for p in probs[:16]], return_tensors="pt", padding=True)
    torch.manual_seed(0)
    out = model.generate(**enc, max_new_tokens=128, do_sample=True, top_k=0, top_p=1.0)
    firsts = [
        t.split(" ", 1)[0]
        for t in tk.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    ]
    assert len(set(firsts) & set(CONNECTIVES)) >= 3, firsts
    assert 0.1 <= acc <= 0.85, acc


def test_build_toy_set_overrides_and_init(tmp_path, capsys):
    threads = torch.get_num_threads()
    try:
        args = ["build-toy", "--out", str(tmp_path), "--steps", "1", "--eval", "0", "--set", "phrasings=2"]
        assert cli.main([*args, "--set", "init=toy"]) == 0
        capsys.readouterr()
        assert cli.main([*args, "--set", "phrasing=2"]) == 2
        assert "closest: phrasings" in capsys.readouterr().err
        assert cli.main(["build-toy", "--steps", "1", "--eval", "0", "--set", "phrasings=2"]) == 2
        assert "give --out" in capsys.readouterr().err
        assert cli.main([*args, "--set", "forget_rate=high"]) == 2
        assert "forget_rate must be a float" in capsys.readouterr().err
    finally:
        torch.set_num_threads(threads)
    built = json.loads((tmp_path / "warm_start.json").read_text())
    assert built["phrasings"] == 2 and built["init"] == "toy" and built["steps"] == 1
    # one step from the shipped toy's weights, not from a fresh model: still close to them
    new, old = load_file(tmp_path / "model.safetensors"), load_file(TOY_ASSET_DIR / "model.safetensors")
    assert new.keys() == old.keys()
    assert max(float((new[k] - old[k]).abs().max()) for k in new) < 0.05


def test_build_report_budget_fits_a_longer_chain_than_the_variants(tok):
    """`build-toy --task toy-hard --set difficulty=12` once scored 0 on every held-out problem because its
    report generated only toy-hard's 128 tokens; the budget now fits the longest reference solution."""
    from tokencredit.commands.build_toy import eval_budget

    hard = models.toy_variant("toy-hard")
    long_cfg = dataclasses.replace(hard.config, difficulty=12)
    problems = ArithmeticTask(difficulty=12, digits=2, operand_digits=1).sample(50, "heldout")
    longest = max(len(tok(p.solution)["input_ids"]) for p in problems) + 1
    assert longest > hard.max_new_tokens  # the case that failed
    assert eval_budget(hard.max_new_tokens, long_cfg, problems, tok) >= longest
    # the shipped variants' reports keep their budgets
    toy = models.toy_variant("toy")
    toy_problems = models.toy_task().sample(50, "heldout")
    assert eval_budget(toy.max_new_tokens, toy.config, toy_problems, tok) == 96
    assert eval_budget(hard.max_new_tokens, hard.config, [], tok) == hard.max_new_tokens

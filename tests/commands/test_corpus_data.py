"""The bad-input corpus of data, models and the probe's sizes (issue 39, items 2 and 5): each case runs the
real CLI entry point (`tokencredit train` / `tokencredit probe`) and must end within seconds with exit code
2 and one line on stderr naming the input (the config key, the option, file:line, the path), with no
traceback and, for `train`, no run directory left behind: every check runs before the work it guards
(problems built up front, a model loaded, rollouts sampled). Configuration keys are in
tests/commands/test_corpus_train.py."""

from __future__ import annotations

import importlib.util
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bad_input import one_line_error

SECONDS = 30  # generous: every case stops before any real work; most take well under a second


def _args(sets: list[str]) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def _train(tmp_path: Path, sets: list[str], capsys: pytest.CaptureFixture[str], names: list[str]) -> str:
    """`tokencredit train --recipe strace --out TMP/run --set ...`: exit 2, one line naming `names`, within
    `SECONDS`, and no run directory."""
    out = tmp_path / "run"
    t0 = time.perf_counter()
    line = one_line_error(
        ["train", "--recipe", "strace", "--out", str(out), *_args(sets)], capsys, names=names
    )
    assert time.perf_counter() - t0 < SECONDS, line
    assert not out.exists(), line  # a rejected configuration leaves no half-made run directory
    return line


def _probe(tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str], names: list[str]) -> str:
    """`tokencredit probe ARGV --out TMP/p/probe.json`: exit 2, one line naming `names`, within `SECONDS`, no output."""
    out = tmp_path / "p" / "probe.json"
    t0 = time.perf_counter()
    line = one_line_error(["probe", *argv, "--out", str(out)], capsys, names=names)
    assert time.perf_counter() - t0 < SECONDS, line
    assert not out.parent.exists(), line
    return line


# ---- reasoning-gym data (needs tokencredit[reasoning-gym]) --------------------------------------------

RG = "reasoning-gym:chain_sum"
GYM_CASES = [
    # (--set assignments beyond the micro run's, what the line must name)
    ([f"data.train={RG}?size=1000000000000"], ["size=1000000000000 is out of range", "1..100000"]),
    ([f"data.train={RG}?size=10**12"], ["size='10**12' is not an integer"]),
    ([f"data.train={RG}?size=-3"], ["size=-3 is out of range"]),
    ([f"data.train={RG}?size=2.5"], ["size='2.5' is not an integer"]),
    ([f"data.train={RG}?seed=x"], ["seed='x' is not an integer"]),
    ([f"data.train={RG}", "data.train_size=1000000"], ["data.train_size = 1000000", "above 100000"]),
    ([f"data.eval={RG}", "data.eval_size=1000000000000"], ["data.eval_size = 1000000000000", "above 100000"]),
    (["data.train=reasoning-gym:chain_sm"], ["no dataset 'chain_sm'", "closest: chain_sum"]),
    ([f"data.train={RG}?max_terms=abc"], ["max_terms: expected a value like 6, got 'abc'"]),
    ([f"data.train={RG}?max_term=3"], ["no parameter 'max_term'", "closest: max_terms"]),
    ([f"data.train={RG}?min_terms=5&max_terms=2"], ["reasoning-gym rejects the configuration"]),
]


@pytest.mark.extras
@pytest.mark.parametrize("sets, names", GYM_CASES, ids=[c[0][0][:48] for c in GYM_CASES])
def test_reasoning_gym_data(sets, names, tiny_model_dir, micro_sets, tmp_path, capsys):
    if importlib.util.find_spec("reasoning_gym") is None:
        pytest.skip("reasoning-gym is not installed (extra tokencredit[reasoning-gym])")
    _train(tmp_path, micro_sets(tiny_model_dir) + sets, capsys, names)


# ---- the toy task ---------------------------------------------------------------------------------------

TOY_CASES = [
    # the micro run: data.difficulty=1, digits 2: 1518 distinct training and 183 held-out problems
    (["data.train_size=100000"], ["data.train_size = 100000", "has only 1518 distinct training problems"]),
    (["data.train_size=1000000000000"], ["data.train_size = 1000000000000 is above 100000"]),
    (["data.difficulty=100000"], ["data.difficulty must be in 1..32"]),
    (["data.digits=9"], ["data.digits must be in 1..4"]),
    (["data.digits=0"], ["data.digits"]),
    (["data.digits=-2"], ["data.digits"]),
    (["data.eval_size=0"], ["data.eval_size = 0 gives no held-out problems"]),
    (["data.eval_size=1000000000000"], ["data.eval_size = 1000000000000 is above 100000"]),
    (["data.eval_size=500"], ["data.eval_size = 500", "has only 183 distinct held-out problems"]),
    (
        ["data.eval_split=validation", "data.train_size=1500", "data.eval_size=100"],
        ["data.train_size + data.eval_size = 1600", "has only 1518 distinct training problems"],
    ),
]


@pytest.mark.parametrize("sets, names", TOY_CASES, ids=[" ".join(c[0])[:48] for c in TOY_CASES])
def test_toy_task_sizes(sets, names, tiny_model_dir, micro_sets, tmp_path, capsys):
    _train(tmp_path, micro_sets(tiny_model_dir) + sets, capsys, names)


# ---- data files -----------------------------------------------------------------------------------------

OK_LINE = b'{"id": "a", "problem": "1+1", "answer": "2"}\n'
FILE_CASES: list[tuple[str, Callable[[Path], None], list[str]]] = [
    # (the file's name, how to make it, what the line must name after its path)
    (
        "binary.jsonl",
        lambda p: p.write_bytes(bytes(range(128, 256)) * 4),
        [":1:1: not UTF-8 text (byte 0x80"],
    ),
    (
        "latin1.jsonl",
        lambda p: p.write_bytes(OK_LINE + '{"problem": "café", "answer": "2"}\n'.encode("latin-1")),
        [":2:17: not UTF-8 text (byte 0xe9", "iconv -f latin1"],
    ),
    (
        "utf16.jsonl",
        lambda p: p.write_bytes(OK_LINE.decode().encode("utf-16")),
        [":1:1: not UTF-8 text", "UTF-16"],
    ),
    ("nul.jsonl", lambda p: p.write_bytes(OK_LINE + b"\0\0\0\n"), [":2:1: a NUL character"]),
    (
        "deep.jsonl",
        lambda p: p.write_text("[" * 100_000 + "]" * 100_000 + "\n"),
        [":1: JSON nested too deeply"],
    ),
    (
        "array.jsonl",
        lambda p: p.write_text('[{"problem": "1+1", "answer": "2"}]\n'),
        [":1: expected a JSON object (one problem per line), got an array", "one object per line"],
    ),
    (
        "string.jsonl",
        lambda p: p.write_bytes(OK_LINE + b'"x"\n'),
        [":2: expected a JSON object", "got a string"],
    ),
    (
        "number.jsonl",
        lambda p: p.write_bytes(OK_LINE + b"7\n"),
        [":2: expected a JSON object", "got a number"],
    ),
    ("empty.jsonl", lambda p: p.write_bytes(b""), ["data.train = ", "gave no problems"]),
    ("blank.jsonl", lambda p: p.write_bytes(b"\n  \n"), ["data.train = ", "gave no problems"]),
    ("notes.txt", lambda p: p.write_text("1+1=2\n"), [": unknown data format '.txt'"]),
    (
        "folder",
        lambda p: (p.mkdir(), (p / "x.jsonl").write_bytes(OK_LINE)),
        [": a directory, but not a `datasets` directory", "it holds x.jsonl"],
    ),
]


@pytest.mark.parametrize("name, make, names", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_bad_data_files(name, make, names, tiny_model_dir, micro_sets, tmp_path, capsys):
    path = tmp_path / name
    make(path)
    _train(tmp_path, micro_sets(tiny_model_dir, **{"data.train": path}), capsys, [str(path), *names])


def test_a_missing_eval_file(tiny_model_dir, micro_sets, tmp_path, capsys):
    missing = tmp_path / "eval.jsonl"
    _train(
        tmp_path, micro_sets(tiny_model_dir, **{"data.eval": missing}), capsys, [f"{missing}: no such file"]
    )


# ---- models ---------------------------------------------------------------------------------------------


def _model_dir(src: str, dst: Path, files: tuple[str, ...] | None = None) -> Path:
    """A copy of the model directory `src` (only `files` when given)."""
    dst.mkdir()
    for f in Path(src).iterdir():
        if files is None or f.name in files:
            shutil.copy(f, dst / f.name)
    return dst


def _set_config(d: Path, **changes: object) -> None:
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **changes}))


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


MODEL_DIR_CASES: list[tuple[str, Callable[[str, Path], Path], list[str]]] = [
    ("empty folder", lambda src, d: (d.mkdir(), d)[1], ["is not a Hugging Face model: no config.json"]),
    (
        "only config.json",
        lambda src, d: _model_dir(src, d, ("config.json",)),
        ["has no weights", "model.safetensors"],
    ),
    (
        "broken config.json",
        lambda src, d: (_model_dir(src, d), (d / "config.json").write_text('{"model_type": "qwen3",\n'))[0],
        ["config.json:2:1: the model's config is not valid JSON"],
    ),
    (
        "unknown architecture",
        lambda src, d: (_model_dir(src, d), _set_config(d, model_type="frobnicator"))[0],
        ["config.json: model_type 'frobnicator' is not an architecture transformers"],
    ),
    (
        "not a causal LM",
        lambda src, d: (_model_dir(src, d), _set_config(d, model_type="clip"))[0],
        ["config.json: model_type 'clip' is not a causal language model"],
    ),
    (
        "no tokenizer",
        lambda src, d: _model_dir(src, d, ("config.json", "model.safetensors")),
        ["has no tokenizer"],
    ),
    (
        "truncated weights",
        lambda src, d: (_model_dir(src, d), _truncate(d / "model.safetensors"))[0],
        ["model.safetensors: truncated"],
    ),
    (
        "a missing shard",
        lambda src, d: (
            _model_dir(src, d, ("config.json", "tokenizer.json", "tokenizer_config.json")),
            (d / "model.safetensors.index.json").write_text(
                json.dumps({"weight_map": {"w": "model-00001-of-00002.safetensors"}})
            ),
        )[0],
        [
            "model.safetensors.index.json: 1 of its 1 weight shard(s) are missing",
            "model-00001-of-00002.safetensors",
        ],
    ),
    (
        "a damaged tokenizer.json",
        lambda src, d: (_model_dir(src, d), (d / "tokenizer.json").write_text("{garbage"))[0],
        ["cannot load the tokenizer of model directory"],
    ),
]


@pytest.mark.parametrize("what, make, names", MODEL_DIR_CASES, ids=[c[0] for c in MODEL_DIR_CASES])
def test_model_directories_that_are_not_models(
    what, make, names, tiny_model_dir, micro_sets, tmp_path, capsys
):
    d = make(tiny_model_dir, tmp_path / "model")
    _train(tmp_path, micro_sets(str(d)), capsys, [str(d), *names])


@pytest.mark.skipif(Path("/etc/config.json").exists(), reason="this machine's /etc holds a config.json")
def test_etc_is_not_a_model(micro_sets, tmp_path, capsys):
    _train(
        tmp_path,
        micro_sets("/etc"),
        capsys,
        ["model directory '/etc' is not a Hugging Face model: no config.json"],
    )


def _write_gguf(path: Path, *, arch: str = "llama", tokenizer: bool = True) -> Path:
    """A small GGUF file: an architecture, a token list (with `tokenizer`) and one F32 tensor."""
    gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (pip install -e '.[test]')")
    w = gguf.GGUFWriter(str(path), arch)
    if tokenizer:
        w.add_tokenizer_model("gpt2")
        w.add_token_list(["<|endoftext|>", "a", "b"])
    w.add_tensor("token_embd.weight", np.zeros((3, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


GGUF_CASES: list[tuple[str, Callable[[Path], None], list[str]]] = [
    ("empty", lambda p: p.write_bytes(b""), ["the GGUF file is empty"]),
    ("random", lambda p: p.write_bytes(bytes(range(256)) * 20), ["not a GGUF file (it starts with"]),
    (
        "truncated in its tensors",
        lambda p: _truncate(_write_gguf(p), 0.9),
        ["truncated GGUF file", "'token_embd.weight'"],
    ),
    (
        "truncated in its header",
        lambda p: _truncate(_write_gguf(p), 0.05),
        ["truncated GGUF file (it ends inside"],
    ),
    (
        "an unsupported architecture",
        lambda p: _write_gguf(p, arch="frobnicator"),
        ["GGUF architecture 'frobnicator' is not supported"],
    ),
    (
        "no tokenizer",
        lambda p: _write_gguf(p, tokenizer=False),
        ["holds no tokenizer (tokenizer.ggml.tokens)"],
    ),
]


@pytest.mark.parametrize("what, make, names", GGUF_CASES, ids=[c[0] for c in GGUF_CASES])
def test_bad_gguf_files(what, make, names, micro_sets, tmp_path, capsys):
    pytest.importorskip("gguf", reason="the gguf package is not installed (pip install -e '.[test]')")
    path = tmp_path / "model.gguf"
    make(path)
    _train(tmp_path, micro_sets(str(path)), capsys, [str(path), *names])


# ---- the probe's sizes and inputs ------------------------------------------------------------------------

PROBE_CASES = [
    # (options beyond --model, what the line must name)
    (["--groups", "1000000"], ["--groups 1000000", "33,554,432", "at most --groups 43690"]),
    (
        ["--groups", "30000", "--difficulty", "2"],
        ["--groups 30000", "at most 2921 distinct held-out problems"],
    ),
    (["--group-size", "100000000"], ["--group-size 100000000", "above the probe's bound"]),
    (["--max-new-tokens", "100000000"], ["--max-new-tokens 100000000", "above the probe's bound"]),
    (["--oracle", "1000000"], ["--oracle 1000000", "268,435,456", "at most --oracle"]),
    (["--bootstrap", "1000000000"], ["--bootstrap must be 0 (no standard errors) or 2..10000"]),
    (["--random-draws", "100000"], ["--random-draws must be in 1..10000"]),
    (["--batch-size", "1000000"], ["--batch-size 1000000", "at most --batch-size"]),
    (["--difficulty", "0"], ["--difficulty must be in 1..32, got 0"]),
    (["--difficulty", "100000"], ["--difficulty must be in 1..32, got 100000"]),
    (["--digits", "9"], ["--digits must be in 1..4, got 9"]),
    (["--operand-digits", "3"], ["--operand-digits must be in 1..2"]),
    (["--seed", "-1"], ["--seed must be in 0.."]),
    (["--temperature", "nan"], ["--temperature must be a finite number > 0"]),
    (["--threads", "100000"], ["--threads must be in 0..1024"]),
    (["--ks", "1,99999999999999999999"], ["--ks: expected integers in 1..1000000"]),
]


@pytest.mark.parametrize("argv, names", PROBE_CASES, ids=[" ".join(c[0])[:40] for c in PROBE_CASES])
def test_probe_sizes(argv, names, tiny_model_dir, tmp_path, capsys):
    _probe(tmp_path, ["--model", tiny_model_dir, *argv], capsys, names)


def test_probe_data_files_are_read_before_the_model_loads(tiny_model_dir, tmp_path, capsys):
    bad = tmp_path / "d.jsonl"
    bad.write_bytes(OK_LINE + b'{"problem": \n')
    _probe(
        tmp_path,
        ["--model", tiny_model_dir, "--data", str(bad), "--oracle", "2"],
        capsys,
        [f"{bad}:2:13: malformed JSON line"],
    )


@pytest.mark.extras
def test_probe_reasoning_gym_data_is_checked_before_the_model_loads(tiny_model_dir, tmp_path, capsys):
    if importlib.util.find_spec("reasoning_gym") is None:
        pytest.skip("reasoning-gym is not installed (extra tokencredit[reasoning-gym])")
    spec = f"{RG}?size=10**12"
    _probe(tmp_path, ["--model", tiny_model_dir, "--data", spec, "--oracle", "2"], capsys, ["size='10**12'"])


@pytest.mark.skipif(Path("/etc/config.json").exists(), reason="this machine's /etc holds a config.json")
def test_probe_of_a_directory_that_is_not_a_model(tmp_path, capsys):
    _probe(tmp_path, ["--model", "/etc"], capsys, ["model directory '/etc' is not a Hugging Face model"])


def test_probe_of_a_random_gguf_file(tmp_path, capsys):
    pytest.importorskip("gguf", reason="the gguf package is not installed (pip install -e '.[test]')")
    path = tmp_path / "x.gguf"
    path.write_bytes(bytes(range(256)))
    _probe(tmp_path, ["--model", str(path)], capsys, [str(path), "not a GGUF file"])

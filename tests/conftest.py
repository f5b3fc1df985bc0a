"""Shared fixtures: a tiny random Qwen3 model on disk and the micro trainer configuration.

tests/train/test_trainer.py and the reliability tests share them, so a trainer test anywhere runs in
seconds on CPU with nothing downloaded. `byte_tokenizer` and `tiny_qwen3` (imported with
`from conftest import ...`) build the byte-level tokenizer and random Qwen3 of the generation,
signal and evaluation tests. `full_disk` simulates a disk that fills up during a chosen write.
"""

from __future__ import annotations

import ast
import errno
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `pytest -n auto` runs one worker per core; torch's default of one thread per core in each worker (and in
    # the runs a test starts, which inherit this) would put cores x cores threads on the cores, and tiny ops
    # only wait on each other: a 35 s critic test took 18 minutes at 2 threads on 2 busy cores.
    os.environ["OMP_NUM_THREADS"] = "1"

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

TESTS = Path(__file__).resolve().parent
# `reward.function=_toy_rewards:has_digit_seven` is imported from here (also by subprocesses: PYTHONPATH).
TOY_REWARDS_DIR = TESTS / "train"
TINY_CONFIG = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
}
# Architecture of `tiny_qwen3` (vocabulary, context length and tying are the caller's).
TINY_QWEN3 = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
}
BYTE_PAD, BYTE_EOS = 0, 1  # ids of <pad> / <eos> in `byte_tokenizer`


def byte_tokenizer(with_pad: bool = True) -> PreTrainedTokenizerFast:
    """Byte-level tokenizer with one token per byte (no merges), ids 0/1 = <pad>/<eos>.

    with_pad=False leaves `pad_token` unset (the vocabulary still holds <pad>).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": BYTE_PAD, "<eos>": BYTE_EOS}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    kw = {"pad_token": "<pad>"} if with_pad else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", **kw)


def tiny_qwen3(vocab_size: int, seed: int = 0, **config: Any) -> Qwen3ForCausalLM:
    """A random `Qwen3ForCausalLM` of architecture `TINY_QWEN3` updated by `config`, initialised
    after `torch.manual_seed(seed)`."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    return Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab_size, **{**TINY_QWEN3, **config}))


def _train_with_recording_example(tmp_path, monkeypatch, recording: str, spec: str, model_dir: str) -> list:
    """One micro training step scored by `spec`, a function of examples/custom_reward.py, recorded in the
    reward's worker process: `recording` is a module named ``custom_reward`` put ahead of examples/ on the
    path (it loads the real example from $EXAMPLE_FILE and appends each call to $CALLS_LOG as a JSON
    line). The run goes to tmp_path/run; returns the recorded calls, in order."""
    from tokencredit.train.config import load_config
    from tokencredit.train.trainer import Trainer

    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "custom_reward.py").write_text(recording)
    monkeypatch.syspath_prepend(str(shadow))
    monkeypatch.setenv(
        "EXAMPLE_FILE", str(Path(__file__).resolve().parents[1] / "examples" / "custom_reward.py")
    )
    monkeypatch.setenv("CALLS_LOG", str(tmp_path / "calls.jsonl"))
    cfg = load_config(sets=_micro_sets(model_dir, steps=1) + [f"reward.function={spec}"], recipe="grpo")
    Trainer(cfg, tmp_path / "run").fit()
    return [json.loads(x) for x in (tmp_path / "calls.jsonl").read_text().splitlines()]


def _micro_sets(model_dir: str, steps: int = 2, **extra: object) -> list[str]:
    """`--set` overrides of the micro run: 2 prompts x 4 completions of up to 12 tokens, no evaluation
    before the end, a checkpoint every step, the in-process `_toy_rewards` reward."""
    sets = [
        f"model.name={model_dir}",
        f"run.steps={steps}",
        "run.progress=false",
        "run.threads=2",
        "rollout.prompts_per_step=2",
        "rollout.group_size=4",
        "rollout.max_new_tokens=12",
        "rollout.max_resample_rounds=1",
        "data.train_size=40",
        "data.eval_size=3",
        "data.difficulty=1",
        "eval.every=0",
        "eval.samples=0",
        "eval.at_start=false",
        "eval.save_groups=1",
        "checkpoint.every=1",
        "reward.function=_toy_rewards:has_digit_seven",
        "optim.lr=1e-2",
        "optim.warmup_steps=0",
    ]
    return sets + [f"{k}={v}" for k, v in extra.items()]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tokencredit import models

    d = tmp_path_factory.mktemp("tiny")
    tok = models.build_toy_tokenizer()
    models.build_toy_model(TINY_CONFIG, tokenizer=tok).save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


@pytest.fixture
def micro_sets(toy_rewards: str) -> Callable[..., list[str]]:
    """`micro_sets(model_dir, steps=2, **{"section.key": value})` -> the micro run's `--set` list."""
    return _micro_sets


@pytest.fixture
def toy_rewards(monkeypatch: pytest.MonkeyPatch) -> str:
    """Make `_toy_rewards` importable in this process; returns its directory (for a subprocess's PYTHONPATH)."""
    monkeypatch.syspath_prepend(str(TOY_REWARDS_DIR))
    return str(TOY_REWARDS_DIR)


class FullDisk:
    """A stand-in for `os.write` that fills the disk under `root`: write number `after` + 1 to the
    file named `target` (a temporary `.NAME.tmp-PID` of an atomic write counts as NAME) stores only
    its first `partial` bytes (a short write, as the kernel does), and from then on every write under
    `root` fails with `err` (ENOSPC; EROFS for a file system that turned read-only). Other files are
    written normally. Linux: paths come from /proc/self/fd."""

    def __init__(
        self, root: Path, target: str, after: int = 0, partial: int = 8, err: int = errno.ENOSPC
    ) -> None:
        self.root, self.target, self.after, self.partial = os.path.realpath(root), target, after, partial
        self.err = err
        self.full = False
        self.real = os.write

    def __call__(self, fd: int, data: Any) -> int:
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return self.real(fd, data)
        if not path.startswith(self.root + os.sep):
            return self.real(fd, data)
        if self.full:
            raise OSError(self.err, os.strerror(self.err))
        if re.sub(r"^\.(.+)\.tmp-\d+$", r"\1", os.path.basename(path)) == self.target:
            if self.after == 0:
                self.full = True
                return self.real(fd, bytes(memoryview(data)[: self.partial]))
            self.after -= 1
        return self.real(fd, data)


@pytest.fixture
def full_disk() -> Iterator[Callable[..., FullDisk]]:
    """`full_disk(root, target, after=0, partial=8, err=ENOSPC)` patches `os.write` with a `FullDisk`,
    undone at the end of the test or earlier by the returned disk's `undo()` (space is back). Its own
    patch: undoing it leaves the test's other patches (a reward module's sys.path entry) in place."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd to know which file a write goes to")
    patch = pytest.MonkeyPatch()

    def make(root: Path, target: str, after: int = 0, partial: int = 8, err: int = errno.ENOSPC) -> FullDisk:
        disk = FullDisk(Path(root), target, after, partial, err)
        patch.setattr(os, "write", disk)
        disk.undo = patch.undo  # type: ignore[attr-defined]
        return disk

    yield make
    patch.undo()


# ------------------------------------------------------------------------------ optional extras
# A test that needs an optional extra (tokencredit[trl], tokencredit[verl], tokencredit[data]) skips
# without it, with a reason naming the extra ("... (extra tokencredit[verl])"), and is marked `extras`
# (`pytestmark = pytest.mark.extras` for a module): `python -m pytest -q` runs everything else with
# `pip install -e ".[test]"` alone, and CI's second pass runs `python -m pytest -q -m extras` once the
# extras are installed. So that no test falls between the two passes: a test skipped for a missing
# extra but not marked `extras` fails, and with TOKENCREDIT_TEST_EXTRAS=1 (the extras are meant to be
# installed: .ci/run's second pass) any skip for a missing extra fails.
EXTRA_REASON = "tokencredit["
EXTRAS_REQUIRED = os.environ.get("TOKENCREDIT_TEST_EXTRAS") == "1"


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    return str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


def _extras_problem(reason: str, marked: bool) -> str | None:
    if EXTRA_REASON not in reason:
        return None
    if EXTRAS_REQUIRED:
        return f"TOKENCREDIT_TEST_EXTRAS=1 but an optional extra is missing: {reason}"
    if not marked:
        return (
            f"skipped for a missing optional extra but not marked `extras` (CI would never run it): {reason}"
        )
    return None


def pytest_configure(config: pytest.Config) -> None:
    # The same, in case a plugin imported torch before OMP_NUM_THREADS was set.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    if report.skipped and not hasattr(report, "wasxfail"):
        problem = _extras_problem(_skip_reason(report), item.get_closest_marker("extras") is not None)
        if problem:
            report.outcome, report.longrepr = "failed", problem
    return report


def _module_marked_extras(path: Path) -> bool:
    """Whether the module's top-level `pytestmark` names `pytest.mark.extras` (alone or in a list), however
    the assignment is laid out: read from the syntax tree, since the module could not be imported."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
            return any(ast.unparse(n) == "pytest.mark.extras" for n in ast.walk(node.value))
    return False


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    report = yield
    if report.skipped and isinstance(collector, pytest.Module):
        # a module skipped at import (module-level importorskip): its `pytestmark` is read from the source
        problem = _extras_problem(_skip_reason(report), _module_marked_extras(collector.path))
        if problem:
            report.outcome, report.longrepr = "failed", problem
    return report


# ------------------------------------------------------------------------------ CI's two passes
# .ci/run's first pass runs the README's command; on a machine that already has some extras, the tests
# that need them run (and pass) there. TOKENCREDIT_TEST_RECORD=FILE makes a run write the node ids of
# the tests that passed to FILE; TOKENCREDIT_TEST_PASSED=FILE makes the second pass deselect the tests
# listed there, so that no test runs twice. Only the controlling process writes (under pytest-xdist the
# workers' reports reach it too).
RECORD_FILE = os.environ.get("TOKENCREDIT_TEST_RECORD")
PASSED_FILE = os.environ.get("TOKENCREDIT_TEST_PASSED")
_passed: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if RECORD_FILE and report.when == "call" and report.passed:
        _passed.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if RECORD_FILE and not hasattr(session.config, "workerinput"):  # not an xdist worker
        Path(RECORD_FILE).write_text("".join(f"{nodeid}\n" for nodeid in _passed), encoding="utf-8")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not PASSED_FILE:
        return
    done = set(Path(PASSED_FILE).read_text(encoding="utf-8").splitlines())
    again = [item for item in items if item.nodeid in done]
    if again:
        config.hook.pytest_deselected(items=again)
        items[:] = [item for item in items if item.nodeid not in done]


def crash_then_resume(cfg: Any, run_dir: Path, crash_at: int, resumed_from: int) -> Any:
    """Train `cfg` into `run_dir`, crash before step index `crash_at`, assert the resume starts after step
    `resumed_from` (the newest checkpoint), finish the run and return the resumed Trainer."""
    import pytest

    from tokencredit.train.trainer import Trainer

    class Crash(Exception):
        pass

    t = Trainer(cfg, run_dir)
    real_step = t.step

    def step_then_crash(i: int) -> Any:
        if i == crash_at:
            raise Crash
        return real_step(i)

    t.step = step_then_crash  # type: ignore[method-assign]
    with pytest.raises(Crash):
        t.fit()
    resumed = Trainer(cfg, run_dir, resume=True)
    assert resumed.step_done == resumed_from
    resumed.fit()
    return resumed

"""`reward.function` in TRL's contract: detected from the signature or chosen by `reward.contract`, called in
its worker with TRL's keywords (prompts, completions, completion ids, the problem's fields, trainer_state,
log_extra / log_metric); a bad contract value and a function that does not fit its contract are one line."""

import json
import os
import re
import tomllib
from pathlib import Path

import pytest

from conftest import _train_with_recording_example
from tokencredit.data import Problem
from tokencredit.errors import ConfigError
from tokencredit.rewards import Reward
from tokencredit.rewards._custom_worker import detect_contract
from tokencredit.rewards.custom import check_contract, problem_columns
from tokencredit.train.config import load_config, validate_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _tokencredit_style(completions, golds, **kwargs): ...
def _with_default_gold(completions, golds=None, **kwargs): ...
def _varargs(*args, **kwargs): ...
def _trl_full(prompts, completions, completion_ids, **kwargs): ...
def _trl_len(completions, **kwargs): ...
def _trl_keywords_only(*, completions, answer, **kwargs): ...
def _trl_column(completions, completion_ids, answer, **kwargs): ...
def _trl_state(completions, golds, trainer_state=None, **kwargs): ...


@pytest.mark.parametrize(
    ("fn", "contract"),
    [
        (_tokencredit_style, "tokencredit"),
        (_with_default_gold, "tokencredit"),
        (_varargs, "tokencredit"),
        (_trl_full, "trl"),
        (_trl_len, "trl"),  # cannot take the golds as a second positional argument
        (_trl_keywords_only, "trl"),
        (_trl_column, "trl"),
        (_trl_state, "trl"),  # names a keyword only TRL passes
        (len, "trl"),  # one positional argument
        (print, "tokencredit"),  # *args
    ],
)
def test_the_contract_is_read_from_the_signature(fn, contract):
    assert detect_contract(fn) == contract


def test_problem_columns_are_the_fields_of_the_records():
    problems = [Problem("a", "1 + 1?", "2"), Problem("b", "2 + 2?", ["4", "four"])]
    assert problem_columns(problems) == {
        "id": ["a", "b"],
        "problem": ["1 + 1?", "2 + 2?"],
        "answer": ["2", ["4", "four"]],
    }
    assert problem_columns([{"x": 1, "y": 2}, {"x": 3}]) == {"x": [1, 3]}  # the fields all records share
    assert problem_columns([]) == {}


MODULE = """
import json, os

def _record(**kw):
    state = kw.pop("trainer_state")
    for name in ("log_extra", "log_metric"):  # TRL's logging hooks can be called
        hook = kw.pop(name)
        hook("col", [1.0]) if name == "log_extra" else hook("m", 1.0)
    kw["trainer_state"] = {"global_step": state.global_step, "max_steps": state.max_steps}
    with open(os.environ["CALLS_LOG"], "a") as f:
        f.write(json.dumps(kw, default=repr) + "\\n")

def trl_full(prompts, completions, completion_ids, **kwargs):
    _record(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs)
    return [float(len(ids or [])) for ids in completion_ids]

def reward_len(completions, **kwargs):
    return [-abs(20 - len(c)) / 20 for c in completions]

def flexible(completions, golds=None, **kwargs):
    return [2.0 if "prompts" in kwargs else 1.0 for _ in completions]

def needs_solution(completions, solution, completion_ids, **kwargs):
    return [1.0 for _ in completions]
"""


@pytest.fixture
def module(tmp_path, monkeypatch):
    (tmp_path / "contract_rewards_mod.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))  # the worker gets this process's sys.path
    monkeypatch.setenv("CALLS_LOG", str(tmp_path / "calls.jsonl"))
    return tmp_path


def _calls(module):
    return [json.loads(x) for x in (module / "calls.jsonl").read_text().splitlines()]


def test_a_trl_function_receives_trl_keywords(module):
    problems = [Problem("p-1", "Compute 1 + 1.", "2"), Problem("p-2", "Compute 2 + 5.", ["7", "seven"])]
    with Reward("contract_rewards_mod:trl_full", max_steps=9) as r:
        got = r.verify(
            ["\\boxed{2}", "7"],
            ["2", ["7", "seven"]],
            prompts=["<user>Compute 1 + 1.</user>", "<user>Compute 2 + 5.</user>"],
            completion_ids=[[5, 6, 7], [8]],
            problems=problems,
            step=3,
            weight=0.5,
        )
        assert got.scores == [3.0, 1.0]
        assert r.user is not None and r.user.called_as == "trl"
    (call,) = _calls(module)
    assert call == {
        "prompts": ["<user>Compute 1 + 1.</user>", "<user>Compute 2 + 5.</user>"],
        "completions": ["\\boxed{2}", "7"],
        "completion_ids": [[5, 6, 7], [8]],
        "id": ["p-1", "p-2"],
        "problem": ["Compute 1 + 1.", "Compute 2 + 5."],
        "answer": ["2", ["7", "seven"]],
        "weight": 0.5,
        "trainer_state": {"global_step": 3, "max_steps": 9},
    }


def test_without_a_context_trl_gets_the_golds_as_the_answer_column(module):
    # the Monte-Carlo continuations of the oracle recipes are scored with texts and golds only
    with Reward("contract_rewards_mod:trl_full") as r:
        assert r(["a", "b"], ["1", "2"]) == [0.0, 0.0]  # no ids: None for each
    (call,) = _calls(module)
    assert call["prompts"] == [None, None] and call["completion_ids"] == [None, None]
    assert call["answer"] == ["1", "2"] and "id" not in call
    assert call["trainer_state"] == {"global_step": 0, "max_steps": 0}


def test_a_trl_len_reward_needs_no_golds(module):
    with Reward("contract_rewards_mod:reward_len") as r:
        assert r(["x" * 20, "x" * 10], ["1", "1"]) == [0.0, -0.5]
        assert r.user is not None and r.user.called_as == "trl"


def test_an_explicit_contract_overrides_the_signature(module):
    with Reward("contract_rewards_mod:flexible") as r:  # golds positional: ours
        assert r(["a"], ["1"]) == [1.0] and r.user.called_as == "tokencredit"
    with Reward("contract_rewards_mod:flexible", contract="trl") as r:
        assert r(["a"], ["1"]) == [2.0] and r.user.called_as == "trl"
    with Reward(
        "contract_rewards_mod:reward_len", contract="tokencredit"
    ) as r:  # a TRL function, called as ours
        with pytest.raises(ConfigError) as e:
            r.check(Problem("p-1", "q", "1"))
    message = str(e.value)
    assert "\n" not in message
    assert re.search(
        r"failed its start-up check .*: it cannot take the arguments of the tokencredit contract, "
        r"f\(completions, golds, \*\*kwargs\) \(given: completions, golds\): too many positional arguments; "
        r"set reward\.contract = 'trl' for f\(prompts, completions, completion_ids, \*\*columns\)$",
        message,
    ), message


def test_a_trl_function_missing_a_column_is_named_at_the_start_up_check(module):
    with Reward("contract_rewards_mod:needs_solution") as r, pytest.raises(ConfigError) as e:
        r.check(Problem("p-1", "q", "1"))
    assert "cannot take the arguments of the trl contract" in str(e.value)
    assert "missing a required argument: 'solution'" in str(e.value)
    assert "set reward.contract = 'tokencredit'" in str(e.value)


@pytest.mark.parametrize(
    ("value", "closest"),
    [("trll", "(closest: trl)"), ("TRL", ""), ("tokencredits", "(closest: tokencredit)")],
)
def test_a_bad_contract_value_is_one_line_naming_the_key(value, closest):
    with pytest.raises(
        ConfigError, match=r"^reward\.contract must be one of auto, tokencredit, trl, got "
    ) as e:
        check_contract(value)
    assert str(e.value).endswith(closest) and "\n" not in str(e.value)
    cfg = load_config(sets=[f"reward.contract={value}", "reward.function=mod:fn"])
    with pytest.raises(ConfigError, match=r"^reward\.contract must be one of"):
        validate_config(cfg)
    with pytest.raises(ConfigError, match=r"^reward\.contract must be one of"):
        Reward("mod:fn", contract=value)


def test_a_contract_for_a_built_in_reward_is_refused():
    cfg = load_config(sets=["reward.contract=trl", "reward.function=math"])
    with pytest.raises(
        ConfigError,
        match=r"^reward\.contract applies to a module:function reward, not to the built-in 'math'",
    ):
        validate_config(cfg)
    with pytest.raises(ConfigError, match=r"applies to a module:function reward"):
        Reward("math", contract="trl")
    validate_config(
        load_config(sets=["reward.contract=trl", "reward.function=mod:fn"])
    )  # a user function: fine


# ---- the documented TRL-style example -----------------------------------------------------------------


def _doc_block() -> str:
    """The python block under docs/inputs.md's "TRL's reward contract"."""
    text = (ROOT / "docs" / "inputs.md").read_text(encoding="utf-8")
    section = text.split("#### TRL's reward contract", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_documented_trl_function_is_the_example_verbatim():
    block = _doc_block()
    assert block.startswith("def boxed_answer_reward(")
    assert block in (EXAMPLES / "custom_reward.py").read_text(encoding="utf-8")


@pytest.fixture
def example_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def test_the_documented_trl_function_scores_through_reward(example_on_path):
    with Reward("custom_reward:boxed_answer_reward") as r:
        got = r.verify(
            ["so \\boxed{72}", "\\boxed{7}", "\\boxed{x^2}"],
            ["72", ["70", "71"], ["2x", "x^2"]],
            completion_ids=[[1] * 10, [2] * 3, []],
            problems=[
                Problem("a", "q", "72"),
                Problem("b", "q", ["70", "71"]),
                Problem("c", "q", ["2x", "x^2"]),
            ],
        )
        assert got.scores == pytest.approx([0.99, -0.003, 1.0])
        assert r.user.called_as == "trl"


# The example as the trainer's worker imports it, each call recorded: a module of the same name ahead of
# examples/ on the path, with the example's own signature (so the contract is detected as for the example).
RECORDING_EXAMPLE = """
import importlib.util, json, os

_spec = importlib.util.spec_from_file_location("_the_example", os.environ["EXAMPLE_FILE"])
_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_example)


def boxed_answer_reward(completions, completion_ids, answer, **kwargs):
    rewards = _example.boxed_answer_reward(completions, completion_ids, answer, **kwargs)
    state = kwargs["trainer_state"]
    record = {
        "completions": completions, "completion_ids": completion_ids, "answer": answer,
        "trainer_state": [state.global_step, state.max_steps], "rewards": rewards, "pid": os.getpid(),
        **{k: v for k, v in kwargs.items() if k not in ("trainer_state", "log_extra", "log_metric")},
    }
    with open(os.environ["CALLS_LOG"], "a") as f:
        f.write(json.dumps(record, default=repr) + "\\n")
    return rewards
"""


def test_a_training_step_calls_the_trl_function_with_what_the_model_saw(
    example_on_path, tiny_model_dir, tmp_path, monkeypatch
):
    from tokencredit.data.templates import render
    from tokencredit.models import load_model

    spec = "custom_reward:boxed_answer_reward"
    calls = _train_with_recording_example(tmp_path, monkeypatch, RECORDING_EXAMPLE, spec, tiny_model_dir)
    template = tomllib.loads((tmp_path / "run" / "config.toml").read_text())["data"]["template"]
    check, step = calls[0], [c for c in calls if len(c["completions"]) == 2 * 4]
    assert len(step) == 1, (
        f"the trainer called the reward on {[len(c['completions']) for c in calls]} completions"
    )
    (call,) = step
    assert check["completion_ids"] == [[], []] and check["prompts"] == [check["problem"][0]] * 2
    _, tok = load_model(tiny_model_dir)
    n = len(call["completions"])
    assert {"prompts", "completions", "completion_ids", "id", "problem", "answer", "solution"} <= set(call)
    assert all(
        len(call[k]) == n for k in ("prompts", "completion_ids", "id", "problem", "answer", "solution")
    )
    for prompt, problem, text, ids in zip(
        call["prompts"], call["problem"], call["completions"], call["completion_ids"]
    ):
        assert prompt == render(template, problem, tok)  # the prompt as the model saw it
        assert ids and all(isinstance(i, int) for i in ids)
        assert tok.decode(ids, skip_special_tokens=True) == text  # the ids of that very completion
    assert len(set(call["problem"])) == 2 and call["trainer_state"] == [0, 1]
    saved = tomllib.loads((tmp_path / "run" / "config.toml").read_text())
    assert saved["reward"]["function"] == spec and saved["reward"]["contract"] == "auto"
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    rewards = call["rewards"]
    assert metrics["reward"] == pytest.approx(sum(rewards) / len(rewards))
    assert any(r != round(r) for r in rewards)  # the length term: the function's own values were trained on
    assert call["pid"] != os.getpid()

"""The bad-input corpus: user reward functions (``reward.function = "module:function"``, issue 39).

Each case runs the real `tokencredit train` on the micro config with a reward that breaks the
contract (one real number per completion) in one way, and requires one line on stderr naming the
function, the completion (or the call) and what came back, and the right exit code: 2 when the
start-up check (`Reward.check`, before any model loads) catches it, 1 ("training stopped: step 1:
...") when it shows only on real rollouts. The function runs in a worker process, so nothing it does
(``sys.exit``, ``os._exit``, a KeyboardInterrupt) ends the trainer silently. A reward that runs past
``reward.timeout`` is not an error: it scores 0 and is counted in ``verify_timeouts``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bad_input import one_line_error
from tokencredit import cli

MODULE = "corpus_rewards"

# Each function misbehaves on every call, or ("_later") from its second call on: the first is the
# trainer's start-up check (2 completions), the second step 1's rollouts (2 prompts x 4 = 8).
REWARDS = """
import os, sys, time
calls = 0


def _real_rollouts():
    global calls
    calls += 1
    return calls > 1


def dict_return(completions, golds, **kw):
    return {c: 1.0 for c in completions}


def numeric_string(completions, golds, **kw):
    return ["1.0"] * len(completions)


def numeric_string_later(completions, golds, **kw):
    later = _real_rollouts()
    return ["0.5" if later and i == 2 else 0.5 for i in range(len(completions))]


def bools(completions, golds, **kw):
    return [c == "" for c in completions]


def raises_later(completions, golds, **kw):
    if _real_rollouts():
        raise ValueError("boom on a real rollout")
    return [0.0] * len(completions)


def exits(completions, golds, **kw):
    sys.exit(0)


def exits_later(completions, golds, **kw):
    if _real_rollouts():
        sys.exit(0)
    return [0.0] * len(completions)


def interrupts_later(completions, golds, **kw):
    if _real_rollouts():
        raise KeyboardInterrupt
    return [0.0] * len(completions)


def hard_exit_later(completions, golds, **kw):
    if _real_rollouts():
        os._exit(3)
    return [0.0] * len(completions)


def huge(completions, golds, **kw):
    return [1e39] * len(completions)


def huge_later(completions, golds, **kw):
    later = _real_rollouts()
    return [1e39 if later and i == 5 else 1.0 for i in range(len(completions))]


def nan(completions, golds, **kw):
    return [float("nan")] * len(completions)


def nan_later(completions, golds, **kw):
    later = _real_rollouts()
    return [float("nan") if later and i == 3 else 1.0 for i in range(len(completions))]


def wrong_length_later(completions, golds, **kw):
    return [0.0] * (len(completions) + _real_rollouts())


def generator(completions, golds, **kw):
    return (0.0 for _ in completions)


def none(completions, golds, **kw):
    pass


def sleeps(completions, golds, **kw):
    time.sleep(60)
    return [1.0] * len(completions)


not_callable = 3
"""

CHECK = "configuration error: reward.function = '{spec}' failed its start-up check"
STEP = "training stopped: step 1: reward function {spec} "

# function -> (exit code, what the one line must contain besides the function's name)
CASES: dict[str, tuple[int, list[str]]] = {
    "dict_return": (
        2,
        [CHECK, "(dict), expected a list of 2 floats (a dict's keys would be read as the rewards)"],
    ),
    "numeric_string": (
        2,
        [CHECK, "returned '1.0' (str) for completion 0 (rollout 0), expected a real number"],
    ),
    "numeric_string_later": (
        1,
        [STEP, "returned '0.5' (str) for completion 2 (rollout 2), expected a real number"],
    ),
    "bools": (2, [CHECK, "returned True (bool) for completion 0 (rollout 0)", "a bool is not a reward"]),
    "raises_later": (
        1,
        [
            STEP,
            "raised ValueError: boom on a real rollout (at corpus_rewards.py:",
            "when called on 8 completions (rollouts 0-7)",
        ],
    ),
    "exits": (2, [CHECK, "it raised SystemExit(0)"]),
    "exits_later": (1, [STEP, "raised SystemExit(0)", "when called on 8 completions (rollouts 0-7)"]),
    "interrupts_later": (
        1,
        [STEP, "raised KeyboardInterrupt", "when called on 8 completions (rollouts 0-7)"],
    ),
    "hard_exit_later": (
        1,
        [STEP, "ended its worker process (exit code 3) when called on 8 completions (rollouts 0-7)"],
    ),
    "huge": (
        2,
        [
            CHECK,
            "returned 1e+39 (float) for completion 0 (rollout 0): beyond 3.40282e+38, the largest float32",
        ],
    ),
    "huge_later": (1, [STEP, "returned 1e+39 (float) for completion 5 (rollout 5): beyond 3.40282e+38"]),
    "nan": (2, [CHECK, "returned nan for completion 0 (rollout 0); rewards must be finite"]),
    "nan_later": (1, [STEP, "returned nan for completion 3 (rollout 3); rewards must be finite"]),
    "wrong_length_later": (1, [STEP, "returned 9 values for 8 completions: [0.0, 0.0"]),
    "generator": (2, [CHECK, "(generator), expected a list of 2 floats"]),
    "none": (2, [CHECK, "returned None (NoneType), expected a list of 2 floats"]),
    "not_callable": (2, ["configuration error: reward function '{spec}' is not callable"]),
    "no_such_function": (
        2,
        ["configuration error: reward function '{spec}': 'corpus_rewards' has no attribute"],
    ),
}


@pytest.fixture
def corpus_rewards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / f"{MODULE}.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))  # the reward's worker process gets this sys.path
    return tmp_path


def _argv(run: Path, sets: list[str]) -> list[str]:
    # strace: the micro config's 12-token answers are below the default recipe's overlong buffer
    return ["train", "--recipe", "strace", "--out", str(run), *[x for s in sets for x in ("--set", s)]]


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_reward_function_is_one_line_naming_it(
    name, corpus_rewards, tiny_model_dir, micro_sets, capsys
):
    code, names = CASES[name]
    spec = f"{MODULE}:{name}"
    sets = micro_sets(tiny_model_dir, steps=1, **{"reward.function": spec})
    line = one_line_error(
        _argv(corpus_rewards / "run", sets),
        capsys,
        names=[spec, *(n.format(spec=spec) for n in names)],
        code=code,
    )
    if code == 1:
        assert "no checkpoint yet" in line  # stopped in step 1, before its checkpoint


def test_a_reward_past_its_time_limit_scores_0_and_is_counted(
    corpus_rewards, tiny_model_dir, micro_sets, capsys
):
    """Not an error: stopped after reward.timeout x 8 completions (and the retry's 4 x that), scored 0,
    counted in the step's verify_timeouts; the run finishes with its model."""
    spec = f"{MODULE}:sleeps"
    sets = micro_sets(tiny_model_dir, steps=1, **{"reward.function": spec, "reward.timeout": 0.05})
    run = corpus_rewards / "run"
    assert cli.main(_argv(run, sets)) == 0, capsys.readouterr().err
    step = [
        json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"type": "eval"' not in x
    ][0]
    assert step["step"] == 1 and step["verify_timeouts"] == 8 and step["reward"] == 0.0
    assert (run / "final").is_dir()

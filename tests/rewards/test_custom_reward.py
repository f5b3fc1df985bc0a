import os
import sys

import pytest

from tokencredit.data import Problem
from tokencredit.errors import ConfigError
from tokencredit.rewards import (
    MathVerifier,
    Reward,
    RewardError,
    check_rewards,
    is_builtin_reward,
    load_reward_function,
)

MODULE = """
def length_reward(completions, golds, **kw):
    return [float(len(c)) for c in completions]

def bad_nan(completions, golds, **kw):
    return [float("nan")] * len(completions)

def bad_len(completions, golds, **kw):
    return [1.0]

def returns_float(completions, golds, **kw):
    return 1.0

def returns_none(completions, golds, **kw):
    pass

def raises(completions, golds, **kw):
    return [float(c) for c in completions]

def boxed_gold(completions, golds, **kw):
    return [1.0 if f"boxed{{{g}}}" in c else 0.0 for c, g in zip(completions, golds)]

class ns:
    @staticmethod
    def nested(completions, golds, **kw):
        return [1] * len(completions)
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_mod.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards_mod"


def test_user_reward_function(user_module):
    with Reward(f"{user_module}:length_reward") as r:
        assert r(["ab", "abcd"], ["1", "2"]) == [2.0, 4.0]
    with Reward(f"{user_module}:ns.nested") as r:
        assert r(["x"], ["1"]) == [1.0]
    with Reward(f"{user_module}:length_reward", format_weight=0.5) as r2:
        assert r2(["\\boxed{1}", "1"], ["1", "1"]) == [9.5, 1.0]


def test_user_reward_errors(user_module):
    with pytest.raises(ValueError, match=f"{user_module}:bad_nan returned nan for completion 0"):
        Reward(f"{user_module}:bad_nan")(["a"], ["1"])
    with pytest.raises(ValueError, match="returned 1 values for 2 completions"):
        Reward(f"{user_module}:bad_len")(["a", "b"], ["1", "2"])
    with pytest.raises(ConfigError, match="has no attribute 'nope'"):
        load_reward_function(f"{user_module}:nope")
    with pytest.raises(ConfigError, match="cannot import module"):
        load_reward_function("no_such_module_xyz:f")
    with pytest.raises(ConfigError, match="module:function"):
        load_reward_function("just_a_name")
    with pytest.raises(ValueError, match="expected a real number"):
        check_rewards(["x"], 1, "f")


def test_math_reward_with_format_bonus():
    v = MathVerifier(timeout=3.0, num_workers=1)
    try:
        r = Reward("math", verifier=v, format_weight=0.1)
        # Fast-path answers: no worker process is needed.
        assert r(["\\boxed{5}", "#### 5", "5"], ["5", "5", "5"]) == [1.1, 1.0, 0.0]
        assert v.stats["verified"] == 0
        r.close()  # a borrowed verifier is not closed by the reward
        assert v.score(["\\boxed{5}"], ["5"]) == [1.0]
    finally:
        v.close()


def test_start_up_check_names_the_function_and_what_it_returned(user_module):
    problem = Problem("p-1", "Compute 1 + 1.", "2")
    cases = {
        "returns_float": r"returned 1\.0 \(float\), expected a list of 2 floats",
        "returns_none": r"returned None \(NoneType\), expected a list of 2 floats",
        "bad_len": r"returned 1 values for 2 completions: \[1\.0\] \(list\)",
        "bad_nan": r"returned nan for completion 0",
        "raises": r"it raised ValueError: could not convert string to float",
    }
    for name, what in cases.items():
        spec = f"{user_module}:{name}"
        with (
            pytest.raises(
                ConfigError,
                match=rf"reward\.function = '{spec}' failed its start-up check \(called "
                rf"on 2 completions of training problem 'p-1'\): .*{what}",
            ),
            Reward(spec) as r,
        ):
            r.check(problem)
    # a good function passes, seeing the problem's gold (a list of golds: the first is boxed)
    Reward(f"{user_module}:boxed_gold").check(problem)
    Reward(f"{user_module}:length_reward").check(Problem("p-2", "q", ["3", "three"]))
    # a built-in reward is not called (no verifier worker starts)
    r = Reward("math", verifier=MathVerifier(timeout=3.0, num_workers=1))
    r.check(problem)
    assert r.verifier.stats["verified"] == 0
    assert (
        is_builtin_reward("math")
        and is_builtin_reward("auto")
        and is_builtin_reward("reasoning-gym?partial_credit=true")
    )
    assert not is_builtin_reward(f"{user_module}:boxed_gold")


# ---- the output contract: one real number per completion (issue 39) ------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"a": 1.0, "b": 0.0},
            r"returned \{'a': 1\.0, 'b': 0\.0\} \(dict\), expected a list of 2 floats \(a dict's keys",
        ),
        ({1.0: "x", 0.0: "y"}, r"\(dict\), expected a list of 2 floats"),  # numeric keys are refused too
        ("10", r"returned '10' \(str\), expected a list of 2 floats"),
        (None, r"returned None \(NoneType\), expected a list of 2 floats"),
        ((x for x in [1.0, 0.0]), r"\(generator\), expected a list of 2 floats"),
        ({1.0, 0.0}, r"\(set\), expected a list of 2 floats"),
        (iter([1.0, 0.0]), r"\(list_iterator\), expected a list of 2 floats"),
        (
            ["1.0", 0.0],
            r"returned '1\.0' \(str\) for completion 0 \(rollout 0\), expected a real number .*numeric one",
        ),
        (
            [0.0, True],
            r"returned True \(bool\) for completion 1 \(rollout 1\), expected a real number .*a bool is not",
        ),
        ([0.0, 1j], r"returned 1j \(complex\) for completion 1 \(rollout 1\), expected a real number"),
        ([[1.0], 0.0], r"returned \[1\.0\] \(list\) for completion 0 \(rollout 0\), expected a real number"),
        ([0.0, float("nan")], r"returned nan for completion 1 \(rollout 1\); rewards must be finite"),
        ([float("-inf"), 0.0], r"returned -inf for completion 0 \(rollout 0\); rewards must be finite"),
        (
            [1e39, 0.0],
            r"returned 1e\+39 \(float\) for completion 0 \(rollout 0\): beyond 3\.40282e\+38, the largest float32",
        ),
        ([0.0, -(10**400)], r"returned -1000.* \(int\) for completion 1 \(rollout 1\): beyond 3\.40282e\+38"),
        ([1.0, 2.0, 3.0], r"returned 3 values for 2 completions"),
    ],
    ids=[
        "dict",
        "dict-of-numbers",
        "str",
        "None",
        "generator",
        "set",
        "iterator",
        "numeric-str",
        "bool",
        "complex",
        "nested",
        "nan",
        "inf",
        "1e39",
        "huge-int",
        "too-many",
    ],
)
def test_check_rewards_refuses_what_is_not_one_real_number_per_completion(values, message):
    with pytest.raises(RewardError, match=r"^reward function m:f .*" + message):
        check_rewards(values, 2, "m:f")


def test_check_rewards_accepts_real_numbers_of_any_numeric_type():
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    from fractions import Fraction

    assert check_rewards([1, 0.5], 2, "f") == [1.0, 0.5]
    assert check_rewards((np.float32(0.25), np.int64(2)), 2, "f") == [0.25, 2.0]
    assert check_rewards(np.array([1.0, -3.4e38]), 2, "f") == [1.0, -3.4e38]
    assert check_rewards(torch.tensor([0.5, 1.0]), 2, "f") == [0.5, 1.0]
    assert check_rewards([Fraction(1, 2), 3.4028234663852886e38], 2, "f") == [0.5, 3.4028234663852886e38]
    with pytest.raises(RewardError, match=r"returned np\.True_ \(bool\) .*a bool is not"):
        check_rewards([np.bool_(True), 1.0], 2, "f")
    with pytest.raises(RewardError, match=r"\(Tensor\) for completion 0 .*a bool is not"):
        check_rewards(torch.tensor([True, False]), 2, "f")


# ---- the function runs in a worker process, under the verifier's rules ---------------------------

WORKER_MODULE = """
import os, sys, time
with open(os.environ["IMPORTS_LOG"], "a") as f:  # one line per import: once per worker
    f.write(f"{os.getpid()}\\n")
calls = 0

def counting(completions, golds, **kw):
    global calls
    calls += 1
    return [float(calls)] * len(completions)

def echo_kwargs(completions, golds, **kw):
    return [float(kw.get("weight", -1.0)) * (i + 1) for i in range(len(completions))]

def gold_types(completions, golds, **kw):
    return [float(isinstance(g, list)) + 2 * float(type(c) is str) for c, g in zip(completions, golds)]

def misbehaves(completions, golds, **kw):
    how = completions[0] or golds[0]
    if how == "exit":
        sys.exit(0)
    if how == "exit-code":
        raise SystemExit("bye")
    if how == "interrupt":
        raise KeyboardInterrupt
    if how == "hard-exit":
        os._exit(3)
    if how == "kill":
        os.kill(os.getpid(), 9)
    if how == "input":
        input()
    if how == "print":
        print("a print goes to stderr, not into the protocol")
    return [0.5] * len(completions)
"""


@pytest.fixture
def worker_module(tmp_path, monkeypatch):
    (tmp_path / "worker_rewards_mod.py").write_text(WORKER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))  # the worker gets this process's sys.path
    monkeypatch.setenv("IMPORTS_LOG", str(tmp_path / "imports.log"))
    return tmp_path


def test_the_function_is_imported_once_per_worker_not_in_this_process(worker_module):
    with Reward("worker_rewards_mod:counting") as r:
        r.check(Problem("p-1", "q", "1"))
        assert [r(["a", "b"], ["1", "1"]) for _ in range(3)] == [[2.0, 2.0], [3.0, 3.0], [4.0, 4.0]]
        pids = (worker_module / "imports.log").read_text().split()
        assert len(pids) == 1 and int(pids[0]) != os.getpid()
        assert r.user is not None and r.user.stats["verified"] == 4 and r.user.stats["timeouts"] == 0
    assert "worker_rewards_mod" not in sys.modules


def test_arguments_and_keywords_reach_the_function_as_they_are(worker_module):
    with Reward("worker_rewards_mod:echo_kwargs") as r:
        assert r.verify(["a", "b"], ["1", "2"], weight=0.5).scores == [0.5, 1.0]
        assert r.verify(["a"], ["1"]).scores == [-1.0]
        with pytest.raises(
            RewardError, match=r"echo_kwargs: its arguments cannot be sent to its worker process"
        ):
            r.verify(["a"], ["1"], weight=lambda: 1.0)
    with Reward("worker_rewards_mod:gold_types") as r:  # a list of golds stays a list (pickled, not JSON)
        assert r(["a", "b"], [["1", "one"], "2"]) == [3.0, 2.0]


@pytest.mark.parametrize(
    ("how", "message"),
    [
        (
            "exit",
            r"raised SystemExit\(0\) \(sys\.exit or exit\(\) in a reward; it cannot end training\) "
            r"\(at worker_rewards_mod\.py:\d+ in misbehaves\) when called on 2 completions \(rollouts 0-1\)$",
        ),
        ("exit-code", r"raised SystemExit\('bye'\)"),
        ("interrupt", r"raised KeyboardInterrupt \(at worker_rewards_mod\.py:\d+ in misbehaves\)"),
        ("input", r"raised EOFError"),  # stdin is not the protocol's: input() sees an empty stream
        (
            "hard-exit",
            r"ended its worker process \(exit code 3\) when called on 2 completions \(rollouts 0-1\); "
            r"a reward must return its values, not exit$",
        ),
        ("kill", r"ended its worker process \(killed by SIGKILL\)"),
    ],
)
def test_nothing_the_function_does_ends_this_process(worker_module, how, message):
    with Reward("worker_rewards_mod:misbehaves") as r:
        with pytest.raises(RewardError, match=r"^reward function worker_rewards_mod:misbehaves " + message):
            r([how, "x"], ["1", "1"])
        assert r(["print", "x"], ["1", "1"]) == [0.5, 0.5]  # and the next call works (a new worker if needed)
    # the start-up check (on "" and a boxed answer: `how` comes as the gold) says the same as a ConfigError
    check = r"failed its start-up check \(called on 2 completions of training problem 'p-1'\): it "
    with (
        Reward("worker_rewards_mod:misbehaves") as r,
        pytest.raises(ConfigError, match=check + message.split(" when")[0]),
    ):
        r.check(Problem("p-1", "q", how))


BROKEN_MODULES = {
    "raises_at_import": (
        "raise RuntimeError('no GPU here')",
        r"cannot import module 'raises_at_import' \(RuntimeError: no GPU here\)",
    ),
    "exits_at_import": (
        "import sys; sys.exit(5)",
        r"cannot import module 'exits_at_import' \(SystemExit: 5\)",
    ),
    "hard_exit_at_import": (
        "import os; os._exit(4)",
        r"reward function hard_exit_at_import:f worker exited during start-up \(exit code 4\)",
    ),
    "not_callable": ("f = 3", r"reward function 'not_callable:f' is not callable"),
}


@pytest.mark.parametrize("name", sorted(BROKEN_MODULES))
def test_a_function_that_cannot_be_loaded_in_its_worker_is_a_config_error(tmp_path, monkeypatch, name):
    source, message = BROKEN_MODULES[name]
    (tmp_path / f"{name}.py").write_text(source + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with Reward(f"{name}:f") as r, pytest.raises(ConfigError, match=message):
        r.check(Problem("p-1", "q", "1"))

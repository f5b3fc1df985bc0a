import pytest

from tokencredit.data import Problem
from tokencredit.errors import ConfigError
from tokencredit.rewards import MathVerifier, Reward, check_rewards, is_builtin_reward, load_reward_function

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
    r = Reward(f"{user_module}:length_reward")
    assert r(["ab", "abcd"], ["1", "2"]) == [2.0, 4.0]
    assert Reward(f"{user_module}:ns.nested")(["x"], ["1"]) == [1.0]
    r2 = Reward(f"{user_module}:length_reward", format_weight=0.5)
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
    with pytest.raises(ValueError, match="expected a number"):
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
        with pytest.raises(ConfigError, match=rf"reward\.function = '{spec}' failed its start-up check \(called "
                           rf"on 2 completions of training problem 'p-1'\): .*{what}"):  # fmt: skip
            Reward(spec).check(problem)
    # a good function passes, seeing the problem's gold (a list of golds: the first is boxed)
    Reward(f"{user_module}:boxed_gold").check(problem)
    Reward(f"{user_module}:length_reward").check(Problem("p-2", "q", ["3", "three"]))
    # a built-in reward is not called (no verifier worker starts)
    r = Reward("math", verifier=MathVerifier(timeout=3.0, num_workers=1))
    r.check(problem)
    assert r.verifier.stats["verified"] == 0
    assert is_builtin_reward("math") and is_builtin_reward("auto") and is_builtin_reward("reasoning-gym?partial_credit=true")
    assert not is_builtin_reward(f"{user_module}:boxed_gold")

"""reasoning-gym datasets as data sources: ``reasoning-gym:NAME?key=value&...`` (issue 30)."""

from __future__ import annotations

import pickle
import sys

import pytest

from tokencredit.data import reasoning_gym as rgd
from tokencredit.data.templates import render
from tokencredit.errors import ConfigError
from tokencredit.rewards import GymAnswer

# needs tokencredit[reasoning-gym]: skipped without it, run by `pytest -m extras`
pytestmark = pytest.mark.extras
pytest.importorskip("reasoning_gym")

SMALL = "reasoning-gym:chain_sum?min_terms=2&max_terms=3&max_digits=1"


def test_parse_spec():
    assert rgd.is_spec(SMALL) and rgd.is_spec(" reasoning-gym:x") and not rgd.is_spec("gsm8k_train")
    assert rgd.parse_spec(SMALL) == ("chain_sum", {"min_terms": "2", "max_terms": "3", "max_digits": "1"})
    assert rgd.parse_spec("reasoning-gym:chain_sum") == ("chain_sum", {})
    for bad, msg in [
        ("reasoning-gym:", "no dataset name"),
        ("reasoning-gym:?size=3", "no dataset name"),
        ("reasoning-gym:chain_sum?size", "expected key=value"),
        ("reasoning-gym:chain_sum?size=3&size=4", "given twice"),
        ("reasoning-gym:basic_arithmetic?operators=+,-", "cannot contain a comma"),
        ("math500", "not a reasoning-gym data source"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            rgd.parse_spec(bad)


def test_load_is_deterministic_with_golds_that_name_their_entry():
    import reasoning_gym

    probs = rgd.load(SMALL, size=20)
    assert len(probs) == 20 and probs == rgd.load(SMALL, size=20)
    assert len({p.id for p in probs}) == 20
    ds = reasoning_gym.create_dataset("chain_sum", min_terms=2, max_terms=3, max_digits=1, seed=0, size=20)
    for i, p in enumerate(probs):
        entry = ds[i]
        assert p.problem == entry["question"] and p.answer == entry["answer"]
        assert isinstance(p.answer, GymAnswer) and p.answer.dataset == "chain_sum" and p.answer.index == i
        assert p.answer.config == {"min_terms": 2, "max_terms": 3, "max_digits": 1, "seed": 0, "size": 20}
    # a gold survives pickling (checkpoints, worker hand-offs) with its entry reference
    g = pickle.loads(pickle.dumps(probs[3].answer))
    assert isinstance(g, GymAnswer) and g == probs[3].answer and g.ref == probs[3].answer.ref


def test_size_and_seed_and_a_disjoint_heldout_seed():
    train = rgd.load(SMALL, size=30)
    held = rgd.load(SMALL, split="heldout", size=30)
    assert held[0].answer.config["seed"] == rgd.EVAL_SEED_OFFSET
    # reasoning-gym seeds entry i with seed + i: the held-out generators never meet the training ones
    train_seeds = {p.answer.config["seed"] + p.answer.index for p in train}
    assert not train_seeds & {p.answer.config["seed"] + p.answer.index for p in held}
    assert not {p.id for p in train} & {p.id for p in held}
    # the spec's size and seed win over the caller's size
    seeded = rgd.load(SMALL + "&size=5&seed=7", size=30)
    assert len(seeded) == 5 and seeded[0].answer.config["seed"] == 7
    assert [p.problem for p in seeded] != [p.problem for p in train[:5]]
    assert len(rgd.load("reasoning-gym:chain_sum")) == 500  # the dataset's own default size


def test_parameter_types():
    probs = rgd.load(
        "reasoning-gym:basic_arithmetic?min_terms=2&max_terms=2&max_digits=1&allow_parentheses=false"
        "&allow_negation=no&operators=+|-",
        size=10,
    )
    cfg = probs[0].answer.config
    assert (
        cfg["allow_parentheses"] is False
        and cfg["allow_negation"] is False
        and cfg["operators"] == ["+", "-"]
    )
    assert all("*" not in p.problem and "/" not in p.problem for p in probs)


def test_presets_expand_and_can_be_overridden():
    assert rgd.load("reasoning-gym:chain_sum_small", size=8) == rgd.load(
        "reasoning-gym:chain_sum?"
        + "&".join(f"{k}={v}" for k, v in rgd.PRESETS["chain_sum_small"][1].items()),
        size=8,
    )
    assert rgd.load("reasoning-gym:chain_sum_small?max_terms=2", size=4)[0].answer.config["max_terms"] == 2


@pytest.mark.parametrize(
    "spec, msg",
    [
        ("reasoning-gym:chain_summ", "no dataset 'chain_summ'.*chain_sum"),
        ("reasoning-gym:chain_sum?max_term=3", "no parameter 'max_term'.*max_terms.*valid:"),
        ("reasoning-gym:chain_sum?max_terms=three", "expected a value like 6, got 'three'"),
        ("reasoning-gym:chain_sum?min_terms=4&max_terms=3", "rejects the configuration"),
        ("reasoning-gym:basic_arithmetic?allow_negation=maybe", "expected true/false"),
    ],
)
def test_errors_name_the_problem(spec, msg):
    with pytest.raises(ConfigError, match=msg):
        rgd.load(spec, size=3)


def test_unknown_split():
    with pytest.raises(ConfigError, match="unknown split 'dev'; use train, heldout or validation"):
        rgd.load(SMALL, split="dev", size=3)


def test_validation_split_is_a_third_seed_range():
    train, heldout, val = (rgd.load(SMALL, split=s, size=5) for s in ("train", "heldout", "validation"))
    assert val == rgd.load(SMALL, split="validation", size=5)
    assert [p.problem for p in val] != [p.problem for p in train]
    assert [p.problem for p in val] != [p.problem for p in heldout]


def test_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym -> ImportError
    with pytest.raises(ConfigError, match=r"pip install 'tokencredit\[reasoning-gym\]'"):
        rgd.load(SMALL, size=3)


def test_chat_template():
    class Tok:
        chat_template = "x"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return "".join(f"<|{m['role']}|>{m['content']}" for m in messages) + "<|assistant|>"

    assert render("chat", "2 + 3 =", Tok()) == "<|user|>2 + 3 =<|assistant|>"
    assert render("chat", "2 + 3 =") == "User: 2 + 3 =\n\nAssistant:"


@pytest.mark.parametrize(
    "query, msg",
    [
        ("size=1000000000000", r"size=1000000000000 is out of range \(the number of problems: 1\.\.100000\)"),
        ("size=10**12", r"size='10\*\*12' is not an integer"),
        ("size=-3", "size=-3 is out of range"),
        ("size=0", "size=0 is out of range"),
        ("size=2.5", r"size='2\.5' is not an integer"),
        ("seed=x", "seed='x' is not an integer"),
        ("seed=-1", "seed=-1 is out of range"),
        ("size=" + "9" * 5000, r"size=999999999999\.\.\.\(5000 digits\) is out of range"),
    ],
)
def test_size_and_seed_are_bounded_integers(query, msg):
    with pytest.raises(ConfigError, match=msg):
        rgd.load(f"reasoning-gym:chain_sum?{query}")
    with pytest.raises(ConfigError, match=msg):
        rgd.check_spec(f"reasoning-gym:chain_sum?{query}")


def test_a_size_from_the_caller_is_bounded_and_named():
    message = r"data.train_size = 1000000000000 for 'reasoning-gym:chain_sum' is above 100000"
    with pytest.raises(ConfigError, match=message):
        rgd.load("reasoning-gym:chain_sum", size=10**12, size_key="data.train_size")
    # the spec's size wins over the caller's
    assert len(rgd.load(SMALL + "&size=3", size=10**12, size_key="data.train_size")) == 3
    assert len(rgd.load(SMALL + "&size=1_0")) == 10
    rgd.check_spec(SMALL)  # a good spec: nothing generated, nothing raised
    with pytest.raises(ConfigError, match="rejects the configuration"):
        rgd.check_spec("reasoning-gym:chain_sum?min_terms=4&max_terms=3")

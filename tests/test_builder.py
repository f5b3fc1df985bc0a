"""The one batch builder (tokencredit.builder): what a recipe needs, decided once; the batch, built once.

- `needs_of` splits a recipe's signals by who produces them (a model pass, Monte-Carlo sampling, the
  engine's sampler) and is the rule every engine uses;
- `build_batch` computes exactly the forward signals that are not given, refuses what it cannot have
  (naming the signal and the engine), and never recomputes a given signal;
- no module of the package other than tokencredit.batch and tokencredit.builder constructs a
  RolloutBatch, so every engine's batch comes from here;
- the fused training forward returns the old policy's signals instead of writing them into the batch
  whose credit was already computed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from conftest import _micro_sets, byte_tokenizer, tiny_qwen3
from tokencredit.batch import MC_SIGNALS, RolloutBatch
from tokencredit.builder import (
    Needs,
    Passes,
    Responses,
    ScoredRollouts,
    build_batch,
    forward_signals,
    needs_of,
    rendered_negative_prompts,
)
from tokencredit.errors import ConfigError
from tokencredit.recipes import credit_needs, recipe_needs, resolve
from tokencredit.signals import compute_signals, negative_prompt_inputs

SRC = Path(__file__).resolve().parents[1] / "src" / "tokencredit"


# ---------------------------------------------------------------------------------------------- needs_of
@pytest.mark.parametrize(
    "name", ["grpo", "dapo+ktae", "delta", "strace", "arca", "gcpo", "oracle", "vineppo", "remax"]
)
def test_needs_split_the_recipe_signals_by_producer(name):
    r = resolve(name)
    for objective, want in ((False, credit_needs(r)), (True, recipe_needs(r))):
        n = needs_of(r, objective=objective)
        assert n.signals == want
        assert n.sampled == want & set(MC_SIGNALS) and not (n.forward & set(MC_SIGNALS))


def test_needs_of_the_named_cases():
    assert needs_of(resolve("delta")) == Needs(forward=frozenset({"hidden", "old_log_probs"}))
    assert needs_of(resolve("dapo+ktae")) == Needs()
    assert needs_of(resolve("dapo+ktae"), objective=True).forward == {"old_log_probs"}  # the ratio's
    assert needs_of(resolve("oracle")).sampled == {"mc_advantages"}
    assert needs_of(resolve("remax")).fields == {"baseline_scores"}
    assert needs_of(resolve("grpo"), objective=True, extra={"entropy"}).forward == {
        "old_log_probs",
        "entropy",
    }
    # the fused training forward yields the old log-probs and entropy: no pass computes them before
    assert needs_of(resolve("grpo"), objective=True, extra={"entropy"}, fused_old=True).forward == set()
    assert "hidden" in needs_of(resolve("delta"), objective=True, fused_old=True).forward


def test_needs_of_several_recipes_and_lora():
    many = [resolve("delta"), resolve("arca"), resolve("entropy-80-20")]
    assert needs_of(many).forward == {"hidden", "old_log_probs", "base_hidden", "entropy"}
    assert needs_of(many, lora=False).forward == {
        "hidden",
        "old_log_probs",
        "entropy",
    }  # arca reads the adapter: left out


def test_needs_of_rejects_an_unknown_signal_with_the_closest_name():
    with pytest.raises(ConfigError, match="entropyy.*closest: entropy"):
        needs_of(resolve("grpo"), extra={"entropyy"})


# ---------------------------------------------------------------------------------------------- build_batch
N, G, T, P = 6, 3, 5, 4


@pytest.fixture(scope="module")
def model_and_rollouts():
    tok = byte_tokenizer()
    model = tiny_qwen3(len(tok), seed=3).eval()
    gen = torch.Generator().manual_seed(1)
    lengths = torch.tensor([5, 3, 4, 1, 5, 2])
    mask = torch.arange(T)[None] < lengths[:, None]
    resp = torch.where(mask, torch.randint(2, 200, (N, T), generator=gen), torch.zeros((), dtype=torch.long))
    p_len = torch.tensor([4, 4, 4, 2, 2, 2])
    p_mask = torch.arange(P)[None] >= (P - p_len[:, None])  # left-padded prompts
    p_ids = torch.where(
        p_mask, torch.randint(2, 200, (N, P), generator=gen), torch.zeros((), dtype=torch.long)
    )
    ro = ScoredRollouts(
        response_ids=resp,
        response_mask=mask,
        group_ids=torch.arange(N) // G,
        scores=torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0]),
        truncated=torch.zeros(N, dtype=torch.bool),
        prompt_ids=p_ids,
        prompt_mask=p_mask,
    )
    return model, tok, ro


def _direct(model, ro, names, **kw):
    seq = torch.cat([ro.prompt_ids, ro.response_ids], 1)
    att = torch.cat([ro.prompt_mask.long(), ro.response_mask.long()], 1)
    return compute_signals(model, seq, att, P, ro.response_mask, names, **kw)


def test_forward_signals_equal_the_signals_pass(model_and_rollouts):
    model, _, ro = model_and_rollouts
    names = {"old_log_probs", "entropy", "hidden"}
    batch = build_batch(ro, Needs(forward=frozenset(names)), model=model, passes=Passes(temperature=0.7))
    want = _direct(model, ro, names, temperature=0.7)
    assert isinstance(batch, RolloutBatch) and batch.available_signals() == names
    for k in names:
        torch.testing.assert_close(getattr(batch, k), want[k], rtol=0, atol=0)
    assert torch.equal(batch.token_ids, ro.response_ids) and torch.equal(batch.group_ids, ro.group_ids)
    assert bool((batch.entropy[~batch.mask] == 0).all())  # masked positions exactly 0


def test_given_signals_are_used_and_never_recomputed(model_and_rollouts):
    _, _, ro = model_and_rollouts

    class Exploding(torch.nn.Module):
        def forward(self, *a, **k):  # pragma: no cover - must not run
            raise AssertionError("the model ran although every signal was given")

    ent = torch.rand(N, T) * ro.response_mask
    batch = build_batch(ro, Needs(forward=frozenset({"entropy"})), model=Exploding(), given={"entropy": ent})
    assert torch.equal(batch.entropy, ent)


def test_what_cannot_be_had_is_an_error_naming_it_and_the_engine(model_and_rollouts):
    _, _, ro = model_and_rollouts
    with pytest.raises(ConfigError, match=r"myengine needs the per-token signal\(s\) entropy, hidden"):
        build_batch(ro, Needs(forward=frozenset({"hidden", "entropy"})), who="myengine")
    with pytest.raises(ConfigError, match=r"myengine needs the Monte-Carlo signal\(s\) mc_advantages"):
        build_batch(ro, Needs(sampled=frozenset({"mc_advantages"})), who="myengine")
    with pytest.raises(ConfigError, match="unknown signal 'entropyy'"):
        build_batch(ro, Needs(), given={"entropyy": torch.zeros(N, T)})
    bare = ScoredRollouts(
        response_ids=ro.response_ids, response_mask=ro.response_mask, group_ids=ro.group_ids, scores=ro.scores
    )
    model = torch.nn.Linear(1, 1)
    with pytest.raises(ConfigError, match="needs the prompts"):
        build_batch(bare, Needs(forward=frozenset({"entropy"})), model=model)


def test_fields_and_sampled_values_pass_through(model_and_rollouts):
    _, _, ro = model_and_rollouts
    from dataclasses import replace

    mc = torch.randn(N, T) * ro.response_mask
    with_base = replace(ro, baseline_scores=torch.ones(N))
    batch = build_batch(with_base, needs_of(resolve("oracle")), given={"mc_advantages": mc})
    assert torch.equal(batch.mc_advantages, mc) and torch.equal(batch.baseline_scores, torch.ones(N))
    assert torch.equal(batch.truncated, ro.truncated)


def test_negative_prompt_pass_as_the_engines_built_it(model_and_rollouts):
    model, tok, ro = model_and_rollouts
    problems = ["What is 2 + 2?", "What is 3 + 4?"]
    rows = [problems[int(g) % 2] for g in ro.group_ids]
    neg = rendered_negative_prompts(rows, "Q: {problem}\nA:", tok)
    got = forward_signals(model, ro, {"neg_log_probs"}, Passes(negative_prompts=neg, tokenizer=tok))
    inputs = negative_prompt_inputs(tok, neg(), ro.response_ids, ro.response_mask)
    want = _direct(model, ro, {"neg_log_probs"}, **inputs)
    torch.testing.assert_close(got["neg_log_probs"], want["neg_log_probs"], rtol=0, atol=0)
    with pytest.raises(ConfigError, match="negative prompts"):
        forward_signals(model, ro, {"neg_log_probs"})


def test_response_attention_attends_to_tokens_that_get_no_credit(model_and_rollouts):
    """TRL's tool-call tokens: attended to (response_attention), not credited (response_mask)."""
    model, _, ro = model_and_rollouts
    credited = ro.response_mask.clone()
    credited[0, 1] = False  # a tool token inside row 0
    rows = Responses(
        response_ids=ro.response_ids,
        response_mask=credited,
        prompt_ids=ro.prompt_ids,
        prompt_mask=ro.prompt_mask,
        response_attention=ro.response_mask,
    )
    got = forward_signals(model, rows, {"old_log_probs"})["old_log_probs"]
    seq = torch.cat([ro.prompt_ids, ro.response_ids], 1)
    att = torch.cat([ro.prompt_mask.long(), ro.response_mask.long()], 1)
    want = compute_signals(model, seq, att, P, credited, {"old_log_probs"})["old_log_probs"]
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert float(got[0, 1]) == 0.0 and float(got[0, 2]) != 0.0


# ---------------------------------------------------------------------------------------------- one owner
def _constructions(path: Path) -> list[int]:
    tree = ast.parse(path.read_text())
    return [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "RolloutBatch"
    ]


def test_only_the_builder_constructs_a_batch():
    """Every engine (trainer, explain, probe, TRL, verl) gets its RolloutBatch from tokencredit.builder."""
    found = {
        p.relative_to(SRC).as_posix(): lines
        for p in sorted(SRC.rglob("*.py"))
        if (lines := _constructions(p)) and p.name not in ("batch.py", "builder.py")
    }
    assert not found, f"RolloutBatch constructed outside tokencredit.builder: {found}"
    assert _constructions(SRC / "builder.py"), "the scan found nothing in builder.py: it is broken"


# ---------------------------------------------------------------------------------------------- the update
def test_the_fused_update_leaves_the_credit_batch_untouched(tiny_model_dir, tmp_path, toy_rewards):
    """With the fused pass, old log-probs and entropy come from the training forward: they reach the step's
    record and saved rollouts through a copy; the batch credit was computed on is never written to."""
    from tokencredit.train.config import load_config
    from tokencredit.train.trainer import Trainer

    t = Trainer(load_config(sets=_micro_sets(tiny_model_dir), recipe="grpo"), tmp_path / "run")
    assert t.fused_old and t.needs.forward == set()
    seen = []
    credit = t.credit

    def spy(batch):
        seen.append(batch)
        return credit(batch)

    t.credit = spy
    result = t.step(0)
    (read,) = seen
    assert read.old_log_probs is None and read.entropy is None
    assert result.batch is not read and result.batch.entropy is not None
    assert result.record["entropy"] > 0
    m = result.batch.mask
    assert bool((result.batch.old_log_probs[m] < 0).all())

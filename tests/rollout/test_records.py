"""The saved-rollouts JSONL writer: what explain reads back, the trainer's own records rebuilt on it, strict JSON."""

import json
import math
import re
from types import SimpleNamespace

import pytest
import torch

from tokencredit.batch import MC_SIGNALS, RolloutBatch
from tokencredit.data.loaders import Problem
from tokencredit.explain.jsonl import load_jsonl
from tokencredit.rollout import records

N, T = 6, 5


def _batch(with_mc: bool = False):
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 3, 1, 4, 2, 5])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    ids = torch.randint(3, 40, (N, T), generator=g) * mask
    signals = {
        "entropy": torch.rand(N, T, generator=g) * mask,
        "old_log_probs": -torch.rand(N, T, generator=g) * mask,
    }
    if with_mc:
        signals.update({s: torch.randn(N, T, generator=g) * mask for s in MC_SIGNALS})
    batch = RolloutBatch(
        ids, mask, torch.tensor([4, 4, 4, 9, 9, 9]), torch.tensor([1.0, 0, 1, 0, 0, 1]), **signals
    )
    tok = torch.randn(N, T, generator=g) * mask
    tok[1, 0] = -0.0
    return batch, tok, torch.randn(N, generator=g)


class _Tok:
    def convert_ids_to_tokens(self, ids):
        return [f"t{i}" for i in ids]


def _lines(batch, tok, seq, **kw):
    comps = records.completion_records(
        batch.token_ids,
        batch.mask,
        batch.scores,
        seq,
        tok,
        texts=[f"text {i}" for i in range(N)],
        tokens=[
            _Tok().convert_ids_to_tokens(batch.token_ids[i, : int(batch.mask[i].sum())].tolist())
            for i in range(N)
        ],
        signals={"entropy": batch.entropy, "old_log_probs": batch.old_log_probs},
        **kw,
    )
    fields = {4: {"prompt": "<s>what is 1 + 1?", "problem": "1 + 1", "answer": "2"}, 9: {"prompt": "say 3"}}
    return records.group_records(
        step=7, recipe="dapo+ktae", credit="ktae", group_ids=batch.group_ids, completions=comps, fields=fields
    )


def test_explain_reads_back_what_is_written(tmp_path):
    batch, tok, seq = _batch()
    lines = _lines(batch, tok, seq, truncated=[False, True, False, False, False, True])
    path = tmp_path / "step.jsonl"
    path.write_text(records.jsonl_text(lines))
    assert not re.search(r"-0\.0[,\]]", path.read_text())  # a zero Â is written 0.0
    groups = load_jsonl(path)
    assert [g.group_id for g in groups] == [4, 9] and [len(g.completions) for g in groups] == [3, 3]
    assert (
        groups[0].prompt == "<s>what is 1 + 1?" and groups[0].problem == "1 + 1" and groups[0].answer == "2"
    )
    assert groups[1].problem is None and groups[1].answer is None
    assert groups[0].extra == {"step": 7, "recipe": "dapo+ktae", "credit": "ktae"}
    for i, c in enumerate(c for g in groups for c in g.completions):
        n = int(batch.mask[i].sum())
        assert c.token_ids == batch.token_ids[i, :n].tolist() and c.tokens == [f"t{x}" for x in c.token_ids]
        assert c.score == float(batch.scores[i]) and c.advantage == pytest.approx(float(seq[i]))
        assert c.truncated == (i in (1, 5)) and c.correct is None
        torch.testing.assert_close(torch.tensor(c.token_advantages), tok[i, :n], atol=5e-7, rtol=0)
        torch.testing.assert_close(torch.tensor(c.entropy), batch.entropy[i, :n], atol=5e-6, rtol=0)


def test_the_trainers_saved_rollouts_rebuilt_on_the_shared_writer():
    """`tokencredit.train.rundir.rollout_records` (the trainer's) equals the records this module makes from the same
    step, the recipe's Monte-Carlo values included: the trainer can write through it unchanged."""
    from tokencredit.train.rundir import rollout_records

    batch, tok, seq = _batch(with_mc=True)
    problems = [Problem(id=f"p{g}", problem=f"problem {g}", answer=str(g)) for g in batch.group_ids.tolist()]
    ro = SimpleNamespace(
        group_ids=batch.group_ids,
        problems=problems,
        texts=[f"text {i}" for i in range(N)],
        scores=batch.scores,
        correct=batch.scores > 0,
        timed_out=torch.tensor([False, True, False, False, False, False]),
        truncated=torch.tensor([False, False, True, False, False, False]),
    )
    recipe = SimpleNamespace(name="oracle", credit="oracle")
    credit = SimpleNamespace(seq_advantages=seq, token_advantages=tok)
    want = rollout_records(3, recipe, ro, batch, credit, _Tok(), max_groups=2)

    comps = records.completion_records(
        batch.token_ids,
        batch.mask,
        ro.scores,
        seq,
        tok,
        texts=ro.texts,
        tokens=[
            _Tok().convert_ids_to_tokens(batch.token_ids[i, : int(batch.mask[i].sum())].tolist())
            for i in range(N)
        ],
        truncated=ro.truncated,
        correct=ro.correct.tolist(),
        signals={s: getattr(batch, s) for s in ("entropy", "old_log_probs", *MC_SIGNALS)},
        row_fields=[{"verify_timeout": bool(t)} for t in ro.timed_out],
    )
    fields = {
        g: {"id": p.id, "problem": p.problem, "answer": p.answer}
        for g, p in zip(ro.group_ids.tolist(), problems)
    }
    got = records.group_records(
        step=3,
        recipe=recipe.name,
        credit=recipe.credit,
        group_ids=ro.group_ids,
        completions=comps,
        fields=fields,
        max_groups=2,
    )
    assert got == want
    assert [list(c) for c in got[0]["completions"]] == [
        list(c) for c in want[0]["completions"]
    ]  # key order too


def test_non_finite_values_and_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match=r"line 1\.completions\[0\]\.token_advantages\[1\] is nan"):
        records.jsonl_text(
            [
                records.group_record(
                    step=1,
                    recipe="r",
                    credit="c",
                    group=0,
                    completions=[
                        records.completion_record(
                            text="a",
                            token_ids=[1, 2],
                            score=1.0,
                            advantage=0.5,
                            token_advantages=[0.1, math.nan],
                        )
                    ],
                )
            ]
        )
    with pytest.raises(ValueError, match="token_advantages has 1 values for 2 tokens"):
        records.completion_record(
            text="a", token_ids=[1, 2], score=1.0, advantage=0.5, token_advantages=[0.1]
        )
    with pytest.raises(ValueError, match="no completion"):
        records.group_record(step=1, recipe="r", credit="c", group=0, completions=[])
    assert json.loads(records.jsonl_text([{"a": 1}])) == {"a": 1}


def test_explain_refuses_saved_advantages_that_do_not_fit_the_tokens(tmp_path):
    from tokencredit.data.loaders import DataError

    line = {"prompt": "p", "completions": [{"token_ids": [1, 2], "score": 1.0, "token_advantages": [0.5]}]}
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(
        DataError, match=r"bad.jsonl:1: completions\[0\].token_advantages must be a list of 2 numbers"
    ):
        load_jsonl(path)

"""prime-rl's token exports read by `tokencredit explain --jsonl` (a file, or a directory of step_N/rank_R.jsonl),
refused by `probe --data` in one line; our own rollouts format's version.

The records are written here to the schema read from prime-rl's src/prime_rl/trainer/rl/token_export.py (schema
version 1, commit 559b447): one JSON object per sequence, prompt and completion in `token_ids`, `loss_mask` true on
the sampled tokens, the rollout's advantage on each of them, per-token lists of one length, null for a non-finite
value or an absent stream."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_explain import Page

from bad_input import one_line_error
from tokencredit import cli
from tokencredit.explain import load_jsonl
from tokencredit.rollout import records
from tokencredit.rollout.prime_rl import export_record

STREAMS_OFF = (
    "mismatch_kl",
    "log_importance_ratio",
    "importance_ratio",
    "prob_delta",
    "rl_weights",
    "ce_weights",
)


def prime_record(
    prompt: list[int],
    completion: list[int],
    advantage: float,
    *,
    step: int = 3,
    rank: int = 0,
    index: int = 0,
    reward: float | None = None,
    tail: list[int] | None = None,
) -> dict:
    """One exported sequence: `prompt` then `completion` (sampled), then optionally a `tail` of context and one
    more sampled token (a second turn); `reward` as the older exports' `rewards` stream."""
    second = [] if tail is None else [*tail, completion[0]]
    ids = [*prompt, *completion, *second]
    sampled = [False] * len(prompt) + [True] * len(completion)
    sampled += [False] * len(tail or []) + [True] * (1 if tail is not None else 0)
    n = len(ids)
    rec = {
        "schema_version": 1,
        "step": step,
        "rank": rank,
        "micro_step": 0,
        "micro_sequence_idx": index,
        "export_sequence_idx": index,
        "env_name": "arith",
        "token_ids": ids,
        "position_ids": list(range(n)),
        "loss_mask": sampled,
        "advantages": [advantage if s else 0.0 for s in sampled],
        "inference_logprobs": [-0.5 if s else 0.0 for s in sampled],
        "trainer_logprobs": [-0.6 if s else -4.0 for s in sampled],
        "entropy": [0.25 * (k % 4) for k in range(n)],
        "is_masked": [False] * n,
        "is_masked_high": [False] * n,
        "is_masked_low": [False] * n,
        "ref_kl_weights": [None] * n,
        **{name: [None] * n for name in STREAMS_OFF},
    }
    if reward is not None:
        rec["rewards"] = [reward] * n
    return rec


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def group_records(tok, problem: str, answers: list[str], rewards: list[float], **kw) -> list[dict]:
    """A GRPO group as prime-rl trains it: advantage = reward - the group's mean reward, on every sampled token."""
    mean = sum(rewards) / len(rewards)
    prompt = _ids(tok, problem)
    return [
        prime_record(prompt, _ids(tok, a), r - mean, index=k, **kw)
        for k, (a, r) in enumerate(zip(answers, rewards))
    ]


def _write(path: Path, recs: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs))
    return path


@pytest.fixture
def tok(tiny_model_dir):
    from tokencredit.models import load_tokenizer

    return load_tokenizer(tiny_model_dir)


def test_a_prime_rl_file_is_explained_with_its_saved_advantages(tmp_path, tiny_model_dir, tok):
    recs = group_records(tok, "Compute 12 + 30.\n", ["42", "41", "42", "32"], [1, 0, 1, 0])
    recs += group_records(tok, "Compute 7 + 6.\n", ["13", "14"], [0, 1])
    # the groups' records interleaved, as packing leaves them: grouped again by their prompt ids
    f = _write(tmp_path / "rank_0.jsonl", [recs[0], recs[4], recs[1], recs[5], recs[2], recs[3]])
    notes: list[str] = []
    groups = load_jsonl(f, notes=notes)
    assert [len(g.completions) for g in groups] == [4, 2]
    assert groups[0].prompt_token_ids == _ids(tok, "Compute 12 + 30.\n") and groups[0].where == f"{f}:1"
    c = groups[0].completions[1]
    assert (
        c.token_ids == _ids(tok, "41")
        and c.score == pytest.approx(-0.5)
        and c.advantage == pytest.approx(-0.5)
    )
    assert c.token_advantages == [-0.5, -0.5] and c.old_log_probs == [-0.5, -0.5] and not c.truncated
    assert any("without rewards" in n for n in notes)

    out = tmp_path / "page.html"
    argv = ["--jsonl", f, "--model", tiny_model_dir, "--methods", "saved,ktae,delta,uniform", "--out", out]
    assert cli.main(["explain", *map(str, argv)]) == 0
    page = Page(out.read_text())
    html = out.read_text()
    assert "without rewards" in html and "Compute 12 + 30." in html  # the prompt ids decoded for the header
    rows = page.data["rows"]
    assert len(rows) == 6 and rows["1"]["tokens"] == ["4", "1"]
    # the saved column is the file's advantages; the recomputed credit is not trivial
    assert rows["1"]["credit"]["saved"] == pytest.approx([-0.5, -0.5])
    assert rows["4"]["credit"]["saved"] == pytest.approx([-0.5, -0.5])
    assert rows["5"]["credit"]["uniform"][0] > 0 > rows["4"]["credit"]["uniform"][0]
    delta = [v for r in rows.values() for v in r["credit"]["delta"]]
    assert max(delta) > 0 > min(delta)
    assert any(len(set(r["credit"]["delta"])) > 1 for r in rows.values())  # delta varies within a response


def test_the_older_rewards_stream_is_the_reward_and_a_second_turn_is_cut(tmp_path, tok):
    prompt = _ids(tok, "Say 5.\n")
    recs = [
        prime_record(prompt, _ids(tok, "5"), 0.5, reward=1.0),
        prime_record(prompt, _ids(tok, "6 7"), -0.5, reward=0.0, tail=_ids(tok, "ok")),
    ]
    notes: list[str] = []
    (g,) = load_jsonl(_write(tmp_path / "r.jsonl", recs), notes=notes)
    assert [c.score for c in g.completions] == [1.0, 0.0]
    assert g.completions[1].token_ids == _ids(tok, "6 7") and g.completions[1].truncated
    assert not any("without rewards" in n for n in notes) and any("multi-turn" in n for n in notes)


def _export(root: Path, tok) -> None:
    """token_exports/ of two steps: step 1 complete (STABLE) with a group split over two ranks, step 2 not."""
    g = group_records(tok, "Compute 1 + 2.\n", ["3", "4", "3", "5"], [1, 0, 1, 0], step=1)
    _write(root / "token_exports" / "step_1" / "rank_0.jsonl", g[:2])
    _write(root / "token_exports" / "step_1" / "rank_1.jsonl", g[2:])
    (root / "token_exports" / "step_1" / "STABLE").touch()
    _write(
        root / "token_exports" / "step_2" / "rank_0.jsonl",
        group_records(tok, "Compute 2 + 2.\n", ["4", "5"], [1, 0], step=2),
    )


def test_an_export_directory_reads_one_step_of_every_rank(tmp_path, tok):
    _export(tmp_path, tok)
    notes: list[str] = []
    (g,) = load_jsonl(tmp_path, notes=notes)  # OUTPUT_DIR: the latest step every rank wrote (STABLE)
    assert len(g.completions) == 4 and g.extra == {"step": 1, "env_name": "arith"}
    assert any("step_2 has no STABLE marker" in n for n in notes)
    assert load_jsonl(tmp_path / "token_exports", step=2)[0].extra["step"] == 2
    assert len(load_jsonl(tmp_path / "token_exports" / "step_1")[0].completions) == 4
    with pytest.raises(Exception, match=r"--step 9: no step_9 in .*token_exports; its steps: 1, 2"):
        load_jsonl(tmp_path, step=9)
    assert export_record(tmp_path) == f"{tmp_path / 'token_exports' / 'step_1' / 'rank_0.jsonl'}:1"


def test_explain_on_an_export_directory(tmp_path, tiny_model_dir, tok, capsys):
    _export(tmp_path, tok)
    argv = ["explain", "--jsonl", str(tmp_path), "--model", tiny_model_dir, "--methods", "ktae,uniform"]
    assert cli.main([*argv, "--step", "2"]) == 0
    page = tmp_path / "token_exports" / "explain_step_2.html"  # beside the step directories
    assert str(page) in capsys.readouterr().out
    assert len(Page(page.read_text()).data["rows"]) == 2


BAD = [
    ("advantages", lambda r: r.pop("advantages"), ":2: no 'advantages'"),
    ("loss_mask", lambda r: r.pop("loss_mask"), ":2: no 'loss_mask'"),
    ("length", lambda r: r["loss_mask"].pop(), ":2: 'loss_mask' must be a list of"),
    ("null", lambda r: r["advantages"].__setitem__(-1, None), ":2: 'advantages'[-1]"),
    (
        "nothing sampled",
        lambda r: r.update(loss_mask=[False] * len(r["token_ids"])),
        "'loss_mask' has no true value",
    ),
    ("no prompt", lambda r: r["loss_mask"].__setitem__(0, True), "'loss_mask' is true at token 0"),
    ("version", lambda r: r.update(schema_version=2), ":2: 'schema_version' is 2"),
    ("id", lambda r: r["token_ids"].__setitem__(0, -3), ":2: 'token_ids'[0] = -3"),
    ("reward", lambda r: r.update(rewards=[None] * len(r["token_ids"])), ":2: 'rewards'["),
]


@pytest.mark.parametrize(("case", "spoil", "says"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_record_is_one_line_naming_file_line_and_field(
    tmp_path, tiny_model_dir, tok, capsys, case, spoil, says
):
    recs = group_records(tok, "Compute 1 + 2.\n", ["3", "4"], [1, 0])
    spoil(recs[1])
    f = _write(tmp_path / "rank_0.jsonl", recs)
    if case == "null":  # the index named is the completion token's in the sequence
        says = f":2: 'advantages'[{len(recs[1]['token_ids']) - 1}]"
    line = one_line_error(
        ["explain", "--jsonl", str(f), "--model", tiny_model_dir, "--out", str(tmp_path / "p.html")],
        capsys,
        names=[str(f), says],
    )
    assert not (tmp_path / "p.html").exists(), line


def test_probe_data_refuses_an_export_in_one_line(tmp_path, tiny_model_dir, tok, capsys):
    _export(tmp_path, tok)
    f = tmp_path / "token_exports" / "step_1" / "rank_1.jsonl"
    for data, where in (
        (f, f"{f}:1"),
        (tmp_path, f"{tmp_path / 'token_exports' / 'step_1' / 'rank_0.jsonl'}:1"),
    ):
        one_line_error(
            [
                "probe",
                "--model",
                tiny_model_dir,
                "--data",
                str(data),
                "--oracle",
                "2",
                "--out",
                str(tmp_path / "p.json"),
            ],
            capsys,
            names=[where, "prime-rl token export", "'answer'", "explain --jsonl"],
        )
    assert not (tmp_path / "p.json").exists()


# ------------------------------------------------------------------------------------------ our own format's version
def test_our_rollouts_carry_a_format_version_and_a_newer_one_is_refused(tmp_path):
    comp = records.completion_record(
        text="a", token_ids=[5], score=1.0, advantage=0.5, token_advantages=[0.5]
    )
    line = records.group_record(
        step=1, recipe="grpo", credit="uniform", group=0, completions=[comp], prompt="p"
    )
    assert line[records.FORMAT_VERSION_FIELD] == records.FORMAT_VERSION == 1
    f = tmp_path / "r.jsonl"
    old = {
        k: v for k, v in line.items() if k != records.FORMAT_VERSION_FIELD
    }  # written before the field: version 1
    f.write_text(records.jsonl_text([line, {**old, "group": 1}]))
    assert [g.group_id for g in load_jsonl(f)] == [0, 1]
    f.write_text(records.jsonl_text([line, {**line, "group": 1, records.FORMAT_VERSION_FIELD: 2}]))
    with pytest.raises(
        Exception,
        match=rf"{f}:2: 'format_version' is 2: this tokencredit reads rollouts format versions 1 to 1",
    ):
        load_jsonl(f)

"""`tokencredit explain`: the task checker's marks (first wrong token, right answer through a wrong step)
and the choice of the groups shown (`--select`, `--group-index`)."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from tokencredit import advantages, cli
from tokencredit.columns import resolve_methods
from tokencredit.errors import ConfigError
from tokencredit.explain import (
    ExplainOptions,
    assemble_batch,
    build_report,
    explain_batch,
    load_run_rollouts,
    make_groups,
    mark_groups,
    select_groups,
)
from tokencredit.explain.inputs import CompletionInput, GroupInput
from tokencredit.explain.selection import group_kind, parse_indices

PROBLEM = "Compute 48 + 7 - 3."  # reference: "48 + 7 = 55", "55 - 3 = 52", answer 52
RIGHT = "48 + 7 = 55\n55 - 3 = 52\nThe answer is \\boxed{52}."
SLIP = "48 + 7 = 45\n45 - 3 = 42\nThe answer is \\boxed{42}."  # a dropped carry: wrong from "45" on
LUCKY = "48 + 7 = 05\n55 - 3 = 52\nThe answer is \\boxed{52}."  # right answer through a wrong step
FIRST_WRONG = len("48 + 7 = ")  # the character (= token, the toy tokenizer is character-level) of "45" / "05"


class Marks(HTMLParser):
    """The marked token spans (method, row, position), the meta cells' attributes, the header's count."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.fw: set[tuple[str, int, int]] = set()
        self.meta: dict[int, dict[str, str]] = {}
        self.checker: dict[str, str] | None = None
        self.groups: list[int] = []
        self.blob = ""
        self._cell: tuple[str, int] | None = None
        self._in_blob = False
        self.feed(text)
        self.data = json.loads(self.blob)

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        cls = a.get("class", "").split()
        if tag == "div" and "cell" in cls:
            self._cell = (a["data-m"], int(a["data-r"]))
        if tag == "span" and "fw" in cls:
            assert self._cell is not None and "t" in cls
            self.fw.add((*self._cell, int(a["data-t"])))
        if tag == "div" and "meta" in cls:
            self.meta[int(a["data-r"])] = a
        if tag == "div" and "checker" in cls:
            self.checker = a
        if tag == "section":
            self.groups.append(int(a["data-group"]))
        if tag == "script" and a.get("id") == "tc-data":
            self._in_blob = True

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_blob = False

    def handle_data(self, data):
        if self._in_blob:
            self.blob += data


@pytest.fixture(scope="module")
def toy_tokenizer():
    from tokencredit.models import build_toy_tokenizer

    return build_toy_tokenizer()


def _ids(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]


def _group(gid: int, problem: str | None, texts: list[str], scores: list[float], tok=None) -> GroupInput:
    comps = [
        CompletionInput(text=t, score=s, token_ids=_ids(tok, t) if tok is not None else None)
        for t, s in zip(texts, scores, strict=True)
    ]
    return GroupInput(gid, comps, f"test:{gid}", problem=problem, prompt=None if problem else "a prompt")


def _page(groups: list[GroupInput], tok) -> tuple[str, list[str], list]:
    """(html, notes, shown groups) of every group, credit of uniform and ktae, with the checker's marks."""
    batch = assemble_batch(groups, tok)
    texts = [[tok.decode([i]) for i in c.token_ids] for g in groups for c in g.completions]
    shown = make_groups(batch, texts, advantages.grpo(batch.scores, batch.group_ids), groups=len(groups))
    notes = []
    note = mark_groups(shown, {g.group_id: g.problem for g in groups}, batch, tok)
    if note is not None:
        notes.append(note)
    data = explain_batch(batch, resolve_methods(["uniform", "ktae"]), shown, notes=notes)
    return build_report(data), notes, shown


# ------------------------------------------------------------------------------------------ the checker's marks
def test_first_wrong_token_is_marked_where_the_response_departs_from_the_reference(toy_tokenizer):
    tok = toy_tokenizer
    html, notes, shown = _page([_group(0, PROBLEM, [RIGHT, SLIP, LUCKY], [1.0, 0.0, 1.0], tok)], tok)
    assert notes == []  # the checker knows every shown group: nothing to explain
    page = Marks(html)
    # the slip and the lucky response are marked at the first digit of their wrong sum, under every method
    assert page.fw == {(m, r, FIRST_WRONG) for m in ("uniform", "ktae") for r in (1, 2)}
    for r, digit in ((1, "4"), (2, "0")):
        row = page.data["rows"][str(r)]
        assert row["tokens"][FIRST_WRONG] == digit
        assert "".join(row["tokens"][:FIRST_WRONG]) == "48 + 7 = "  # the reference's own first line so far
        assert row["first_wrong"] == FIRST_WRONG and "'48 + 7 = 55'" in row["checker"]
        assert page.meta[r]["data-first-wrong"] == str(FIRST_WRONG)
    assert page.data["rows"]["0"]["first_wrong"] is None and "data-first-wrong" not in page.meta[0]
    assert shown[0].responses[0].check.kind == "correct"


def test_a_response_that_stopped_early_is_marked_at_its_eos(toy_tokenizer):
    tok = toy_tokenizer
    short = "48 + 7 = 55\n55 - 3"
    _, _, shown = _page([_group(0, PROBLEM, [RIGHT, short], [1.0, 0.0], tok)], tok)
    check = shown[0].responses[1].check
    assert check.kind == "malformed" and check.first_wrong == len(short)  # the EOS token after the text
    assert shown[0].responses[1].tokens[check.first_wrong] == tok.eos_token


def test_right_answer_through_a_wrong_step_is_flagged_and_counted(toy_tokenizer):
    tok = toy_tokenizer
    groups = [
        _group(0, PROBLEM, [RIGHT, SLIP, LUCKY], [1.0, 0.0, 1.0], tok),
        _group(
            1,
            "Compute 9 + 4.",
            ["9 + 4 = 03\nThe answer is \\boxed{13}.", "9 + 4 = 13\nThe answer is \\boxed{13}."],
            [1.0, 1.0],
            tok,
        ),
    ]
    html, _, shown = _page(groups, tok)
    page = Marks(html)
    flagged = {r for r, a in page.meta.items() if a.get("data-wrong-step") == "1"}
    assert flagged == {2, 3}  # the lucky one and "9 + 4 = 03" with 13 boxed; not the slip (wrong answer)
    assert [r.check.right_answer_wrong_step for g in shown for r in g.responses] == [
        False,
        False,
        True,
        True,
        False,
    ]
    assert page.checker is not None
    assert page.checker["data-wrong-steps"] == "2" and page.checker["data-checked"] == "5"
    assert html.count('class="badge rw"') == 2 + 1  # two badges and the header's legend


def test_other_data_is_not_marked_and_the_page_says_why_once(toy_tokenizer):
    tok = toy_tokenizer
    other = _group(0, "What is 12+30?", ["12+30=42 \\boxed{42}", "\\boxed{41}"], [1.0, 0.0], tok)
    html, notes, shown = _page([other], tok)
    page = Marks(html)
    assert page.fw == set() and page.checker is None
    assert all(r.check is None for r in shown[0].responses)
    assert len(notes) == 1 and "only on the embedded synthetic task" in notes[0]
    assert html.count("only on the embedded synthetic task") == 1
    # a page of both kinds marks the synthetic group and says how many groups it could not mark
    _, notes, shown = _page([other, _group(1, PROBLEM, [SLIP, RIGHT], [0.0, 1.0], tok)], tok)
    assert "in 1 of the 2 shown groups" in notes[0]
    assert shown[1].responses[0].check.first_wrong == FIRST_WRONG
    # a literal prompt has no problem text for the checker to read
    _, notes, _ = _page([_group(0, None, [SLIP, RIGHT], [0.0, 1.0], tok)], tok)
    assert "only on the embedded synthetic task" in notes[0]


# ------------------------------------------------------------------------------------------ which groups
def _kinds() -> list[GroupInput]:
    scores = [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.5], [0.0, 0.0]]
    return [_group(i, PROBLEM, ["a", "b"], s) for i, s in enumerate(scores)]


def test_select_groups_by_kind_and_by_index():
    groups = _kinds()
    assert [group_kind(g) for g in groups] == ["mixed", "all-wrong", "all-right", "mixed", "all-wrong"]
    ids = lambda sel: [g.group_id for g in sel.groups]  # noqa: E731
    assert ids(select_groups(groups)) == [0, 1, 2, 3]  # as before: the first 4
    assert ids(select_groups(groups, count=2)) == [0, 1]
    assert ids(select_groups(groups, kind="mixed")) == [0, 3]
    assert ids(select_groups(groups, kind="all-wrong", count=1)) == [1]
    assert ids(select_groups(groups, kind="all-right")) == [2]
    assert ids(select_groups(groups, indices=[4, 0])) == [4, 0]  # in the order asked
    # a saved 'correct' wins over the reward (a partial reward for a wrong answer is not right)
    groups[3].completions[1].correct = False
    assert ids(select_groups(groups, kind="all-wrong")) == [1, 3, 4]
    assert parse_indices("3, 7,12,3") == [3, 7, 12]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kind": "mixd"}, r"unknown kind 'mixd' \(closest: mixed\)"),
        ({"kind": "wrong"}, r"closest: all-wrong"),
        ({"indices": [2, 5]}, r"--group-index 5: out of range; there are 5 groups \(indices 0 to 4\)"),
    ],
)
def test_select_groups_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        select_groups(_kinds(), **kwargs)


def test_a_kind_no_group_has_is_an_error_with_the_counts():
    groups = _kinds()[:2]
    with pytest.raises(
        ConfigError, match=r"none of the 2 groups is all-right \(mixed 1, all-wrong 1, all-right 0\)"
    ):
        select_groups(groups, kind="all-right")


@pytest.mark.parametrize(
    ("opts", "match"),
    [
        ({"group_index": "3,x"}, "'x' is not a group index"),
        ({"group_index": "-1"}, "negative"),
        ({"group_index": ""}, "is not a group index"),
        ({"group_index": "1", "groups": 2}, "drop --groups / --select"),
        ({"group_index": "1", "select": "mixed"}, "drop --groups / --select"),
        ({"select": "all_right"}, "closest: all-right"),
        ({"groups": 0}, "--groups must be >= 1"),
    ],
)
def test_options_check_the_selection(opts, match):
    with pytest.raises(ConfigError, match=match):
        ExplainOptions(run_dir="r", **opts).check()


# ------------------------------------------------------------------------------------------ end to end
def _write_run(run: Path, tok) -> None:
    """A run directory holding only saved rollouts: group k (id 10k) of each kind, on the synthetic task."""
    texts_scores = [
        [(RIGHT, 1.0), (SLIP, 0.0), (LUCKY, 1.0)],  # index 0: mixed
        [
            (SLIP, 0.0),
            (SLIP, 0.0),
            ("48 + 7 = 55\n55 - 3 = 51\nThe answer is \\boxed{51}.", 0.0),
        ],  # 1: all-wrong
        [(RIGHT, 1.0), (LUCKY, 1.0), (RIGHT, 1.0)],  # 2: all-right
        [(SLIP, 0.0), (RIGHT, 1.0), (RIGHT, 1.0)],  # 3: mixed
    ]
    lines = []
    for k, comps in enumerate(texts_scores):
        saved = [{"text": t, "token_ids": _ids(tok, t), "score": s, "correct": s > 0} for t, s in comps]
        lines.append(json.dumps({"group": 10 * k, "problem": PROBLEM, "answer": "52", "completions": saved}))
    (run / "rollouts").mkdir(parents=True)
    (run / "rollouts" / "step_000001.jsonl").write_text("\n".join(lines) + "\n")


def _has_orange(image) -> bool:
    """Whether a picture holds the first-wrong-token orange (#f76707, far from the blue-white-red scale)."""
    px = np.asarray(image.convert("RGB")).reshape(-1, 3).astype(int)
    r, g, b = px[:, 0], px[:, 1], px[:, 2]
    return bool(((r > 220) & (g > 70) & (g < 150) & (b < 60)).any())


def _explain(*argv) -> int:
    return cli.main(["explain", *map(str, argv)])


def test_cli_selects_marks_and_draws(tmp_path, toy_tokenizer, capsys):
    from PIL import Image

    run = tmp_path / "run"
    _write_run(run, toy_tokenizer)
    out, png = tmp_path / "e.html", tmp_path / "e.png"
    common = ["--model", "toy", "--methods", "uniform", "--out", out]
    assert _explain(run, *common, "--select", "all-wrong") == 0
    assert Marks(out.read_text()).groups == [10]
    assert _explain(run, *common, "--select", "mixed", "--groups", "1") == 0
    assert Marks(out.read_text()).groups == [0]
    assert _explain(run, *common, "--group-index", "3,1", "--png", png) == 0
    text = out.read_text()
    page = Marks(text)
    assert page.groups == [30, 10] and "those at indices 3, 1 (--group-index)" in text
    assert "index 3" in text  # each group's header says its index
    # the shown rows are batch rows 9..11 (index 3) and 3..5 (index 1); the slips are marked at their "45"
    assert page.fw == {
        ("uniform", 9, FIRST_WRONG),
        ("uniform", 3, FIRST_WRONG),
        ("uniform", 4, FIRST_WRONG),
        ("uniform", 5, len("48 + 7 = 55\n55 - 3 = 5")),
    }
    assert page.checker is not None and page.checker["data-wrong-steps"] == "0"
    # the picture boxes the first wrong token in orange (absent from the blue/white/red credit scale)
    assert _has_orange(Image.open(png))
    # the lucky answer of the all-right group is flagged in the header's count
    assert _explain(run, *common, "--select", "all-right") == 0
    assert Marks(out.read_text()).checker["data-wrong-steps"] == "1"
    # errors name the closest kind / how many groups there are
    capsys.readouterr()
    assert _explain(run, *common, "--select", "mixd") == 2
    assert "closest: mixed" in capsys.readouterr().err
    assert _explain(run, *common, "--group-index", "2,4") == 2
    assert "there are 4 groups (indices 0 to 3)" in capsys.readouterr().err
    assert len(load_run_rollouts(run)[1]) == 4


def test_png_without_marks_has_no_orange(tmp_path, toy_tokenizer):
    """The orange-pixel check above can fail: a page without marks draws none."""
    from PIL import Image

    from tokencredit.explain.picture import draw_png

    tok = toy_tokenizer
    groups = [_group(0, "What is 1+1?", ["2", "3"], [1.0, 0.0], tok)]
    batch = assemble_batch(groups, tok)
    texts = [[tok.decode([i]) for i in c.token_ids] for g in groups for c in g.completions]
    shown = make_groups(batch, texts, advantages.grpo(batch.scores, batch.group_ids))
    data = explain_batch(batch, resolve_methods(["uniform"]), shown)
    assert not _has_orange(Image.open(draw_png(data, tmp_path / "p.png")))

"""`tokencredit explain --methods saved,...`: the Â saved with the rollouts (as trained) shown as a column,
equal to the file's numbers and, for a real run, to its own recipe recomputed; probe rejects it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_explain import Page

from conftest import _micro_sets
from tokencredit import advantages, cli
from tokencredit.batch import RolloutBatch
from tokencredit.columns import SAVED, MethodSpec, SavedSpec, resolve_columns, resolve_methods
from tokencredit.data.synthetic import TAIL_ALPHABET
from tokencredit.errors import ConfigError
from tokencredit.explain import ExplainOptions, explain_batch, make_groups, write_report
from tokencredit.explain import pipeline as explain_pipeline
from tokencredit.explain.assemble import SavedCredit
from tokencredit.explain.picture import _lines
from tokencredit.recipes import known_names
from tokencredit.rollout import records


def _explain(*argv: object) -> int:
    return cli.main(["explain", *map(str, argv)])


def _file_hats(path: Path) -> list[list[float] | None]:
    """Every completion's saved Â as the file holds it, rows in file order."""
    rows = []
    for line in path.read_text().splitlines():
        rows += [c.get("token_advantages") for c in json.loads(line)["completions"]]
    return rows


def _page_rows(page: Page, method: str) -> dict[int, list[float]]:
    """{row: [value per token]} of one column, read from the token spans' data-a."""
    out: dict[int, dict[int, float]] = {}
    for (m, r, t), cell in page.tokens.items():
        if m == method:
            out.setdefault(r, {})[t] = float(cell["a"])
    return {r: [v[t] for t in sorted(v)] for r, v in out.items()}


# ------------------------------------------------------------------------------------------ names
def test_saved_is_explains_column_and_probe_rejects_it():
    assert SAVED == "saved" and SAVED not in known_names()  # never shadows a recipe or credit method
    specs = resolve_columns(["grpo", " saved", "ktae", "saved"], run_recipe=None)
    assert [s.name for s in specs] == ["grpo", "saved", "ktae"]
    assert isinstance(specs[1], SavedSpec) and specs[1].label == "as trained"
    assert all(isinstance(s, MethodSpec) for s in (specs[0], specs[2]))
    with pytest.raises(ConfigError, match="closest: saved"):
        resolve_columns(["savd"])
    with pytest.raises(ConfigError, match="closest: ktae"):
        resolve_columns(["ktea"])
    with pytest.raises(ConfigError, match="probe samples its own rollouts"):
        resolve_methods(["grpo", "saved"])


def test_probe_cli_rejects_saved(tiny_model_dir, tmp_path, capsys):
    argv = [
        "probe",
        "--model",
        tiny_model_dir,
        "--groups",
        "1",
        "--group-size",
        "2",
        "--methods",
        "saved,grpo",
    ]
    assert cli.main(argv + ["--out", str(tmp_path / "p.json")]) == 2
    assert "'saved' is explain's column" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


def test_a_shown_row_without_saved_credit_is_skipped_with_a_note():
    mask = torch.tensor([[True, True, False], [True, True, True]])
    batch = RolloutBatch(
        token_ids=torch.ones(2, 3, dtype=torch.int64),
        mask=mask,
        group_ids=torch.tensor([0, 0]),
        scores=torch.tensor([1.0, 0.0]),
    )
    seq = advantages.grpo(batch.scores, batch.group_ids)
    groups = make_groups(batch, [["a", "b"], ["c", "d", "e"]], seq)
    hat = torch.tensor([[0.5, -1.0, 0.0], [0.25, 2.0, -3.0]])
    full = SavedCredit(hat, torch.tensor([0.7, -0.7]), torch.tensor([True, True]))
    data = explain_batch(batch, [SavedSpec(), *resolve_methods(["grpo"])], groups, saved=full)
    saved = data.methods[0]
    assert saved.credit == {0: [0.5, -1.0], 1: [0.25, 2.0, -3.0]}
    assert saved.seq_advantages == pytest.approx({0: 0.7, 1: -0.7})  # the file's A, not the recomputed one
    part = SavedCredit(hat, torch.tensor([0.7, 0.0]), torch.tensor([True, False]))
    data = explain_batch(batch, [SavedSpec(), *resolve_methods(["grpo"])], groups, saved=part)
    assert data.methods[0].skipped and "1 shown response(s) carry no token_advantages" in data.methods[0].note
    assert not data.methods[1].skipped


# ------------------------------------------------------------------------------------------ a JSONL of saved rollouts
def _write_rollouts(path: Path, model_dir: str, *, missing: bool = False) -> None:
    """Two groups written by the one writer (`tokencredit.rollout.records`), each completion with a random Â
    (with `missing`, the second group's second completion has none)."""
    from tokencredit.models import load_tokenizer

    tok = load_tokenizer(model_dir)
    gen = torch.Generator().manual_seed(3)
    lines = []
    for g, (problem, texts, rewards) in enumerate(
        [
            ("What is 12+30?", ["12+30=42 \\boxed{42}", "\\boxed{41}"], [1.0, 0.0]),
            ("Say 7.", ["7", "six"], [1.0, 0.0]),
        ]
    ):
        comps = []
        for text, r in zip(texts, rewards):
            ids = tok(text, add_special_tokens=False)["input_ids"]
            hat = torch.randn(len(ids), generator=gen)
            comps.append(
                records.completion_record(
                    text=text,
                    token_ids=ids,
                    score=r,
                    advantage=r - 0.5,
                    token_advantages=hat,
                )
            )
        if missing and g == 1:
            del comps[1]["token_advantages"]
        lines.append(
            records.group_record(
                step=3,
                recipe="grpo+ktae",
                credit="ktae",
                group=g,
                completions=comps,
                problem=problem,
            )
        )
    path.write_text(records.jsonl_text(lines))


def test_jsonl_saved_column_shows_the_files_numbers(tmp_path, tiny_model_dir, monkeypatch):
    f = tmp_path / "rollouts.jsonl"
    _write_rollouts(f, tiny_model_dir)
    drawn = []

    def draw(data, path):  # the picture's data, then the real picture
        drawn.append(data)
        return real_draw(data, path)

    real_draw = explain_pipeline.draw_png
    monkeypatch.setattr(explain_pipeline, "draw_png", draw)
    out, png = tmp_path / "r.html", tmp_path / "r.png"
    assert (
        _explain(
            "--jsonl", f, "--model", tiny_model_dir, "--methods", "saved,grpo", "--out", out, "--png", png
        )
        == 0
    )
    text = out.read_text()
    page = Page(text)
    hats = _file_hats(f)
    saved = _page_rows(page, "saved")
    assert sorted(saved) == [0, 1, 2, 3]
    for r, values in saved.items():
        assert values == pytest.approx(hats[r], abs=1e-6)
        assert page.data["rows"][str(r)]["credit"]["saved"] == pytest.approx(hats[r], abs=1e-6)
    # grpo is recomputed (uniform A of the rewards), not read from the file
    a = advantages.grpo(torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1]))
    for r, values in _page_rows(page, "grpo").items():
        assert values == pytest.approx([float(a[r])] * len(values), abs=1e-6)
    assert "as trained" in text and page.diag[("saved", "credit_gini")] != ""
    assert ("saved", "grpo") in page.corr
    # the PNG draws the same numbers on a line labelled "saved" per response
    assert png.is_file() and len(drawn) == 1
    lines = [
        toks for g in drawn[0].groups[:1] for label, toks in _lines(g, drawn[0].methods) if label == "saved"
    ]
    assert [[v for _, v, _, _ in toks] for toks in lines] == [
        pytest.approx(hats[r], abs=1e-6) for r in (0, 1)
    ]


def test_saved_without_token_advantages_is_an_error_naming_the_group(tmp_path, tiny_model_dir, capsys):
    f = tmp_path / "rollouts.jsonl"
    _write_rollouts(f, tiny_model_dir, missing=True)
    # raised before any model loads: the model path need not exist
    opts = ExplainOptions(jsonl=f, model=tmp_path / "no-model", methods="grpo,saved", out=tmp_path / "x.html")
    with pytest.raises(ConfigError, match=rf"{f}:2 \(group 1\): completions\[1\] has no token_advantages"):
        write_report(opts)
    assert (
        _explain("--jsonl", f, "--model", tiny_model_dir, "--methods", "saved", "--out", tmp_path / "x.html")
        == 2
    )
    assert "has no token_advantages" in capsys.readouterr().err
    # only the shown groups need it: group 0 alone is explained
    assert (
        _explain(
            "--jsonl",
            f,
            "--model",
            tiny_model_dir,
            "--methods",
            "saved,grpo",
            "--group-index",
            "0",
            "--out",
            tmp_path / "g0.html",
        )
        == 0
    )
    assert set(_page_rows(Page((tmp_path / "g0.html").read_text()), "saved")) == {0, 1}
    # a short-form line (texts and rewards) has no Â at all
    f.write_text(json.dumps({"prompt": "p", "completions": ["a", "b"], "rewards": [1, 0]}) + "\n")
    with pytest.raises(ConfigError, match=rf"{f}:1 \(group 0\): completions\[0\]"):
        write_report(ExplainOptions(jsonl=f, model=tiny_model_dir, methods="saved"))


# ------------------------------------------------------------------------------------------ a real run, round trip
RECIPE = (
    "grpo+ktae"  # per-token (its column is Â itself) and read from the token ids only: nothing recomputed
)


@pytest.fixture(scope="module")
def trained_run(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-step micro run of `RECIPE` whose last step's whole batch (2 groups) is saved; the reward is
    1 for an odd number of characters, so the random tiny model gets mixed groups (non-zero A)."""
    root = tmp_path_factory.mktemp("saved")
    (root / "_parity_reward.py").write_text(
        "def odd_length(completions, golds, **_):\n    return [float(len(c) % 2) for c in completions]\n"
    )
    sets = _micro_sets(
        tiny_model_dir, steps=2, **{"eval.save_groups": 2, "reward.function": "_parity_reward:odd_length"}
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(root))
        assert (
            cli.main(
                ["train", "--recipe", RECIPE, "--out", str(root / "run")]
                + [a for s in sets for a in ("--set", s)]
            )
            == 0
        )
    return root / "run"


def test_run_saved_column_equals_the_runs_recipe_recomputed(trained_run, tmp_path):
    out = tmp_path / "run.html"
    assert (
        _explain(
            trained_run,
            "--methods",
            f"saved,{RECIPE},uniform",
            "--select",
            "any",
            "--groups",
            "2",
            "--out",
            out,
        )
        == 0
    )
    page = Page(out.read_text())
    hats = _file_hats(trained_run / "rollouts" / "step_000002.jsonl")
    saved, recomputed = _page_rows(page, "saved"), _page_rows(page, RECIPE)
    assert sorted(saved) == list(range(len(hats))) == sorted(recomputed)
    # the test means something: Â varies within a response, unlike uniform credit
    assert any(max(h) - min(h) > 0.5 for h in hats if h)
    assert any(saved[r] != pytest.approx(v, abs=1e-3) for r, v in _page_rows(page, "uniform").items())
    for r in saved:
        assert saved[r] == pytest.approx(hats[r], abs=1e-6)  # the file's numbers
        # same batch (the whole step saved), same recipe, same token ids: the trainer's Â, recomputed
        assert saved[r] == pytest.approx(recomputed[r], abs=1e-5)
    assert f"recipe {RECIPE}" in out.read_text()  # the column's description names the run's recipe


def test_a_tail_mask_run_explains_as_it_trained(tmp_path):
    """A run of GRPO with the tail mask on toy-tail-32: explain rebuilds the batch's tail (the trainer's rule),
    so the run's recipe recomputed and the `tail-mask` column equal the saved Â, all zero on the tail."""
    run = tmp_path / "run"
    sets = [
        "run.steps=1",
        "run.progress=false",
        "run.threads=1",
        "rollout.prompts_per_step=6",
        "rollout.group_size=4",
        "data.eval_size=3",
        "eval.every=0",
        "eval.samples=0",
        "eval.at_start=false",
        "eval.save_groups=6",
        "algo.zero_tail=true",
    ]
    argv = ["train", "--config", "toy-tail-32", "--recipe", "grpo", "--out", str(run)]
    assert cli.main(argv + [a for s in sets for a in ("--set", s)]) == 0
    out = tmp_path / "tail.html"
    assert (
        _explain(run, "--methods", "saved,grpo,tail-mask", "--select", "any", "--groups", "6", "--out", out)
        == 0
    )
    page = Page(out.read_text())
    hats = _file_hats(run / "rollouts" / "step_000001.jsonl")
    saved, grpo, mask = (_page_rows(page, m) for m in ("saved", "grpo", "tail-mask"))
    assert sorted(saved) == sorted(grpo) == sorted(mask) == list(range(len(hats)))
    assert any(h and max(abs(x) for x in h) > 0 for h in hats)  # a batch with credit
    for r in saved:
        assert saved[r] == pytest.approx(grpo[r], abs=1e-5) and saved[r] == pytest.approx(mask[r], abs=1e-5)
    # the tail (the letters after a complete answer line; the toy's tokens are characters, and the EOS after them
    # is not on the tail) gets none
    texts = [
        c["text"]
        for line in (run / "rollouts" / "step_000001.jsonl").read_text().splitlines()
        for c in json.loads(line)["completions"]
    ]
    tails = [t[t.rindex("}.\n") + 3 :] if "}.\n" in t else "" for t in texts]
    tails = [len(x) if set(x) <= set(TAIL_ALPHABET) else 0 for x in tails]  # a tail of letters only
    checked = [(h, n) for h, n in zip(hats, tails) if h and any(h) and n > 0]
    assert checked and all(h[-n - 1 : -1] == [0.0] * n and h[0] != 0.0 for h, n in checked)

"""`tokencredit explain`: the numbers on the page equal the core's; inputs, errors, CLI, screenshot."""

from __future__ import annotations

import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

from tokencredit import advantages, cli, diagnostics
from tokencredit.batch import RolloutBatch
from tokencredit.columns import resolve_methods
from tokencredit.data.loaders import DataError
from tokencredit.errors import ConfigError
from tokencredit.explain import (
    assemble_batch,
    explain_batch,
    load_jsonl,
    load_run_rollouts,
    make_groups,
)
from tokencredit.explain.render import DIAGNOSTIC_COLUMNS, build_report, colour
from tokencredit.recipes import RECIPES, token_credit


# ------------------------------------------------------------------------------------------ page parser
class Page(HTMLParser):
    """Collects token spans, diagnostics cells, correlation cells, legends, the JSON blob and external refs."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tokens: dict[tuple[str, int, int], dict] = {}
        self.diag: dict[tuple[str, str], str] = {}
        self.diag_text: dict[tuple[str, str], str] = {}
        self.corr: dict[tuple[str, str], tuple[str, int]] = {}
        self.skipped: dict[str, str] = {}
        self.legends = 0
        self.external: list[str] = []
        self.blob = ""
        self._cell: list[tuple[str, int] | None] = []
        self._capture: tuple | None = None
        self._in_blob = False
        self._skip_row: str | None = None
        self.feed(text)
        self.data = json.loads(self.blob)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("src", "href"):
            if a.get(key):
                self.external.append(a[key])
        if tag == "link":
            self.external.append(str(a))
        cls = (a.get("class") or "").split()
        if tag == "div":
            self._cell.append((a["data-m"], int(a["data-r"])) if "cell" in cls else None)
        if tag == "span" and "t" in cls:
            m, r = next(x for x in reversed(self._cell) if x is not None)
            self.tokens[(m, r, int(a["data-t"]))] = {
                "a": a["data-a"],
                "style": a.get("style", ""),
            }
        if tag == "span" and "legend" in cls:
            self.legends += 1
        if tag == "td" and "data-k" in a:
            self.diag[(a["data-m"], a["data-k"])] = a["data-value"]
            self._capture = ("diag", a["data-m"], a["data-k"])
        if tag == "td" and "data-b" in a:
            self.corr[(a["data-a"], a["data-b"])] = (a["data-value"], int(a["data-rows"]))
        if tag == "tr" and "skipped" in cls:
            self._skip_row = a["data-m"]
        if tag == "td" and "skip" in cls and self._skip_row:
            self._capture = ("skip", self._skip_row)
        if tag == "script" and a.get("id") == "tc-data":
            self._in_blob = True

    def handle_endtag(self, tag):
        if tag == "div" and self._cell:
            self._cell.pop()
        if tag == "script":
            self._in_blob = False
        if tag == "td":
            self._capture = None

    def handle_data(self, data):
        if self._in_blob:
            self.blob += data
        elif self._capture and self._capture[0] == "diag":
            self.diag_text[self._capture[1:]] = data
        elif self._capture and self._capture[0] == "skip":
            self.skipped[self._capture[1]] = self.skipped.get(self._capture[1], "") + data


# ------------------------------------------------------------------------------------------ a batch without a model
def make_batch(seed: int = 0) -> RolloutBatch:
    gen = torch.Generator().manual_seed(seed)
    n_groups, g, t = 3, 4, 10
    n = n_groups * g
    lengths = torch.randint(3, t + 1, (n,), generator=gen)
    lengths[0] = t
    mask = torch.arange(t)[None, :] < lengths[:, None]
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0])
    logp = -(torch.rand(n, t, generator=gen) * 3 + 0.01)
    return RolloutBatch(
        token_ids=torch.randint(0, 9, (n, t), generator=gen),
        mask=mask,
        group_ids=torch.tensor([7, 7, 7, 7, 3, 3, 3, 3, 5, 5, 5, 5]),
        scores=scores,
        old_log_probs=logp * mask,
        entropy=torch.rand(n, t, generator=gen) * 3 * mask,
        hidden=torch.randn(n, t, 8, generator=gen),
        truncated=torch.zeros(n, dtype=torch.bool),
    )


METHODS = ["ktae", "delta", "strace", "arca", "uniform", "gspo", "entropy-80-20"]


@pytest.fixture(scope="module")
def offline():
    batch = make_batch()
    seq = advantages.grpo(batch.scores, batch.group_ids)
    tokens = [
        [f"<t{int(x)}>" if j % 4 else f"w{int(x)} " for j, x in enumerate(row[m])]
        for row, m in zip(batch.token_ids, batch.mask)
    ]
    tokens[0][1] = "<script>alert(1)</script>"
    tokens[0][2] = "\n"
    specs = resolve_methods(METHODS)
    groups = make_groups(batch, tokens, seq, problems={7: "2+2?", 3: "3+3?"}, groups=2)
    data = explain_batch(
        batch, specs, groups, notes=["a note"], unavailable={"base_hidden": "no LoRA adapter here"}
    )
    html = build_report(data)
    return batch, seq, specs, groups, data, html, Page(html)


def shown_rows(groups):
    return [r.row for g in groups for r in g.responses]


def test_token_colours_and_values_equal_the_cores_effective_credit(offline):
    batch, _, specs, groups, _, _, page = offline
    rows = shown_rows(groups)
    assert rows == [0, 1, 2, 3, 4, 5, 6, 7]  # the first two groups, in batch order
    for spec in specs:
        if spec.name == "arca":
            continue
        eff = token_credit(spec.recipe, batch).effective()
        for r in rows:
            n = int(batch.mask[r].sum())
            for t in range(n):
                cell = page.tokens[(spec.name, r, t)]
                assert float(cell["a"]) == pytest.approx(float(eff[r, t]), abs=1e-6, rel=1e-6)
                assert page.data["rows"][str(r)]["credit"][spec.name][t] == pytest.approx(
                    float(eff[r, t]), abs=1e-6
                )
            assert (spec.name, r, n) not in page.tokens
    assert not any(k[0] == "arca" for k in page.tokens)


def test_diagnostics_equal_tokencredit_diagnostics(offline):
    batch, _, specs, groups, _, _, page = offline
    idx = torch.tensor(shown_rows(groups))
    for spec in specs:
        if spec.name == "arca":
            continue
        rc = token_credit(spec.recipe, batch)
        want = diagnostics.summary(
            rc.effective()[idx], batch.mask[idx], rc.seq_advantages[idx], batch.entropy[idx]
        )
        for key, _, _ in DIAGNOSTIC_COLUMNS:
            assert float(page.diag[(spec.name, key)]) == pytest.approx(want[key], abs=1e-12)
            assert page.diag_text[(spec.name, key)] == f"{want[key]:.3f}".replace("-", "−")
            assert page.data["methods"][[m["name"] for m in page.data["methods"]].index(spec.name)][
                "diagnostics"
            ][key] == pytest.approx(want[key], abs=1e-6)
    # strace's on-policy credit is sparse (kept tokens only), uniform's is not
    assert float(page.diag[("strace", "credit_gini")]) > 0.3 > float(page.diag[("uniform", "credit_gini")])


def test_rank_correlations_equal_the_cores(offline):
    batch, _, specs, groups, _, _, page = offline
    idx = torch.tensor(shown_rows(groups))
    m = batch.mask[idx]
    eff = {s.name: token_credit(s.recipe, batch).effective()[idx] for s in specs if s.name != "arca"}
    rho = diagnostics.rank_correlation(eff["ktae"], eff["delta"], m)
    value, n = page.corr[("ktae", "delta")]
    assert n == int(m.sum(-1).ge(2).sum()) and n > 0  # both vary on every response with >= 2 tokens
    assert float(value) == pytest.approx(float(rho.mean()), abs=1e-12)
    assert page.corr[("delta", "ktae")] == page.corr[("ktae", "delta")]
    # uniform is constant within each response: its correlation is undefined, shown as n/a
    assert page.corr[("uniform", "ktae")] == ("", 0)
    assert page.corr[("ktae", "ktae")][0] == "1.0"
    assert ("arca", "ktae") not in page.corr


def test_skipped_method_is_explained_not_fatal(offline):
    *_, data, _, page = offline
    arca = next(m for m in data.methods if m.name == "arca")
    assert arca.skipped and "base_hidden" in arca.note and "no LoRA adapter here" in arca.note
    assert "no LoRA adapter here" in page.skipped["arca"]
    assert [m["skipped"] for m in page.data["methods"] if m["name"] == "arca"] == [True]


def test_page_is_self_contained_escaped_and_has_legends(offline):
    batch, seq, _, groups, _, html, page = offline
    assert page.external == []
    assert "http://" not in html and "https://" not in html
    assert "<script>alert(1)</script>" not in html  # the hostile token is escaped everywhere
    assert page.data["rows"]["0"]["tokens"][1] == "<script>alert(1)</script>"
    assert "↵" in html and "a note" in html
    assert page.legends >= 6 * len(groups)  # one per shown method and group
    row0 = page.data["rows"]["0"]
    n0 = int(batch.mask[0].sum())
    assert row0["entropy"] == pytest.approx(batch.entropy[0, :n0].tolist(), abs=1e-6)
    assert row0["prob"] == pytest.approx(batch.old_log_probs[0, :n0].exp().tolist(), rel=1e-6)
    assert row0["reward"] == 1.0 and row0["advantage"] == pytest.approx(float(seq[0]), abs=1e-6)


def test_diverging_colour_scale_is_centred_at_zero():
    assert colour(0.0, 2.0) == ("rgb(255,255,255)", False)
    pos, dark = colour(2.0, 2.0)
    assert pos == "rgb(33,102,172)" and dark
    r, g, b = (int(x) for x in colour(-1.0, 2.0)[0][4:-1].split(","))
    assert r > g and r > b  # red below zero
    assert colour(5.0, 2.0) == colour(2.0, 2.0) and colour(1.0, 0.0)[0] == "rgb(255,255,255)"


def test_resolve_methods():
    specs = resolve_methods(["ktae", "strace", "credit:delta", "recipe:delta", "ktae"], advantage="rloo")
    assert [s.name for s in specs] == ["ktae", "strace", "credit:delta", "recipe:delta"]
    assert (
        specs[0].kind == "credit"
        and specs[0].recipe.advantage == "rloo"
        and specs[0].recipe.kernel == "token"
    )
    assert specs[1].kind == "recipe" and specs[1].recipe is RECIPES["strace"]
    run_recipe = RECIPES["strace"].with_overrides(kernel_params={"lam": 0.5, "keep_ratio": 0.3})
    assert resolve_methods(["strace"], run_recipe=run_recipe)[0].recipe.kernel_params["lam"] == 0.5
    with pytest.raises(ConfigError, match="closest: ktae"):
        resolve_methods(["ktea"])
    with pytest.raises(ConfigError, match="prefix"):
        resolve_methods(["foo:ktae"])


# ------------------------------------------------------------------------------------------ JSONL input errors
@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("{not json", r":3:2: malformed JSON line"),
        (
            '{"prompt": "p", "completions": ["a"], "rewards": [1.0],}',
            r":3:56: malformed JSON line .*trailing comma at column 55",
        ),
        ('{"prompt": "p", "completions": ["a", "b"], "rewards": [1.0]}', "rewards"),
        ('{"completions": ["a"], "rewards": [1.0]}', "'prompt'"),
        ('{"prompt": "p", "completions": ["a"], "rewards": [NaN]}', "finite"),
        ('{"prompt": "p", "completions": []}', "non-empty"),
        ('{"prompt": "p", "completions": [{"token_ids": [1, 2], "entropy": [0.1]}]}', "score"),
        (
            '{"prompt": "p", "completions": [{"token_ids": [1, 2], "score": 1, "entropy": [0.1]}]}',
            r"entropy must",
        ),
        ("[1, 2]", "JSON object"),
    ],
)
def test_malformed_jsonl_names_file_and_line(tmp_path, line, match):
    f = tmp_path / "in.jsonl"
    f.write_text('{"prompt": "ok", "completions": ["x"], "rewards": [0.5]}\n\n' + line + "\n")
    with pytest.raises(DataError, match=match) as e:
        load_jsonl(f)
    assert f"{f}:3:" in str(e.value)


def test_jsonl_group_ids_and_run_schema_lines(tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_text(
        '{"problem": "1+1", "completions": ["2", "3"], "rewards": [1, 0], "answer": ["2", "two"]}\n'
        '{"group": 9, "prompt": "P", "completions": [{"text": "a", "token_ids": [5, 6], "score": 1.0, '
        '"entropy": [0.5, 0.25], "correct": true}]}\n'
    )
    groups = load_jsonl(f)
    assert [g.group_id for g in groups] == [0, 9] and groups[0].answer == "2 | two"
    b = assemble_batch(groups[1:])
    assert (
        b.token_ids.tolist() == [[5, 6]] and b.entropy.tolist() == [[0.5, 0.25]] and b.old_log_probs is None
    )
    f.write_text(
        '{"prompt": "p", "completions": ["a"], "rewards": [1]}\n{"group": 0, "prompt": "q", '
        '"completions": ["b"], "rewards": [1]}\n'
    )
    with pytest.raises(DataError, match="repeats"):
        load_jsonl(f)


# ------------------------------------------------------------------------------------------ with a tiny model
@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from tokencredit.models import build_toy_model, build_toy_tokenizer

    tok = build_toy_tokenizer()
    model = build_toy_model(
        {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 16,
        },
        seed=0,
        tokenizer=tok,
    )
    d = tmp_path_factory.mktemp("tiny") / "model"
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _explain(*argv: str) -> int:
    return cli.main(["explain", *map(str, argv)])


def test_cli_jsonl_recomputes_signals_with_the_model(tmp_path, tiny_model_dir):
    from tokencredit.data.templates import render
    from tokencredit.models import load_model
    from tokencredit.signals import token_log_probs

    f = tmp_path / "in.jsonl"
    f.write_text(
        json.dumps(
            {
                "problem": "What is 12+30?",
                "completions": ["12+30=42 \\boxed{42}", "\\boxed{41}", "4"],
                "rewards": [1.0, 0.0, 0.0],
            }
        )
        + "\n"
        + json.dumps({"prompt": "Say hi.\n", "completions": ["hi", "ho"], "rewards": [1.0, 0.0]})
        + "\n"
    )
    out = tmp_path / "report.html"
    assert (
        _explain(
            "--jsonl", f, "--model", tiny_model_dir, "--methods", "ktae,delta,arca,uniform,gcpo", "--out", out
        )
        == 0
    )
    page = Page(out.read_text())
    assert "LoRA" in page.skipped["arca"]
    assert "'problem' text" in page.skipped["gcpo"]  # the second group gives a literal prompt only
    # entropy and probability of the first completion = an independent forward on the templated prompt
    model, tok = load_model(str(tiny_model_dir))
    prompt = tok(render("qwen-math", "What is 12+30?", tok), add_special_tokens=True)["input_ids"]
    resp = tok("12+30=42 \\boxed{42}", add_special_tokens=False)["input_ids"]
    seq = torch.tensor([prompt + resp])
    logp, ent = token_log_probs(model, seq, torch.ones_like(seq), len(prompt), with_entropy=True)
    row = page.data["rows"]["0"]
    assert row["tokens"] == [tok.decode([i]) for i in resp]
    assert row["prob"] == pytest.approx(logp[0].exp().tolist(), abs=1e-5)
    assert row["entropy"] == pytest.approx(ent[0].tolist(), abs=1e-4)
    assert page.data["rows"]["3"]["tokens"] == ["h", "i"]  # the literal prompt group
    # delta's credit came from recomputed hidden states: it is not uniform within a response
    delta = page.data["rows"]["0"]["credit"]["delta"]
    assert max(delta) - min(delta) > 1e-6
    assert _explain("--jsonl", f) == 2  # --model is required


def _write_run(
    run: Path, model_dir: Path | None, *, lora_rank: int = 0, steps=(1, 2), mc: bool = False
) -> None:
    """A run directory as the trainer leaves it: config.toml, recipe.json, rollouts/, final/ (with `mc`,
    completions carry the Monte-Carlo values an oracle / vineppo run saves)."""
    from tokencredit.train.config import TrainConfig, dump_toml

    cfg = TrainConfig()
    cfg.model.name = str(model_dir) if model_dir is not None else "toy"
    cfg.model.lora_rank = lora_rank
    cfg.model.lora_targets = ["q_proj", "v_proj"]
    cfg.algo.recipe = "strace"
    run.mkdir(parents=True)
    (run / "config.toml").write_text(dump_toml(cfg))
    recipe = RECIPES["strace"].with_overrides(
        kernel_params={"lam": 0.9, "keep_ratio": 0.25, "scope": "batch"}
    )
    (run / "recipe.json").write_text(json.dumps(recipe.to_dict()))
    gen = torch.Generator().manual_seed(0)
    (run / "rollouts").mkdir()
    for step in steps:
        lines = []
        for gid in range(3):
            comps = []
            for k in range(4):
                n = int(torch.randint(2, 9, (1,), generator=gen))
                ids = torch.randint(4, 60, (n,), generator=gen).tolist()
                comps.append(
                    {
                        "text": "x" * n,
                        "token_ids": ids,
                        "tokens": [chr(i + 29) for i in ids],
                        "score": float(k % 2 == 0 or gid == 2),
                        "correct": k % 2 == 0,
                        "advantage": 0.0,
                        "token_advantages": [0.0] * n,
                        "entropy": [round(float(x), 5) for x in torch.rand(n, generator=gen) * 3],
                        "old_log_probs": [round(float(x), 5) for x in -torch.rand(n, generator=gen) * 4],
                        "truncated": False,
                        **(
                            {
                                "mc_advantages": [round(float(x), 6) for x in torch.randn(n, generator=gen)],
                                "mc_step_advantages": [
                                    round(float(x), 6) for x in torch.randn(n, generator=gen)
                                ],
                            }
                            if mc
                            else {}
                        ),
                    }
                )
            lines.append(
                json.dumps(
                    {
                        "step": step,
                        "recipe": "strace",
                        "credit": "uniform",
                        "group": gid * 10,
                        "id": f"p{gid}",
                        "problem": f"Compute {gid} + {step}.",
                        "answer": str(gid + step),
                        "completions": comps,
                    }
                )
            )
        (run / "rollouts" / f"step_{step:06d}.jsonl").write_text("\n".join(lines) + "\n")
    if model_dir is not None:
        shutil.copytree(model_dir, run / "final")


def test_cli_run_dir_reads_saved_signals(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    _write_run(run, tiny_model_dir)
    assert _explain(run, "--methods", "ktae,strace,uniform,delta,arca,gcpo", "--groups", "2") == 0
    out = run / "explain_step_000002.html"  # the latest saved step by default
    page = Page(out.read_text())
    assert len({k[1] for k in page.tokens}) == 8  # 2 groups x 4 responses
    assert "model.lora_rank = 0" in page.skipped["arca"]
    assert "gcpo" not in page.skipped and "delta" not in page.skipped  # recomputed with RUN_DIR/final
    # rebuild the batch from the saved file and check the page against the core
    step, groups = load_run_rollouts(run)
    assert step == 2
    batch = assemble_batch(groups)
    spec = resolve_methods(["strace"], run_recipe=json_recipe(run))[0]
    assert spec.recipe.kernel_params["lam"] == 0.9  # the run's overridden recipe
    eff = token_credit(spec.recipe, batch).effective()
    for (m, r, t), cell in page.tokens.items():
        if m == "strace":
            assert float(cell["a"]) == pytest.approx(float(eff[r, t]), abs=1e-6)
    assert page.data["rows"]["0"]["entropy"] == pytest.approx(groups[0].completions[0].entropy, abs=1e-6)
    # --step picks an earlier step; an unknown step lists the saved ones
    assert _explain(run, "--step", "1", "--methods", "uniform", "--out", tmp_path / "s1.html") == 0
    assert "Compute 0 + 1." in (tmp_path / "s1.html").read_text()
    with pytest.raises(ConfigError, match="saved steps: 1, 2"):
        load_run_rollouts(run, 5)


def json_recipe(run: Path):
    from tokencredit.recipes import Recipe

    return Recipe(**json.loads((run / "recipe.json").read_text()))


def test_cli_run_dir_without_a_model_still_reports(tmp_path):
    run = tmp_path / "run"
    _write_run(run, None, steps=(3,))
    assert (
        _explain(run, "--methods", "ktae,delta,uniform", "--advantage", "rloo", "--out", tmp_path / "r.html")
        == 0
    )
    page = Page((tmp_path / "r.html").read_text())
    batch = assemble_batch(load_run_rollouts(run)[1])
    rloo = advantages.rloo(batch.scores, batch.group_ids)
    assert page.data["rows"]["1"]["advantage"] == pytest.approx(float(rloo[1]), abs=1e-6)
    assert page.data["rows"]["1"]["credit"]["uniform"][0] == pytest.approx(float(rloo[1]), abs=1e-6)
    assert "hidden" in page.skipped["delta"]
    assert page.data["rows"]["0"]["tokens"] == [
        chr(i + 29) for i in load_run_rollouts(run)[1][0].completions[0].token_ids
    ]
    assert {k[0] for k in page.tokens} == {"ktae", "uniform"}


def test_cli_lora_run_restores_the_adapter_for_arca(tmp_path, tiny_model_dir):
    from peft import LoraConfig, get_peft_model

    from tokencredit.models import load_model
    from tokencredit.train import checkpoint as ckpt

    run = tmp_path / "run"
    _write_run(run, tiny_model_dir, lora_rank=4)
    base, _ = load_model(str(tiny_model_dir))
    model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=16.0, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    )
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)  # a moved adapter (B = 0 would make ARCA exactly uniform)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    ckpt.save_checkpoint(run, 2, model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))
    assert _explain(run, "--methods", "arca,uniform", "--out", tmp_path / "a.html") == 0
    page = Page((tmp_path / "a.html").read_text())
    assert "arca" not in page.skipped
    vals = page.data["rows"]["0"]["credit"]["arca"]
    adv = page.data["rows"]["0"]["advantage"]
    assert sum(vals) / len(vals) == pytest.approx(adv, abs=1e-4)  # ARCA's Â keeps each row's mean at A
    assert max(vals) - min(vals) > 1e-4


def test_cli_oracle_and_vineppo_use_the_values_a_run_saved(tmp_path):
    # no model at all: the saved Monte-Carlo values are the columns' only source, nothing is sampled
    run = tmp_path / "run"
    _write_run(run, None, steps=(1,), mc=True)
    assert _explain(run, "--methods", "oracle,vineppo,uniform", "--out", tmp_path / "o.html") == 0
    page = Page((tmp_path / "o.html").read_text())
    assert not {"oracle", "vineppo"} & set(page.skipped)
    groups = load_run_rollouts(run)[1]
    batch = assemble_batch(groups)
    for name, field in (("oracle", "mc_advantages"), ("vineppo", "mc_step_advantages")):
        eff = token_credit(RECIPES[name], batch).effective()
        assert torch.equal(token_credit(RECIPES[name], batch).token_advantages, getattr(batch, field))
        for (m, r, t), cell in page.tokens.items():
            if m == name:
                assert float(cell["a"]) == pytest.approx(float(eff[r, t]), abs=1e-6)
    notes = (tmp_path / "o.html").read_text()
    assert "the policy that sampled them): entropy, mc_advantages, mc_step_advantages, old_log_probs" in notes
    assert "Monte-Carlo values sampled" not in notes


def test_cli_jsonl_samples_the_oracles_values_with_the_model(tmp_path, tiny_model_dir):
    # A* telescopes: sum_t A*_t = R - V(prompt), so a rewarded response's values sum to 1 - V0 > 0 and an
    # unrewarded one's to -V0 <= 0; the random tiny model almost never answers right, so V0 is near 0
    f = tmp_path / "in.jsonl"
    f.write_text(
        json.dumps(
            {
                "problem": "What is 12+30?",
                "answer": "42",
                "completions": ["12+30=42 \\boxed{42}", "\\boxed{41}"],
                "rewards": [1.0, 0.0],
            }
        )
        + "\n"
    )
    out = tmp_path / "o.html"
    assert _explain("--jsonl", f, "--model", tiny_model_dir, "--methods", "oracle", "--out", out) == 0
    text = out.read_text()
    page = Page(text)
    assert "oracle" not in page.skipped
    assert "Monte-Carlo values sampled" in text and "continuations" in text
    right, wrong = (page.data["rows"][str(i)]["credit"]["oracle"] for i in (0, 1))
    assert 0.5 < sum(right) <= 1.0 + 1e-6
    assert -0.5 < sum(wrong) <= 1e-6
    # without a gold answer the column is skipped with the reason, the page still written
    f.write_text(
        json.dumps({"problem": "What is 1+1?", "completions": ["2", "3"], "rewards": [1.0, 0.0]}) + "\n"
    )
    assert _explain("--jsonl", f, "--model", tiny_model_dir, "--methods", "oracle,uniform", "--out", out) == 0
    assert "'answer'" in Page(out.read_text()).skipped["oracle"]


def test_cli_argument_errors(tmp_path, capsys):
    assert _explain() == 2
    assert _explain(tmp_path / "nope") == 2
    assert "run directory not found" in capsys.readouterr().err
    run = tmp_path / "run"
    _write_run(run, None, steps=(1,))
    assert _explain(run, "--methods", "ktea") == 2
    assert "closest: ktae" in capsys.readouterr().err
    assert _explain(run, "--groups", "0") == 2
    assert _explain("--jsonl", tmp_path / "x.jsonl", "--model", "toy", "--step", "3") == 2
    assert "--step" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ screenshot
def test_screenshot_with_headless_chromium(tmp_path, offline):
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip(
            "headless Chromium is not installed (shutil.which('chromium') is None); apt-get install chromium"
        )
    page = tmp_path / "page.html"
    page.write_text(offline[5])
    png = tmp_path / "shot.png"
    subprocess.run(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--hide-scrollbars",
            "--window-size=1440,900",
            f"--screenshot={png}",
            page.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert png.is_file(), "Chromium wrote no screenshot"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    # a non-trivial picture: the decoded image is not one flat colour
    image = pytest.importorskip("PIL.Image")
    im = image.open(png).convert("RGB")
    assert im.size == (1440, 900)
    colours = im.resize((96, 60)).getcolors(maxcolors=1 << 16)
    assert colours is not None and len(colours) > 20


def test_cli_png_draws_each_methods_credit_of_the_first_group(tmp_path, tiny_model_dir):
    from PIL import Image

    f = tmp_path / "in.jsonl"
    f.write_text(
        json.dumps(
            {"problem": "What is 12+30?", "completions": ["12+30=42", "12+30=41"], "rewards": [1.0, 0.0]}
        )
        + "\n"
    )
    png = tmp_path / "credit.png"
    assert (
        _explain(
            "--jsonl",
            f,
            "--model",
            tiny_model_dir,
            "--methods",
            "ktae,uniform",
            "--out",
            tmp_path / "r.html",
            "--png",
            png,
        )
        == 0
    )
    img = Image.open(png).convert("RGB")
    # 1 group x 2 responses x 2 methods: coloured token boxes, some red (the wrong answer) and some blue
    pixels = list(img.getdata())
    assert any(r > 150 and g < 120 and b < 120 for r, g, b in pixels)  # red: negative credit
    assert any(b > 150 and r < 120 for r, g, b in pixels)  # blue: positive credit


# ------------------------------------------------------------------------------------------ adversarial text and sizes
def test_bidi_controls_are_shown_visibly_and_never_written_raw(offline):
    import copy

    from tokencredit.explain.render import BIDI_CONTROLS

    batch, seq, specs, groups, _, _, _ = offline
    groups = copy.deepcopy(groups)  # the module's fixture stays as it is
    groups[0].responses[0].tokens[3] = "a\u202eb"
    groups[0].problem = "left \u202e right \u2067"
    data = explain_batch(batch, specs[:2], groups, notes=["note \u200f"], subtitle="sub \u202d")
    html = build_report(data)
    assert not set(html) & BIDI_CONTROLS
    assert (
        '>a<i class="ws">⟨U+202E⟩</i>b</span>' in html and "<bdi>left ⟨U+202E⟩ right ⟨U+2067⟩</bdi>" in html
    )
    assert "note ⟨U+200F⟩" in html and "sub ⟨U+202D⟩" in html
    assert Page(html).data["rows"]["0"]["tokens"][3] == "a\u202eb"  # the data itself is unchanged


def test_cut_completion_cuts_every_per_token_list():
    from tokencredit.explain.inputs import CompletionInput, cut_completion

    c = CompletionInput(
        text="abcd",
        score=1.0,
        token_ids=[1, 2, 3, 4],
        entropy=[0.1, 0.2, 0.3, 0.4],
        old_log_probs=[-1.0] * 4,
        tokens=list("abcd"),
        token_advantages=[1.0, 2.0, 3.0, 4.0],
    )
    assert cut_completion(c, 9) == 4 and not c.truncated and c.full_length is None
    assert cut_completion(c, 2) == 4
    assert c.token_ids == [1, 2] and c.entropy == [0.1, 0.2] and c.old_log_probs == [-1.0, -1.0]
    assert c.tokens == ["a", "b"] and c.token_advantages == [1.0, 2.0] and c.truncated and c.full_length == 4
    assert cut_completion(c, 1) == 2 and c.full_length == 4  # the first length is kept


def test_rows_per_forward_bound_the_attention():
    from tokencredit.explain.signals import _ATTENTION_BUDGET, _rows_per_forward

    notes: list[str] = []
    assert _rows_per_forward(16, 512, notes) == 16 and notes == []
    assert _rows_per_forward(16, 8192 + 100, notes) == 1
    assert "lowered from 16 to 1" in notes[0]
    rows = _rows_per_forward(64, 3000, [])
    assert rows * 3000**2 <= _ATTENTION_BUDGET < (rows + 1) * 3000**2


def test_completion_text_is_tokenised_without_special_tokens(tiny_model_dir):
    from tokencredit.explain.assemble import plain_text_ids
    from tokencredit.models import load_tokenizer

    tok = load_tokenizer(str(tiny_model_dir))
    ids = plain_text_ids(tok, "a<|im_end|>b<|im_start|>")
    assert tok.eos_token_id not in ids and not set(ids) & set(tok.all_special_ids)
    assert tok.decode(ids) == "a<|im_end|>b<|im_start|>"
    assert tok("<|im_end|>", add_special_tokens=False)["input_ids"] == [
        tok.eos_token_id
    ]  # the state is restored


def test_page_size_estimate_is_close_to_the_page(tmp_path, tiny_model_dir):
    from tokencredit.explain import ExplainOptions, write_report
    from tokencredit.explain.pipeline import estimate_page_bytes

    f = tmp_path / "in.jsonl"
    lines = [
        {
            "problem": f"What is {k}+1?",
            "completions": ["1234 + 5678 = 6912\n" * 3] * 4,
            "rewards": [1, 0, 1, 0],
        }
        for k in range(6)
    ]
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    said: list[str] = []
    result = write_report(
        ExplainOptions(
            jsonl=f, model=tiny_model_dir, methods="ktae,delta,uniform", groups=6, out=tmp_path / "p.html"
        ),
        warn=said.append,
    )
    assert said == [] and result.warnings == []
    groups = load_jsonl(f)
    for g in groups:
        for c in g.completions:
            c.token_ids = list(range(len(c.text)))  # the toy tokenizer: one token per character
    est = estimate_page_bytes(groups, 3)
    assert 0.7 < est / (tmp_path / "p.html").stat().st_size < 1.4


def test_a_runs_damaged_group_is_left_out_not_fatal(tmp_path, capsys):
    run = tmp_path / "run"
    _write_run(run, None, steps=(1,))
    saved = run / "rollouts" / "step_000001.jsonl"
    lines = saved.read_text().splitlines()
    bad = json.loads(lines[1])
    bad["completions"][0]["score"] = 1e308  # finite in float64, inf in float32
    lines[1] = json.dumps(bad)
    bad = json.loads(lines[2])
    bad["group"] = 10**30
    lines[2] = json.dumps(bad)
    saved.write_text("\n".join(lines) + "\n")
    assert _explain(run, "--methods", "uniform", "--out", tmp_path / "r.html") == 0
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("tokencredit explain: ")]
    assert len(err) == 2
    assert f"{saved}:2: damaged group skipped" in err[0] and "completions[0].score = 1e+308" in err[0]
    assert f"{saved}:3: damaged group skipped" in err[1] and "64 bits" in err[1]
    assert len(Page((tmp_path / "r.html").read_text()).data["rows"]) == 4  # the one good group


def test_png_of_a_huge_group_is_capped_and_says_so(tmp_path, monkeypatch):
    from PIL import Image

    from tokencredit.explain import picture
    from tokencredit.explain.views import GroupView, MethodView, ReportData, ResponseView

    monkeypatch.setattr(picture, "MAX_BOXES", 300)
    n = 200_000
    tokens = ["x"] * (n - 1) + ["y" * 5000]
    r = ResponseView(row=0, tokens=tokens, reward=1.0, advantage=0.5)
    m = MethodView("uniform", "u", credit={0: [0.5] * n}, scale=1.0)
    data = ReportData("t", [GroupView(0, "p $\\begin{pmatrix}", [r])], [m])
    rows = picture._rows([line for g in data.groups for line in picture._lines(g, [m])])
    assert sum(len(toks) for _, toks in rows) == 300
    assert rows[-1][0] == f"... {n - 300} more token boxes not drawn (the HTML page shows them all)"
    assert picture._rows([("l", [("z" * 5000, 0.1, False, False)])])[0][1][0][0] == "z" * 39 + "…"
    png = picture.draw_png(data, tmp_path / "p.png")
    assert Image.open(png).size[1] < 2000

"""`tokencredit probe`: token-level ground truth, blame metrics with known ranks, chance baselines, CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tokencredit import cli, probe
from tokencredit.batch import RolloutBatch
from tokencredit.columns import resolve_methods
from tokencredit.data.synthetic import locate_first_error
from tokencredit.errors import ConfigError
from tokencredit.train.checkpoint import load_run_policy

P = "Compute 47 + 38 - 19 + 6."
REF = "47 + 38 = 85\n85 - 19 = 66\n66 + 6 = 72\nThe answer is \\boxed{72}."
WRONG_FIRST = "47 + 38 = 75\n75 - 19 = 56\n56 + 6 = 62\nThe answer is \\boxed{62}."
WRONG_LATER = "47 + 38 = 85\n85 - 19 = 76\n76 + 6 = 82\nThe answer is \\boxed{82}."
WRONG_FINAL = REF.replace("{72}", "{73}")
MALFORMED = "47 + 38 = 85\nI think it is 85"
EARLY_STOP = "47 + 38 = 85\n85 - 19 = 66"
CASES = {
    "correct": (REF, "correct", "answer"),
    "wrong first step": (WRONG_FIRST, "wrong-step", "computed"),
    "wrong later step": (WRONG_LATER, "wrong-step", "computed"),
    "wrong final answer": (WRONG_FINAL, "wrong-final", "answer"),
    "malformed": (MALFORMED, "malformed", "format"),
    "early stop": (EARLY_STOP, "malformed", "format"),
}


@pytest.fixture(scope="module")
def toy_tok():
    from tokencredit.models import build_toy_tokenizer

    return build_toy_tokenizer()


def _ids(tok, text, eos=True):
    return tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else [])


# ------------------------------------------------------------------------------------ token ground truth
@pytest.mark.parametrize("case", list(CASES))
def test_char_level_tokenizer_maps_the_first_error_to_its_token(toy_tok, case):
    text, kind, label = CASES[case]
    ids = _ids(toy_tok, text)
    truth = probe.rollout_truth(P, ids, toy_tok)
    loc = locate_first_error(P, text)
    assert truth.text == text and truth.kind == kind == loc.kind and truth.step == loc.step
    assert truth.correct == (case == "correct")
    assert len(truth.labels) == len(ids)
    # one token per character, then EOS: the token index is the character offset
    assert truth.target == loc.start
    assert truth.labels[truth.target] == label
    if loc.start < len(text):
        assert toy_tok.decode([ids[truth.target]]) == text[loc.start]
    else:
        assert ids[truth.target] == toy_tok.eos_token_id
    assert truth.labels[-1] == "format"  # EOS is boilerplate


def test_specific_first_wrong_tokens(toy_tok):
    first = probe.rollout_truth(P, _ids(toy_tok, WRONG_FIRST), toy_tok)
    assert first.target == WRONG_FIRST.index("75")  # the tens digit of the wrong sum
    later = probe.rollout_truth(P, _ids(toy_tok, WRONG_LATER), toy_tok)
    assert later.target == WRONG_LATER.index("76") and later.step == 1
    final = probe.rollout_truth(P, _ids(toy_tok, WRONG_FINAL), toy_tok)
    assert final.target == WRONG_FINAL.index("73}") + 1  # "7" is right, "3" is the first wrong character
    right = probe.rollout_truth(P, _ids(toy_tok, REF), toy_tok)
    assert right.target == REF.index("72}")  # first answer token


def test_truncated_completion_has_no_target_token(toy_tok):
    truth = probe.rollout_truth(P, _ids(toy_tok, EARLY_STOP, eos=False), toy_tok)
    assert truth.kind == "malformed" and truth.target is None


def _bpe_tokenizer(kind):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from tokencredit.data.synthetic import ArithmeticTask

    corpus = [p.solution for p in ArithmeticTask(difficulty=3, seed=1).sample(300, "train")]
    core = Tokenizer(models.BPE(unk_token="<unk>" if kind == "metaspace" else None))
    if kind == "bytelevel":
        core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        core.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        core.pre_tokenizer = pre_tokenizers.Metaspace()
        core.decoder = decoders.Metaspace()
        alphabet = sorted(set("".join(corpus)) | set("I think it is"))
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<eos>", "<unk>"], initial_alphabet=alphabet
    )
    core.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", pad_token="<eos>")


@pytest.mark.parametrize("kind", ["bytelevel", "metaspace"])
def test_multi_character_tokenizers_map_the_first_error_to_its_token(kind):
    tok = _bpe_tokenizer(kind)
    multi_char_targets = 0
    for case, (text, want_kind, label) in CASES.items():
        ids = _ids(tok, text)
        decoded, spans = probe.token_char_spans(tok, ids)
        assert decoded == text, case
        assert [s for s, _ in spans[1:]] == [e for _, e in spans[:-1]] and spans[-1][1] == len(text)
        truth = probe.rollout_truth(P, ids, tok)
        loc = locate_first_error(P, text)
        assert truth.kind == want_kind
        start, end = spans[truth.target]
        if loc.start < len(text):
            assert start <= loc.start < end, case  # the token whose text holds the first wrong character
            # the prefix before the target token decodes to text that stops before the error
            assert len(tok.decode(ids[: truth.target], skip_special_tokens=True)) <= loc.start
            multi_char_targets += end - start > 1
        else:
            assert ids[truth.target] == tok.eos_token_id
        assert truth.labels[truth.target] == label, case
    assert multi_char_targets >= 2  # the tokenizer really merges (e.g. " 75" is one token)


def test_character_split_over_byte_tokens_belongs_to_the_completing_token():
    tok = _bpe_tokenizer("bytelevel")
    ids = _ids(tok, "ab€c")
    text, spans = probe.token_char_spans(tok, ids)
    assert text == "ab€c"
    euro = probe.char_to_token(spans, 2)
    assert spans[euro] == (2, 3)
    assert tok.decode(ids[: euro + 1], skip_special_tokens=True) == "ab€"
    # the earlier byte pieces of "€" carry no character of their own
    assert all(spans[j][0] == spans[j][1] for j in range(euro) if tok.decode(ids[: j + 1]).endswith("\ufffd"))
    assert probe.char_to_token(spans, len(text)) == len(ids) - 1  # past the end: EOS
    assert probe.char_to_token(probe.token_char_spans(tok, ids[:-1])[1], len(text)) is None
    with pytest.raises(ValueError, match="character position"):
        probe.char_to_token(spans, -1)


def test_token_labels_priority():
    chars = ["format", "computed", "computed", "format", "answer", "answer", "format"]
    spans = [(0, 3), (3, 4), (4, 6), (6, 7), (7, 7)]
    assert probe.token_labels(chars, spans) == ["computed", "format", "answer", "format", "format"]
    chars = ["free", "free", "format", "computed", "free", "answer"]
    spans = [(0, 2), (1, 3), (3, 5), (4, 6), (2, 3)]
    assert probe.token_labels(chars, spans) == ["free", "free", "computed", "answer", "format"]
    chars = ["choice", "free", "format", "tail", "tail", "answer"]
    spans = [(0, 2), (1, 3), (3, 5), (2, 4), (4, 6)]
    # a token is tail only when every character is: one reaching into the answer or the format is not
    assert probe.token_labels(chars, spans) == ["choice", "free", "tail", "format", "answer"]


# ------------------------------------------------------------------------------------ metrics
def _known_batch():
    """Rows with known ranks of the target (marked *): ascending credit, ties, masked padding."""
    credit = torch.tensor(
        [
            [-3.0, -1.0, -2.0, 0.5, 0.0],  # target 2 (-2*): one token ahead -> rank 2
            [-1.0, -1.0, -1.0, -1.0, -1.0],  # target 3, all 5 tied -> rank 3
            [0.0, -2.0, -2.0, 1.0, 0.0],  # target 2, tied with token 1 -> rank 1.5
            [0.3, 0.2, 0.1, -100.0, -100.0],  # target 0 (largest of 3 valid), padding ignored -> rank 3
        ]
    )
    mask = torch.tensor(
        [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]], dtype=torch.bool
    )
    target = torch.tensor([2, 3, 2, 0])
    return credit, mask, target


def test_blame_hits_and_ranks_on_known_ranks():
    credit, mask, target = _known_batch()
    ahead, tied, length = probe.tie_counts(credit, mask, target)
    assert (
        ahead.tolist() == [1, 0, 0, 2] and tied.tolist() == [1, 5, 2, 1] and length.tolist() == [4, 5, 4, 3]
    )
    assert probe.blame_hits(credit, mask, target, 1).tolist() == [0.0, 0.2, 0.5, 0.0]
    assert probe.blame_hits(credit, mask, target, 2).tolist() == [1.0, 0.4, 1.0, 0.0]
    assert probe.blame_hits(credit, mask, target, 3).tolist() == [1.0, 0.6, 1.0, 1.0]
    assert probe.blame_hits(credit, mask, target, 10).tolist() == [1.0, 1.0, 1.0, 1.0]
    assert probe.target_ranks(credit, mask, target).tolist() == [2.0, 3.0, 1.5, 3.0]
    assert probe.mean_rank(credit, mask, target) == pytest.approx((2 + 3 + 1.5 + 3) / 4)
    # descending (praise): the largest credit first
    assert probe.expected_hits(credit, mask, target, 1, descending=True).tolist() == [0.0, 0.2, 0.0, 1.0]
    assert probe.target_ranks(credit, mask, target, descending=True).tolist() == [3.0, 3.0, 3.5, 1.0]


def test_ties_within_float_rounding_count_as_ties():
    credit = torch.tensor([[-1.0, -1.0 - 1e-9, -1.0 + 1e-9, 2.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    hit = probe.blame_hits(credit, mask, torch.tensor([0]), 1)
    assert hit.item() == pytest.approx(1 / 3)


def test_metric_errors_name_the_rollout():
    credit, mask, target = _known_batch()
    with pytest.raises(ValueError, match="rollout 3 is not a valid"):
        probe.blame_hits(credit, mask, torch.tensor([2, 3, 2, 4]), 1)
    with pytest.raises(ValueError, match="outside"):
        probe.blame_hits(credit, mask, torch.tensor([2, 3, 2, 9]), 1)
    bad = credit.clone()
    bad[1, 4] = float("nan")
    with pytest.raises(ValueError, match="rollout 1, token 4"):
        probe.blame_hits(bad, mask, target, 1)
    with pytest.raises(ValueError, match="k must be"):
        probe.blame_hits(credit, mask, target, 0)


def test_mass_shares_by_label():
    adv = torch.tensor([[-1.0, -3.0, 2.0, 9.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    labels = torch.tensor([[0, 1, 2, -1], [0, 1, -1, -1]])
    shares, defined = probe.mass_shares(adv, mask, labels)
    assert defined.tolist() == [True, False]
    rest = [0.0] * (len(probe.LABELS) - 3)
    assert shares[0].tolist() == pytest.approx([1 / 6, 3 / 6, 2 / 6, *rest])
    assert shares[1].tolist() == [0.0] * len(probe.LABELS)
    with pytest.raises(ValueError, match="rollout 0, token 2"):
        probe.mass_shares(adv, mask, torch.tensor([[0, 1, len(probe.LABELS), -1], [0, 1, -1, -1]]))


def test_random_baseline_hits_k_over_length_in_expectation():
    g = torch.Generator().manual_seed(1234)
    n, t = 6000, 40
    lengths = torch.randint(5, t + 1, (n,), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    target = (torch.rand(n, generator=g) * lengths).long()
    credit = probe.random_credit(mask, g)
    assert bool((credit[~mask] == 0).all())
    for k in (1, 3, 10):
        p = (k / lengths.double()).clamp(max=1.0)
        hits = probe.blame_hits(credit, mask, target, k)
        sigma = math.sqrt(float((p * (1 - p)).sum())) / n
        assert abs(float(hits.mean()) - float(p.mean())) < 4 * sigma, k
        # uniform credit: every token tied, so the expected hit is exactly k / length
        exact = probe.blame_hits(probe.uniform_credit(mask), mask, target, k)
        assert torch.allclose(exact, p, atol=1e-12)
    ranks = probe.target_ranks(probe.uniform_credit(mask), mask, target)
    assert torch.allclose(ranks, (lengths.double() + 1) / 2)


# ------------------------------------------------------------------------------------ batch scoring
def _hand_batch(tok):
    """Group 0 mixed (correct, wrong first step, early stop, wrong final), group 1 all wrong."""
    texts = [REF, WRONG_FIRST, EARLY_STOP, WRONG_FINAL, WRONG_LATER, WRONG_FIRST]
    rows = [_ids(tok, x) for x in texts]
    t = max(map(len, rows))
    ids = torch.full((len(rows), t), tok.pad_token_id)
    mask = torch.zeros(len(rows), t, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = True
    group_ids = torch.tensor([0, 0, 0, 0, 1, 1])
    truth, truths = probe.build_truth([P] * len(rows), ids, mask, group_ids, tok)
    batch = RolloutBatch(token_ids=ids, mask=mask, group_ids=group_ids, scores=truth.correct.float())
    return batch, truth, truths


def test_truth_rows_and_oracle_credit(toy_tok):
    batch, truth, truths = _hand_batch(toy_tok)
    assert truth.correct.tolist() == [True, False, False, False, False, False]
    assert truth.mixed.tolist() == [True] * 4 + [False] * 2
    assert truth.blame_rows.tolist() == [False, True, True, True, False, False]
    assert truth.praise_rows.tolist() == [True] + [False] * 5
    mask = truth.mask
    oracle = torch.where(mask, torch.zeros(()), torch.zeros(()))
    oracle[torch.arange(6), truth.target.clamp(min=0)] = -1.0
    oracle[0] = torch.where(mask[0], 0.0, 0.0)
    oracle[0, truth.target[0]] = 1.0  # praise the answer of the correct one
    s = probe.score_credit(oracle, truth)
    assert s["blame_rollouts"] == 3 and s["praise_rollouts"] == 1
    assert s["blame@1"] == 1.0 and s["mean_rank"] == 1.0 and s["praise@1"] == 1.0
    assert set(s["blame_by_kind"]) == {"wrong-step", "malformed", "wrong-final"}
    # all the oracle's mass on one token: the first wrong digit (computed), EOS (format), the answer digit
    assert s["mass_rollouts"] == 4
    assert s["mass_answer"] == pytest.approx(2 / 4) and s["mass_computed"] == pytest.approx(1 / 4)
    anti = torch.where(mask, -1.0, 0.0)
    anti[torch.arange(6), truth.target.clamp(min=0)] = 5.0
    worst = probe.score_credit(anti, truth)
    lengths = mask.sum(1)[truth.blame_rows].double()
    assert worst["blame@1"] == 0.0 and worst["mean_rank"] == pytest.approx(float(lengths.mean()))


def test_probe_batch_methods_and_baselines(toy_tok):
    batch, truth, _ = _hand_batch(toy_tok)
    specs = resolve_methods(["grpo", "ktae", "delta", "arca"])
    res = probe.probe_batch(batch, truth, specs)
    assert res["arca"]["status"] == "n/a" and res["arca"]["reason"] == probe.NA_LORA
    assert res["delta"]["status"] == "n/a" and "hidden" in res["delta"]["reason"]
    assert res["ktae"]["status"] == "ok" and res["ktae"]["blame_rollouts"] == 3
    base = probe.score_baselines(truth, draws=5, seed=3)
    lengths = truth.mask.sum(1)[truth.blame_rows].double()
    for k in probe.DEFAULT_KS:
        chance = float((k / lengths).clamp(max=1).mean())
        # GRPO's uniform credit is exactly at chance, like the uniform baseline
        assert res["grpo"][f"blame@{k}"] == pytest.approx(chance)
        assert base["uniform"][f"blame@{k}"] == pytest.approx(chance)
        assert 0.0 <= base["random"][f"blame@{k}"] <= 1.0
    # KTAE's key-token values differ by token id, so its ranking is not GRPO's
    assert res["ktae"]["mean_rank"] != pytest.approx(res["grpo"]["mean_rank"])
    point = {
        "label": "hand",
        "source": "hand-made",
        "step": None,
        "rollouts": probe.rollout_summary(
            truth, probe.build_truth([P] * 6, batch.token_ids, batch.mask, batch.group_ids, toy_tok)[1]
        ),
        "methods": res,
        "baselines": base,
    }
    result = {
        "command": "tokencredit probe --model x",
        "ks": list(probe.DEFAULT_KS),
        "config": {"advantage": "grpo", "difficulty": 3, "digits": 2, "temperature": 1.0, "seed": 0},
        "points": [point, {**point, "label": "again"}],
    }
    md = probe.markdown_report(result)
    assert "| arca | n/a (needs a LoRA-trained model) |" in md
    assert "| *random (chance)* |" in md and "| *uniform (chance)* |" in md
    assert "## Evolution (blame@1 / blame@3)" in md and "| credit | hand | again |" in md
    assert md.count("| grpo |") == 3  # two point tables and the evolution table
    header = next(line for line in md.splitlines() if line.startswith("| credit | blame@1"))
    assert header.count("|") == len(probe.DEFAULT_KS) + len(probe.LABELS) + 3  # credit, ks, rank, labels


# ------------------------------------------------------------------------------------ CLI
SMALL = [
    "--groups",
    "2",
    "--group-size",
    "2",
    "--max-new-tokens",
    "6",
    "--random-draws",
    "2",
    "--threads",
    "2",
]


def test_cli_writes_json_and_markdown(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "p.json"
    rc = cli.main(
        ["probe", "--model", str(tiny_model_dir), "--methods", "grpo,ktae,strace,arca", "--out", str(out)]
        + SMALL
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert [p["label"] for p in data["points"]] == [f"model {tiny_model_dir}"]
    pt = data["points"][0]
    assert pt["rollouts"]["rollouts"] == 4 and set(pt["methods"]) == {"grpo", "ktae", "strace", "arca"}
    assert pt["methods"]["arca"]["status"] == "n/a" and pt["methods"]["strace"]["status"] == "ok"
    assert set(pt["baselines"]) == {"random", "uniform"}
    assert data["command"].startswith(f"tokencredit probe --model {tiny_model_dir}")
    md = out.with_suffix(".md").read_text()
    assert md in capsys.readouterr().out
    assert "| strace |" in md


def _write_run(run, model_dir, lora_rank):
    from tokencredit.train import checkpoint as ckpt
    from tokencredit.train.config import TrainConfig, dump_toml

    cfg = TrainConfig()
    cfg.model.name = str(model_dir)
    cfg.model.lora_rank = lora_rank
    cfg.data.difficulty = 2
    run.mkdir()
    (run / "config.toml").write_text(dump_toml(cfg))
    model, _ = ckpt.build_policy(cfg)
    trainable = [p for p in model.parameters() if p.requires_grad]
    with torch.no_grad():
        for p in trainable:
            p.add_(0.05)  # LoRA B is 0 when fresh: make the adapter do something
    opt = torch.optim.AdamW(trainable)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    ckpt.save_checkpoint(run, 1, model, opt, sched)
    return model


def test_cli_run_dir_checkpoints_with_lora(tmp_path, tiny_model_dir):
    from tokencredit.signals import has_lora_adapter

    run = tmp_path / "run"
    saved = _write_run(run, tiny_model_dir, lora_rank=4)
    loaded, _, _ = load_run_policy(run, 1, "cpu")
    assert has_lora_adapter(loaded)
    want = {n: p for n, p in saved.named_parameters() if p.requires_grad}
    got = dict(loaded.named_parameters())
    assert all(torch.equal(want[n], got[n]) for n in want)

    out = tmp_path / "all.json"
    rc = cli.main(
        ["probe", "--model", str(run), "--all-checkpoints", "--methods", "arca,grpo", "--out", str(out)]
        + SMALL
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert [p["label"] for p in data["points"]] == ["step 0 (start)", "step 1"]
    assert [p["step"] for p in data["points"]] == [0, 1]
    assert data["config"]["difficulty"] == 2  # the run's task settings
    assert data["points"][0]["methods"]["arca"]["status"] == "n/a"
    assert data["points"][1]["methods"]["arca"]["status"] == "ok"
    assert "## Evolution" in out.with_suffix(".md").read_text()


def test_cli_errors(tmp_path, tiny_model_dir, capsys):
    run = tmp_path / "run"
    _write_run(run, tiny_model_dir, lora_rank=0)
    args = ["probe", "--model", str(run), "--out", str(tmp_path / "x.json")] + SMALL
    assert cli.main(args + ["--checkpoint", "step_5"]) == 2
    assert "saved: step_1" in capsys.readouterr().err
    assert cli.main(args) == 2  # no RUN_DIR/final yet
    assert "--checkpoint step_N" in capsys.readouterr().err
    assert cli.main(args + ["--checkpoint", "step_1", "--all-checkpoints"]) == 2
    plain = ["probe", "--model", str(tiny_model_dir)] + SMALL
    assert cli.main(plain + ["--checkpoint", "step_1"]) == 2
    assert cli.main(plain + ["--ks", "0,3"]) == 2
    assert cli.main(plain + ["--group-size", "1"]) == 2
    assert cli.main(plain + ["--methods", "ktea"]) == 2
    assert "closest: ktae" in capsys.readouterr().err
    assert probe.parse_checkpoint("step_000020") == probe.parse_checkpoint("20") == 20
    with pytest.raises(ConfigError):
        probe.parse_checkpoint("latest")


# ------------------------------------------------------------------------------------ Monte-Carlo oracle (--oracle)
def _oracle_credit(adv, se, mask, skipped, cost=None, rewards=None):
    """A hand-made OracleCredit (values are not read by the fidelity scoring)."""
    from tokencredit.oracle import OracleCost, OracleCredit

    n, t = mask.shape
    return OracleCredit(
        advantages=torch.tensor(adv, dtype=torch.float32),
        stderr=torch.tensor(se, dtype=torch.float32),
        mask=mask,
        skipped=skipped,
        bound=torch.zeros(n, t),
        values=torch.zeros(n, t + 1),
        value_stderr=torch.zeros(n, t + 1),
        known=torch.zeros(n, t + 1, dtype=torch.bool),
        rewards=torch.zeros(n) if rewards is None else torch.tensor(rewards),
        cost=cost
        or OracleCost(states=5, continuations=10, generated_tokens=100, seconds=1.5, positions=9, skipped=1),
    )


def _hand_oracle():
    """Oracle rows 0, 2, 3 of a 4-row batch (row 1 not estimated); significant A* (|A*| > 2 se):
    row 0 tokens 0 and 3 (token 2 skipped), row 2 tokens 0 and 1, row 3 none. Targets: row 0 token 0,
    row 2 token 1, row 3 none."""
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    skipped = torch.zeros(3, 4, dtype=torch.bool)
    skipped[0, 2] = True
    credit = _oracle_credit(
        [[-0.5, 0.1, 0.0, 0.3], [0.2, -0.4, 0.05, 0.0], [0.1, -0.1, 0.0, 0.0]],
        [[0.1, 0.1, 0.0, 0.1], [0.05, 0.1, 0.1, 0.0], [0.1, 0.1, 0.0, 0.0]],
        mask,
        skipped,
        rewards=[0.0, 1.0, 0.0],
    )
    from tokencredit.oracle import oracle_targets

    oracle = probe.ProbeOracle(torch.tensor([0, 2, 3]), credit, oracle_targets(credit, probe.ORACLE_Z))
    # the method's credit on the whole batch; row 1 and the padding must not count
    method = torch.tensor(
        [[-2.0, 1.0, 0.0, 1.0], [9.0, 9.0, 9.0, 9.0], [-2.0, -2.0, 1.0, 5.0], [1.0, 2.0, 5.0, 5.0]]
    )
    return oracle, method


def test_fidelity_scores_on_a_hand_made_oracle():
    oracle, method = _hand_oracle()
    assert oracle.targets.tolist() == [0, 1, -1]
    s = probe.score_fidelity(method, oracle, (1, 2))
    # pooled ranks over the 9 tokens (average ranks on ties): sum of centred products 15.5, squares 53 and 59.5
    assert s["spearman"] == pytest.approx(15.5 / math.sqrt(53 * 59.5))
    # per response: sqrt(0.9), 0 (a tie in Â against three distinct A*), -1
    assert s["spearman_per_response"] == pytest.approx((math.sqrt(0.9) + 0.0 - 1.0) / 3)
    assert s["responses"] == 3 and s["tokens"] == 9 and s["significant_tokens"] == 4
    assert s["sign_agreement"] == pytest.approx(3 / 4)  # row 2 token 0: Â -2 against A* +0.2
    assert s["significant_share"] == pytest.approx(7 / 12)  # |Â| 2 + 1 + 2 + 2 of 12
    # blame vs A*: row 0's target is the unique minimum, row 2's is tied with token 0; row 3 has none
    assert s["oracle_blame_rollouts"] == 2
    assert s["oracle_blame@1"] == pytest.approx(0.75) and s["oracle_blame@1_se"] == pytest.approx(0.25)
    assert s["oracle_blame@2"] == 1.0 and s["oracle_blame@2_se"] == 0.0
    # by outcome: row 0 (reward 0) and row 2 (reward 1)
    assert s["oracle_blame_by_outcome"] == {
        "wrong": {"n": 1, "blame@1": 1.0, "blame@2": 1.0},
        "correct": {"n": 1, "blame@1": 0.5, "blame@2": 1.0},
    }
    base = probe.fidelity_baselines(oracle, (1, 2), draws=3, seed=0)
    u = base["uniform"]
    assert u["spearman"] is None and u["spearman_per_response"] is None and u["responses"] == 0
    assert u["sign_agreement"] == 0.5  # -1 agrees with the two negative significant A*
    assert u["significant_share"] == pytest.approx(4 / 9)
    assert u["oracle_blame@1"] == pytest.approx((1 / 4 + 1 / 3) / 2)
    assert u["oracle_blame@2"] == pytest.approx((2 / 4 + 2 / 3) / 2)
    r = base["random"]
    assert -1.0 <= r["spearman"] <= 1.0 and 0.0 <= r["oracle_blame@1"] <= 1.0
    assert isinstance(r["tokens"], int) and r["tokens"] == 9
    assert r["oracle_blame_by_outcome"]["correct"]["n"] == 1
    with pytest.raises(ValueError, match="response tokens"):
        probe.score_fidelity(method[:, :3], oracle, (1,))


def test_oracle_section_scores_methods_baselines_and_the_oracle_itself(toy_tok):
    batch, truth, _ = _hand_batch(toy_tok)
    rows = truth.mixed.nonzero().squeeze(1)
    assert rows.tolist() == [0, 1, 2, 3]
    m = truth.mask[rows]
    # A* -1 at each wrong rollout's first wrong token, +1 at the correct one's answer, 0 elsewhere
    adv = torch.zeros(m.shape)
    adv[torch.arange(4), truth.target[rows]] = torch.tensor([1.0, -1.0, -1.0, -1.0])
    se = torch.where(m, 0.1, 0.0)
    from tokencredit.oracle import OracleCost, oracle_targets

    cost = OracleCost(
        states=40, continuations=80, generated_tokens=2000, seconds=3.0, positions=200, skipped=150
    )
    credit = _oracle_credit(adv.tolist(), se.tolist(), m, torch.zeros_like(m), cost)
    oracle = probe.ProbeOracle(rows, credit, oracle_targets(credit))
    assert oracle.targets.tolist() == [-1] + truth.target[1:4].tolist()
    specs = resolve_methods(["grpo", "arca"])
    got = probe.method_credits(batch, specs)
    cfg = probe.ProbeConfig(oracle_k=2, ks=(1, 3), random_draws=2)
    sec = probe.oracle_section(oracle, got, cfg, reward="the task's checker", truth=truth)
    assert sec["status"] == "ok" and sec["k"] == 2 and sec["rollouts"] == 4 and sec["z"] == 2.0
    assert sec["cost"]["continuations"] == 80 and sec["cost"]["skipped_share"] == 0.75
    # the oracle's own A* against the checker: the first wrong token is its most negative token
    assert sec["checker"]["blame@1"] == 1.0 and sec["checker"]["praise@1"] == 1.0
    assert sec["methods"]["arca"]["status"] == "n/a" and sec["methods"]["arca"]["reason"] == probe.NA_LORA
    grpo = sec["methods"]["grpo"]
    assert grpo["status"] == "ok" and grpo["oracle_blame_rollouts"] == 3 and grpo["significant_tokens"] == 4
    # GRPO's credit is uniform in a row: blame vs A* is at chance (1 / length), its sign is the outcome's
    lengths = m.sum(1)[1:].double()
    assert grpo["oracle_blame@1"] == pytest.approx(float((1 / lengths).mean()))
    assert grpo["sign_agreement"] == 1.0 and grpo["spearman_per_response"] is None
    assert sec["baselines"]["uniform"]["oracle_blame@1"] == pytest.approx(grpo["oracle_blame@1"])
    table = probe.fidelity_table(sec, cfg.ks)
    lines = table.splitlines()
    assert lines[0].startswith("| credit | ρ pooled | ρ per response | sign agreement |")
    assert lines[0].endswith("| blame@1 vs A* | blame@3 vs A* |")
    assert "| *uniform (chance)* | n/a | n/a | " in table
    assert "| arca | n/a (needs a LoRA-trained model) |" in table
    assert lines[-1].startswith(
        "| *Monte-Carlo oracle (K=2)* | cost: 40 states, 80 continuations, 2,000 generated"
    )
    assert all(line.count("|") == len(cfg.ks) + 6 for line in lines if not line.startswith("|---"))
    empty = probe.oracle_section(None, got, cfg, reward="the task's checker", truth=truth)
    assert empty["status"] == "n/a" and "mixed group" in empty["reason"]
    # with a bootstrap over the problems (two here), every statistic that is defined gets a standard error
    boot = probe.ProbeOracle(
        rows, credit, oracle_targets(credit), groups=torch.tensor([0, 0, 1, 1]), bootstrap=50, seed=0
    )
    sec = probe.oracle_section(boot, got, cfg, reward="the task's checker", truth=truth)
    g = sec["methods"]["grpo"]
    assert g["spearman_se"] is not None and g["spearman_se"] > 0 and g["spearman_per_response_se"] is None
    assert g["spearman"] == grpo["spearman"]  # the point estimates do not change
    assert f"{g['spearman']:.3f} ± {g['spearman_se']:.3f}" in probe.fidelity_table(sec, cfg.ks)


def test_probe_config_data_toy_hard_and_oracle_options(tmp_path):
    from tokencredit.models import TOY_VARIANTS
    from tokencredit.oracle import DEFAULT_DELTA
    from tokencredit.train.config import TrainConfig

    kw = dict(groups=2, group_size=2, seed=0, max_new_tokens=None, random_draws=1, batch_size=8, ks="1")
    toy = probe.probe_config(None, None, model="toy", **kw)
    assert (toy.data, toy.difficulty, toy.digits, toy.sampling.max_new_tokens, toy.oracle_k) == (
        "toy",
        3,
        2,
        96,
        0,
    )
    assert toy.synthetic and toy.oracle_delta == DEFAULT_DELTA
    flat = toy.record()  # the JSON "config": flat, as before the sampling was grouped
    assert list(flat) == [
        "groups",
        "group_size",
        "seed",
        "difficulty",
        "digits",
        "operand_digits",
        "template",
        "temperature",
        "max_new_tokens",
        "advantage",
        "advantage_params",
        "ks",
        "random_draws",
        "batch_size",
        "data",
        "oracle_k",
        "oracle_delta",
        "bootstrap",
        "grad_batches",
        "prompts_per_step",
        "prompts_per_step_source",
        "two_groups",
    ]
    assert (flat["temperature"], flat["max_new_tokens"], flat["batch_size"]) == (1.0, 96, 8)
    hard = probe.probe_config(None, None, model="toy-hard", **kw)
    budget = TOY_VARIANTS["toy-hard"].max_new_tokens
    assert hard.data == "toy-hard" and hard.difficulty == 6 and hard.sampling.max_new_tokens == budget >= 128
    run = TrainConfig()
    run.data.train = "toy-hard"
    run.rollout.prompts_per_step = 5
    from_run = probe.probe_config(run, None, **kw)
    assert from_run.data == "toy-hard"
    assert (from_run.prompts_per_step, from_run.prompts_per_step_source) == (
        5,
        "the probed run's rollout.prompts_per_step",
    )
    explicit = probe.probe_config(None, None, model="toy-hard", data="toy", **{**kw, "max_new_tokens": 40})
    assert (explicit.data, explicit.difficulty, explicit.sampling.max_new_tokens) == ("toy", 3, 40)
    bench = probe.probe_config(None, None, data="math500", oracle=4, oracle_delta=0.01, **kw)
    assert not bench.synthetic and (bench.oracle_k, bench.oracle_delta) == (4, 0.01)
    with pytest.raises(ConfigError, match="no checker truth.*--oracle K"):
        probe.probe_config(None, None, data="math500", **kw)
    with pytest.raises(ConfigError, match="--oracle must be 0"):
        probe.probe_config(None, None, oracle=1, **kw)
    with pytest.raises(ConfigError, match="--oracle-delta"):
        probe.probe_config(None, None, oracle=2, oracle_delta=1.0, **kw)
    with pytest.raises(ConfigError, match="closest: math500"):
        probe.probe_config(None, None, data="math50", oracle=2, **kw)
    with pytest.raises(ConfigError, match="--difficulty sets the task of --data toy"):
        probe.probe_config(None, None, data="toy-hard", difficulty=3, **kw)
    data = tmp_path / "p.jsonl"
    data.write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": "2+2?", "answer": "4"}\n')
    cfg = probe.probe_config(None, None, data=str(data), oracle=2, **{**kw, "groups": 5})
    assert [p.answer for p in probe.probe_problems(cfg)] == ["2", "4"]  # min(groups, all), in file order


def _run_probe(tmp_path, name, args):
    out = tmp_path / f"{name}.json"
    assert cli.main(["probe", "--out", str(out)] + args) == 0
    return json.loads(out.read_text()), out.with_suffix(".md").read_text()


TOY_SMALL = ["--model", "toy", "--groups", "3", "--group-size", "4", "--random-draws", "2", "--threads", "1"]


@pytest.fixture(scope="module")
def toy_oracle_runs(tmp_path_factory):
    """The toy warm start on 3 held-out problems x 4: without the oracle, with --oracle 2, and with
    --oracle 2 on the same problems given as a data file (math verifier, no checker truth)."""
    from tokencredit.models import toy_task

    tmp = tmp_path_factory.mktemp("probe_oracle")
    data = tmp / "arith.jsonl"
    problems = toy_task(seed=0).sample(3, "heldout")
    data.write_text(
        "".join(json.dumps({"id": p.id, "problem": p.problem, "answer": p.answer}) + "\n" for p in problems)
    )
    methods = ["--methods", "grpo,ktae,surprisal,arca"]
    return {
        "off": _run_probe(tmp, "off", TOY_SMALL + methods + ["--oracle", "0"]),
        "on": _run_probe(tmp, "on", TOY_SMALL + methods + ["--oracle", "2"]),
        "data": _run_probe(tmp, "data", TOY_SMALL + methods + ["--oracle", "2", "--data", str(data)]),
    }


def test_cli_oracle_on_the_toy_warm_start(toy_oracle_runs):
    (off, md_off), (on, md_on) = toy_oracle_runs["off"], toy_oracle_runs["on"]
    assert on["command"].endswith("--oracle 2") and on["config"]["oracle_k"] == 2
    pt = on["points"][0]
    sec = pt["oracle"]
    assert sec["status"] == "ok" and sec["reward"] == "the task's checker" and sec["k"] == 2
    mixed = pt["rollouts"]["mixed_groups"] * 4
    assert mixed > 0 and sec["rollouts"] == mixed
    cost = sec["cost"]
    assert cost["continuations"] == 2 * cost["states"] > 0 and 0 < cost["skipped_share"] < 1
    assert set(sec["methods"]) == {"grpo", "ktae", "surprisal", "arca"}
    assert sec["methods"]["arca"]["status"] == "n/a"
    for name in ("grpo", "ktae", "surprisal"):
        r = sec["methods"][name]
        assert -1 <= r["spearman"] <= 1 and r["tokens"] == sec["baselines"]["uniform"]["tokens"]
    assert sec["baselines"]["uniform"]["spearman"] is None
    assert 0.0 <= sec["checker"]["blame@1"] <= 1.0
    assert (
        "### Credit fidelity against Monte-Carlo A*" in md_on
        and "| *Monte-Carlo oracle (K=2)* | cost: " in md_on
    )
    # the oracle runs after sampling and scoring: the checker table is today's plus the oracle's row
    table_on = [line for line in md_on.split("### Credit fidelity")[0].splitlines() if line.startswith("|")]
    table_off = [line for line in md_off.splitlines() if line.startswith("|")]
    assert table_on[:-1] == table_off and table_on[-1].startswith("| *Monte-Carlo oracle (K=2)* | ")
    assert pt["methods"] == off["points"][0]["methods"] and pt["baselines"] == off["points"][0]["baselines"]


def test_cli_oracle_off_leaves_the_output_unchanged(toy_oracle_runs, tmp_path):
    off, md = toy_oracle_runs["off"]
    assert set(off["points"][0]) == {
        "label",
        "source",
        "step",
        "rollouts",
        "methods",
        "baselines",
        "credit_batches",
    }
    assert "Monte-Carlo" not in md and "fidelity" not in md and "--oracle" not in off["command"]
    assert md.startswith("# tokencredit probe: does the credit blame the first wrong token?")
    assert (off["config"]["data"], off["config"]["max_new_tokens"]) == ("toy", 96)


def test_cli_oracle_on_a_data_file_with_the_math_verifier(toy_oracle_runs):
    on, _ = toy_oracle_runs["on"]
    data, md = toy_oracle_runs["data"]
    pt = data["points"][0]
    assert "methods" not in pt and "baselines" not in pt  # no checker truth
    assert "has no checker truth" in md and "| blame@1 | blame@3" not in md
    sec, ref = pt["oracle"], on["points"][0]["oracle"]
    assert sec["reward"] == "the problems' own checker (reasoning-gym) or math-verify"
    # same problems, seeds and rollouts: the verifier agrees with the checker on these answers, so the
    # continuations score alike and every figure matches the synthetic run's
    assert pt["rollouts"]["accuracy"] == on["points"][0]["rollouts"]["accuracy"]
    assert sec["methods"] == ref["methods"] and sec["baselines"] == ref["baselines"]
    assert {k: v for k, v in sec["cost"].items() if k != "seconds"} == {
        k: v for k, v in ref["cost"].items() if k != "seconds"
    }


def test_cli_benchmark_data_on_a_tiny_model(tmp_path, tiny_model_dir):
    data, md = _run_probe(
        tmp_path,
        "bench",
        ["--model", tiny_model_dir, "--data", "math500", "--oracle", "2", "--methods", "grpo"] + SMALL,
    )
    assert data["config"]["data"] == "math500" and "--data math500" in data["command"]
    assert data["command"].endswith("--oracle 2")
    pt = data["points"][0]
    assert pt["rollouts"]["rollouts"] == 4 and pt["rollouts"]["groups"] == 2
    # a random model never answers: no mixed group, nothing for the oracle to estimate, and it says so
    assert pt["rollouts"]["accuracy"] == 0.0 and pt["oracle"]["status"] == "n/a"
    assert "n/a: no rollout in a mixed group" in md
    assert cli.main(["probe", "--model", tiny_model_dir, "--data", "math500"] + SMALL) == 2


def test_cli_oracle_and_vineppo_recipe_columns(tmp_path):
    """`--methods oracle,vineppo` sample their Monte-Carlo signals on the mixed groups' rollouts with the
    trainer's default settings; with `--oracle 16` (the same K, delta and seed) the oracle column is the
    probe's own A*, so its fidelity is perfect, and it blames the checker's first wrong token above chance."""
    data, md = _run_probe(tmp_path, "mc", TOY_SMALL + ["--methods", "grpo,oracle,vineppo", "--oracle", "16"])
    pt = data["points"][0]
    mixed = pt["rollouts"]["mixed_groups"] * 4
    mc = pt["mc_signals"]
    assert mc["rows"] == mixed > 0 and mc["continuations"] > 0 and mc["generated_tokens"] > 0
    assert "The oracle / vineppo columns are Monte-Carlo estimates" in md
    fid = pt["oracle"]["methods"]["oracle"]
    assert fid["spearman"] == pytest.approx(1.0) and fid["sign_agreement"] == pytest.approx(1.0)
    assert pt["oracle"]["methods"]["vineppo"]["status"] != "n/a"
    m, chance = pt["methods"], pt["baselines"]["random"]
    assert m["oracle"]["blame@1"] > chance["blame@1"] and m["oracle"]["blame@3"] > chance["blame@3"]


def test_user_strings_are_escaped_in_the_markdown():
    model = "/tmp/my_*model*/[v2]|#1 <b>`x`"
    point = {
        "label": f"model {model}",
        "source": f"model directory {model}",
        "step": None,
        "rollouts": {
            "rollouts": 4,
            "groups": 2,
            "accuracy": 0.5,
            "mixed_groups": 1,
            "mixed_rollouts": 2,
            "mean_length": 3.0,
        },
    }
    result = {
        "command": f"tokencredit probe --model {model} --data d_*x*.jsonl",
        "ks": [1],
        "config": {"data": "d_*x*.jsonl", "advantage": "grpo", "temperature": 1.0, "seed": 0},
        "points": [point],
    }
    md = probe.markdown_report(result)
    escaped = r"/tmp/my\_\*model\*/\[v2\]\|\#1 \<b\>\`x\`"
    assert f"\n## model {escaped}\n" in md and f"\nmodel directory {escaped}. 4 rollouts" in md
    assert r"on d\_\*x\*.jsonl" in md and r"d\_\*x\*.jsonl has no checker truth" in md
    assert f"\n``{result['command']}``\n" in md  # a code span fenced past the backticks inside
    assert probe.render.md_text("a\nb") == "a b" and probe.render.code_span("`") == "`` ` ``"

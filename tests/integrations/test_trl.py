"""TRL plugin: CreditGRPOTrainer trains a tiny random Qwen3 on CPU; the (B, T) advantages TRL's loss
receives are exactly the core's credit on the same completions."""

import math

import pytest
import torch

pytestmark = pytest.mark.extras  # needs tokencredit[trl]: skipped without it, run by `pytest -m extras`
pytest.importorskip("trl", reason="TRL is not installed (extra tokencredit[trl])")
from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM  # noqa: E402
from trl import GRPOConfig  # noqa: E402

import tokencredit.integrations.trl as tc_trl  # noqa: E402  (a wrong trl version fails here, loudly)
from tokencredit import advantages, credit  # noqa: E402
from tokencredit.batch import RolloutBatch  # noqa: E402
from tokencredit.errors import ConfigError  # noqa: E402
from tokencredit.rewards import math_reward  # noqa: E402

# Whole boxed answers are single tokens, so a random policy answers right about half the time.
WORDS = ["<pad>", "<eos>", "\\boxed{1}", "\\boxed{2}", "1", "2", "+", "=", "x", "y", "what", "is", "?"]
PROMPTS = {"what is 1 + 1 ?": "2", "what is 2 ?": "2", "x + y = 1 ?": "1", "is y = x ?": "1"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_qwen3")
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="x"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>").save_pretrained(d)
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=len(WORDS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
        tie_word_embeddings=False,
    )
    Qwen3ForCausalLM(cfg).save_pretrained(d)
    return d


def math_answer_reward(completions, answer, **_):
    """The real verifier: 1.0 when the completion's boxed answer equals the gold answer."""
    return math_reward(completions, answer)


class Recording(tc_trl.CreditGRPOTrainer):
    """Records every scoring (what the plugin computed) and every loss call (what TRL's loss received)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.scored, self.loss_inputs, self.losses = [], [], []
        self.trl_logged = []  # TRL's logged advantages of the last scoring, before the plugin replaced them

    def _log_trained_advantages(self):
        self.trl_logged = list(self._logs["advantages"])
        super()._log_trained_advantages()

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.scored.append(
            {**self.last_credit, "prompt_ids": out["prompt_ids"].clone(), "inputs": list(inputs)}
        )
        return out

    def _compute_loss(self, model, inputs):
        self.loss_inputs.append(
            {k: inputs[k].clone() for k in ("prompt_ids", "completion_ids", "advantages")}
        )
        loss = super()._compute_loss(model, inputs)
        self.losses.append(float(loss.detach()))
        return loss


def _trainer(model_dir, tmp_path, credit_name, max_steps=2, **kw):
    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    ds = Dataset.from_list([{"prompt": p, "answer": a} for p, a in PROMPTS.items()] * 4)
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        num_generations=4,
        steps_per_generation=2,
        max_completion_length=8,
        max_steps=max_steps,
        learning_rate=1e-2,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        seed=0,
        beta=0.0,
        **kw,
    )
    return Recording(
        model=str(model_dir),
        reward_funcs=math_answer_reward,
        args=args,
        train_dataset=ds,
        processing_class=tok,
        credit=credit_name,
    )


def _rows_match(a_prompt, a_comp, b_prompt, b_comp):
    return torch.equal(a_prompt, b_prompt) and torch.equal(a_comp, b_comp)


def _check_loss_saw_plugin_advantages(trainer):
    """Every row TRL's loss saw (after its shuffle/split) carries the Â the plugin computed for it."""
    rows = 0
    for call in trainer.loss_inputs:
        assert call["advantages"].shape == call["completion_ids"].shape  # (B, T)
        for p, c, a in zip(call["prompt_ids"], call["completion_ids"], call["advantages"]):
            cands = [
                rec["advantages"][i]
                for rec in trainer.scored
                for i in range(len(rec["advantages"]))
                if _rows_match(rec["prompt_ids"][i], rec["completion_ids"][i], p, c)
            ]
            assert cands and all(torch.equal(x, a) for x in cands)
            rows += 1
    assert rows == sum(len(r["advantages"]) for r in trainer.scored)
    assert trainer.losses and all(math.isfinite(x) for x in trainer.losses)
    assert all(math.isfinite(h["loss"]) for h in trainer.state.log_history if "loss" in h)


def test_ktae_two_steps_trl_uses_the_core_advantages(model_dir, tmp_path):
    trainer = _trainer(model_dir, tmp_path, "ktae")
    trainer.train()
    assert trainer.state.global_step == 2 and trainer.scored
    tok = trainer.processing_class
    for rec in trainer.scored:
        ids, mask = rec["completion_ids"], rec["mask"]
        # the scores are the real verifier's verdicts on the decoded completions
        texts = tok.batch_decode(ids.masked_fill(~mask, tok.pad_token_id), skip_special_tokens=True)
        golds = [x["answer"] for x in rec["inputs"]]
        assert rec["scores"].tolist() == math_answer_reward(texts, golds)
        # non-degenerate: some group has right and wrong answers, so the comparison below can fail
        per_group = rec["scores"].view(-1, 4).sum(-1)
        assert ((per_group > 0) & (per_group < 4)).any(), texts
        gids = torch.arange(len(ids)) // 4
        seq = advantages.grpo(rec["scores"], gids, eps=1e-4)  # TRL's scale_rewards="group"
        batch = RolloutBatch(ids, mask, gids, rec["scores"])
        want = credit.compute("ktae", batch, seq, ignore_token_ids=tuple(sorted(tok.all_special_ids)))
        torch.testing.assert_close(rec["advantages"], want, rtol=0, atol=0)
        assert (rec["advantages"][~mask] == 0).all() and not torch.equal(want, seq[:, None] * mask)
    # the sequence baseline is TRL's own (B,) advantage (as TRL logged it, before the plugin's table fix)
    trl_adv = torch.tensor(trainer.trl_logged)
    torch.testing.assert_close(
        torch.cat([r["sequence_advantages"] for r in trainer.scored]), trl_adv, atol=1e-6, rtol=0
    )
    _check_loss_saw_plugin_advantages(trainer)


def test_entropy_method_runs_one_signals_pass_on_the_old_policy(model_dir, tmp_path):
    initial = Qwen3ForCausalLM.from_pretrained(model_dir).eval()
    trainer = _trainer(model_dir, tmp_path, "entropy-80-20")
    trainer.train()
    rec = trainer.scored[0]  # generated with the initial weights
    ids, mask, prompt_ids = rec["completion_ids"], rec["mask"], rec["prompt_ids"]
    seq = torch.cat([prompt_ids, ids], 1)
    attn = torch.cat([prompt_ids != 0, mask], 1).long()
    with torch.no_grad():
        logits = initial(
            input_ids=seq, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0)
        ).logits
    logp = torch.log_softmax(logits[:, prompt_ids.shape[1] - 1 : -1].float(), -1)
    entropy = -(logp.exp() * logp).sum(-1) * mask
    torch.testing.assert_close(rec["signals"]["entropy"], entropy, atol=1e-5, rtol=1e-5)
    gids = torch.arange(len(ids)) // 4
    batch = RolloutBatch(ids, mask, gids, rec["scores"], entropy=rec["signals"]["entropy"])
    # "entropy-80-20" is a recipe: its own baseline (GRPO, eps 1e-6) and keep ratio 0.2
    want = credit.compute("entropy-80-20", batch, advantages.grpo(rec["scores"], gids), keep_ratio=0.2)
    torch.testing.assert_close(rec["advantages"], want, rtol=0, atol=0)
    assert (rec["advantages"] != 0).sum() < mask.sum()  # the 80/20 mask removed tokens
    _check_loss_saw_plugin_advantages(trainer)


def test_unsupported_configurations_fail_clearly(model_dir, tmp_path):
    with pytest.raises(ConfigError, match="strace"):
        _trainer(model_dir, tmp_path, "strace")
    with pytest.raises(ConfigError, match="importance_sampling_level"):
        _trainer(model_dir, tmp_path, "gspo")
    with pytest.raises(ConfigError, match="unknown recipe or credit method 'ktea'.*ktae"):
        _trainer(model_dir, tmp_path, "ktea")
    with pytest.raises(ImportError, match=r"TRL >=1.0,<2"):
        tc_trl.check_version("0.29.0")


def _logprobs(model, prompt_ids, prompt_mask, ids, mask):
    """log pi(y_t) of the completion after a left-padded prompt, from the full logits (independent check)."""
    seq = torch.cat([prompt_ids, ids], 1)
    attn = torch.cat([prompt_mask, mask], 1).long()
    with torch.no_grad():
        logits = model(
            input_ids=seq, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0)
        ).logits
    logp = torch.log_softmax(logits[:, prompt_ids.shape[1] - 1 : -1].float(), -1)
    return logp.gather(-1, ids[..., None]).squeeze(-1) * mask


def test_gcpo_scores_the_completions_after_a_negative_prompt(model_dir, tmp_path):
    """GCPO needs old log-probs and a negative-prompt pass: one scoring call, no training needed."""
    from tokencredit.credit.gcpo import negative_prompt

    trainer = _trainer(model_dir, tmp_path, "gcpo")
    tok = trainer.processing_class
    problems = ["1 + 1", "2"]
    inputs = [{"prompt": f"what is {p} ?", "problem": p, "answer": "2"} for p in problems for _ in range(4)]
    enc = tok([x["prompt"] for x in inputs], return_tensors="pt", padding=True, padding_side="left")
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, len(WORDS), (8, 6), generator=g)
    mask = torch.arange(6)[None, :] < torch.tensor([6, 3, 5, 2, 6, 4, 1, 6])[:, None]
    output = {
        "prompt_ids": enc["input_ids"],
        "prompt_mask": enc["attention_mask"],
        "completion_ids": ids,
        "completion_mask": mask.long(),
    }
    scores = torch.tensor([1.0, 0, 1, 0, 0, 1, 1, 1])
    trainer._tc_rewards = scores[:, None]
    got = trainer._token_advantages(inputs, output)

    model = trainer.accelerator.unwrap_model(trainer.model).eval()
    old = _logprobs(model, enc["input_ids"], enc["attention_mask"], ids, mask)
    neg_text = [x["prompt"].replace(x["problem"], negative_prompt(x["problem"])) for x in inputs]
    neg = tok(neg_text, return_tensors="pt", padding=True, padding_side="left")
    neg_lp = _logprobs(model, neg["input_ids"], neg["attention_mask"], ids, mask)
    torch.testing.assert_close(trainer.last_credit["signals"]["old_log_probs"], old, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(trainer.last_credit["signals"]["neg_log_probs"], neg_lp, atol=1e-5, rtol=1e-5)
    gids = torch.arange(8) // 4
    batch = RolloutBatch(ids, mask, gids, scores, **trainer.last_credit["signals"])
    want = credit.compute("gcpo", batch, advantages.grpo(scores, gids))  # recipe "gcpo": GRPO eps 1e-6
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not torch.equal(want, advantages.grpo(scores, gids)[:, None] * mask)


def test_trl_completions_table_shows_the_trained_token_advantages(model_dir, tmp_path):
    """TRL's completions table (its `_logs`, the parquet file) holds each completion's mean Â over its loss
    tokens, with A and Â's range as extra columns, not TRL's scalar GRPO advantage; credit/* is logged."""
    pd = pytest.importorskip("pandas", reason="TRL's completions table needs pandas")
    trainer = _trainer(model_dir, tmp_path, "ktae", log_completions=True)
    trainer.train()
    rec = trainer.scored[-1]
    adv, mask = rec["advantages"], rec["mask"]
    n = mask.sum(1).clamp(min=1)
    mean = (adv * mask).sum(1) / n
    lo = torch.where(mask, adv, torch.inf).amin(1)
    hi = torch.where(mask, adv, -torch.inf).amax(1)
    logged = trainer._logs
    torch.testing.assert_close(torch.tensor(list(logged["advantages"])), mean, atol=1e-6, rtol=0)
    torch.testing.assert_close(
        torch.tensor(list(logged["extra"]["sequence_advantage"])),
        rec["sequence_advantages"],
        atol=1e-6,
        rtol=0,
    )
    torch.testing.assert_close(
        torch.tensor(list(logged["extra"]["token_advantage_min"])), lo, atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        torch.tensor(list(logged["extra"]["token_advantage_max"])), hi, atol=1e-6, rtol=0
    )
    # what TRL had logged was its scalar advantage (= A here), which KTAE's mean Â differs from somewhere
    torch.testing.assert_close(
        torch.tensor(trainer.trl_logged), rec["sequence_advantages"], atol=1e-6, rtol=0
    )
    assert (mean - rec["sequence_advantages"]).abs().max() > 1e-4
    table = pd.read_parquet(tmp_path / "out" / "completions" / "completions_00002.parquet")
    assert table["advantage"].tolist() == pytest.approx(mean.tolist(), abs=1e-6)
    assert table["sequence_advantage"].tolist() == pytest.approx(
        rec["sequence_advantages"].tolist(), abs=1e-6
    )
    assert any("credit/gini" in h and "credit/eff_ratio" in h for h in trainer.state.log_history)


def test_credit_diagnostics_in_trl_logs_and_saved_rollouts_explained(model_dir, tmp_path):
    """Two real steps (one generation each): the credit diagnostics of each scored batch are in TRL's log
    history as credit/<name>, equal to `tokencredit.diagnostics.summary` on that batch; SaveRolloutsCallback
    (every 2 steps) writes step 2's rollouts with the Â TRL's loss received, which explain reads and renders."""
    from tokencredit import diagnostics
    from tokencredit.cli import main
    from tokencredit.data.loaders import load_problems
    from tokencredit.explain.jsonl import load_jsonl
    from tokencredit.models import special_token_ids
    from tokencredit.recipes import token_credit

    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    ds = Dataset.from_list([{"prompt": p, "answer": a} for p, a in PROMPTS.items()] * 4)
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        num_generations=4,
        steps_per_generation=1,
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-2,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        seed=0,
        beta=0.0,
    )
    saver = tc_trl.SaveRolloutsCallback(tmp_path / "rollouts", every=2)
    trainer = Recording(
        model=str(model_dir),
        reward_funcs=math_answer_reward,
        args=args,
        train_dataset=ds,
        processing_class=tok,
        credit="entropy-80-20",
    )
    trainer.add_callback(saver)
    assert saver.trainer is trainer
    trainer.train()
    assert trainer.state.global_step == 2 and len(trainer.scored) == 2

    logged = [h for h in trainer.state.log_history if "credit/gini" in h]
    assert [h["step"] for h in logged] == [1, 2]
    for rec, entry in zip(trainer.scored, logged):
        gids = torch.arange(len(rec["completion_ids"])) // 4
        batch = RolloutBatch(
            rec["completion_ids"], rec["mask"], gids, rec["scores"], entropy=rec["signals"]["entropy"]
        )
        tc = token_credit(trainer._engine_recipe(), batch, special_ids=special_token_ids(tok))
        want = diagnostics.summary(tc.effective(), batch.mask, tc.seq_advantages, batch.entropy)
        assert set(want) >= {
            "credit_gini",
            "credit_eff_ratio",
            "credit_sign_flip",
            "credit_high_entropy_share",
        }
        for key, value in want.items():
            name = "credit/" + key.removeprefix("credit_")
            assert math.isfinite(entry[name]) and entry[name] == pytest.approx(value, rel=1e-9, abs=1e-12), (
                name
            )
    assert (
        0 < logged[1]["credit/gini"] < 1
    )  # step 2 has a mixed group: the 80/20 mask concentrates its credit

    assert not (tmp_path / "rollouts" / "step_000001.jsonl").exists()
    path = tmp_path / "rollouts" / "step_000002.jsonl"
    groups = load_jsonl(path)
    rec = trainer.scored[-1]  # step 2's generation
    assert len(groups) == 2 and [g.group_id for g in groups] == [0, 1]
    comps = [c for g in groups for c in g.completions]
    assert len(comps) == 8
    for i, c in enumerate(comps):
        n = len(c.token_ids)
        assert c.token_ids == rec["completion_ids"][i, :n].tolist() and rec["mask"][i, :n].all()
        assert not rec["mask"][i, n:].any()
        assert c.score == float(rec["scores"][i]) and c.advantage == pytest.approx(
            float(rec["sequence_advantages"][i])
        )
        torch.testing.assert_close(
            torch.tensor(c.token_advantages), rec["advantages"][i, :n], atol=1e-6, rtol=0
        )
        assert c.entropy is not None and len(c.entropy) == n
    for g, first in zip(groups, (0, 4)):
        example = rec["inputs"][first]
        assert (
            g.prompt == example["prompt"] and g.problem == example["prompt"] and g.answer == example["answer"]
        )
        assert g.extra["step"] == 2 and g.extra["recipe"] == "entropy-80-20"
    # `tokencredit probe --data FILE` reads the same file as problems with their answers
    problems = load_problems(path)
    assert [(q.problem, q.answer) for q in problems] == [(g.problem, g.answer) for g in groups]

    html = tmp_path / "explain.html"
    argv = [
        "explain",
        "--jsonl",
        str(path),
        "--model",
        str(model_dir),
        "--methods",
        "entropy-80-20,ktae,uniform",
        "--out",
        str(html),
        "--device",
        "cpu",
    ]
    assert main(argv) == 0
    assert html.is_file() and "entropy-80-20" in html.read_text()


def test_save_rollouts_callback_is_refused_without_a_credit_trainer(tmp_path):
    with pytest.raises(ConfigError, match="positive integer"):
        tc_trl.SaveRolloutsCallback(tmp_path, every=0)
    with pytest.raises(ConfigError, match="CreditGRPOTrainer"):
        tc_trl.SaveRolloutsCallback(tmp_path, every=5).on_train_begin(None, None, None)

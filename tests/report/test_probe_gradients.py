"""`tokencredit.report.probe.gradients`: the policy gradient of a credit, its cosines, the probe's columns."""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import tiny_qwen3
from tokencredit import cli
from tokencredit.errors import ConfigError
from tokencredit.report import probe
from tokencredit.rollout import PromptResponseLayout
from tokencredit.signals import position_ids_from_mask

VOCAB, N, P, T = 40, 6, 5, 7


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3(VOCAB, seed=0, max_position_embeddings=64, tie_word_embeddings=False).eval()


@pytest.fixture(scope="module")
def layout():
    """6 rows: row 0's prompt left-padded by 2, row 1's response 4 tokens long (right-padded)."""
    g = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(2, VOCAB, (N, P), generator=g)
    prompt_mask = torch.ones(N, P, dtype=torch.bool)
    prompt_ids[0, :2], prompt_mask[0, :2] = 0, False
    response_ids = torch.randint(2, VOCAB, (N, T), generator=g)
    response_mask = torch.ones(N, T, dtype=torch.bool)
    response_ids[1, 4:], response_mask[1, 4:] = 0, False
    return PromptResponseLayout(prompt_ids, prompt_mask, response_ids, response_mask)


def _credit(seed):
    return torch.randn(N, T, generator=torch.Generator().manual_seed(seed))


def _brute_force(model, layout, credit, temperature):
    """∇θ Σ Â log π from the plain forward's full logits (the explicit sum, autograd)."""
    params = list(model.parameters())
    att = layout.attention_mask
    logits = model(
        input_ids=layout.sequences, attention_mask=att, position_ids=position_ids_from_mask(att)
    ).logits
    logp = torch.log_softmax(logits[:, P - 1 : -1].float() / temperature, -1)
    logp = logp.gather(-1, layout.response_ids[..., None]).squeeze(-1)
    objective = (credit * logp * layout.response_mask).sum()
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(objective, params)])


@pytest.mark.parametrize("micro", [2, N])  # several micro-batches; one, whose graph serves every credit
def test_policy_gradient_matches_autograd_of_the_explicit_sum(model, layout, micro):
    params, _ = probe.trainable_parameters(model)
    credit = _credit(0)
    got = probe.policy_gradient(model, layout, credit, params, temperature=0.7, micro_batch_size=micro)
    want = _brute_force(model, layout, credit, 0.7)
    assert got.shape == (sum(p.numel() for p in params),) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))
    # padding carries no credit: garbage there changes nothing
    noisy = torch.where(layout.response_mask, credit, 1e3)
    torch.testing.assert_close(
        probe.policy_gradient(model, layout, noisy, params, temperature=0.7, micro_batch_size=micro), got
    )
    assert all(p.grad is None for p in params)  # autograd.grad: the parameters' .grad is left alone


def test_policy_gradient_is_linear_in_the_credit(model, layout):
    params, _ = probe.trainable_parameters(model)
    a1, a2 = _credit(1), _credit(2)
    g1, g2, g12 = (
        probe.policy_gradient(model, layout, c, params, micro_batch_size=4) for c in (a1, a2, a1 + a2)
    )
    scale = float(g12.abs().max())
    assert scale > 0
    torch.testing.assert_close(g12, g1 + g2, rtol=0, atol=1e-5 * scale)


def test_cosines_self_negation_scaling_and_reuse(model, layout):
    params, _ = probe.trainable_parameters(model)
    star, uniform = _credit(3), torch.ones(N, T)
    credits = {
        "same": star.clone(),
        "negated": -star,
        "doubled": 2 * star,
        "other": _credit(4),
        "zero": torch.zeros(N, T),
    }
    batches = [torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5])]
    cos, passes = probe.gradient_cosines(
        model, layout, credits, {"oracle": star, "grpo": uniform}, batches, params, micro_batch_size=N
    )
    c, refs = cos["credits"], cos["references"]
    assert refs["oracle"]["oracle"] == pytest.approx([1.0, 1.0]) and refs["grpo"]["grpo"] == pytest.approx(
        [1.0, 1.0]
    )
    assert refs["oracle"]["grpo"] == pytest.approx(refs["grpo"]["oracle"])
    assert c["same"]["oracle"] == pytest.approx([1.0, 1.0]) and c["negated"]["oracle"] == pytest.approx(
        [-1.0, -1.0]
    )
    assert c["doubled"]["oracle"] == pytest.approx([1.0, 1.0])
    assert c["doubled"]["grpo"] == pytest.approx(refs["oracle"]["grpo"], abs=1e-6)  # scale-free
    assert c["negated"]["grpo"] == pytest.approx([-x for x in refs["oracle"]["grpo"]], abs=1e-6)
    assert all(abs(x) < 0.999 for x in c["other"]["oracle"] + c["other"]["grpo"])
    assert c["zero"] == {"oracle": [None, None], "grpo": [None, None]}  # no gradient, no direction
    # per batch: 2 references + negated, doubled, other; "same" reuses the oracle's, "zero" needs no pass
    assert passes == 2 * 5
    # a batch's cosine is that batch's gradient's: the explicit gradients of batch 1 give the same number
    rows = PromptResponseLayout(*(t[3:] for t in (layout.prompt_ids, layout.prompt_mask, layout.response_ids,
                                                  layout.response_mask)))  # fmt: skip
    g_other, g_star = (probe.policy_gradient(model, rows, x[3:], params) for x in (credits["other"], star))
    assert c["other"]["oracle"][1] == pytest.approx(probe.cosine(g_other, g_star), abs=1e-6)


def test_cosine_group_batches_and_standard_errors():
    a = torch.tensor([1.0, 0.0, 0.0])
    assert probe.cosine(a, torch.tensor([2.0, 0.0, 0.0])) == 1.0
    assert probe.cosine(a, torch.tensor([1.0, 1.0, 0.0])) == pytest.approx(1 / math.sqrt(2))
    assert probe.cosine(a, torch.zeros(3)) is None
    groups = torch.tensor([7, 7, 3, 3, 9, 9, 9, 5])
    batches = probe.group_batches(groups, 3)
    assert [b.tolist() for b in batches] == [[2, 3, 7], [0, 1], [4, 5, 6]]  # groups 3, 5 | 7 | 9 (sorted ids)
    assert len(probe.group_batches(groups, 10)) == 4  # at most one batch per group
    assert probe.group_batches(torch.zeros(0, dtype=torch.long), 2) == []
    mean, se = probe.mean_and_stderr([0.5, None, 0.7, 0.9])
    assert mean == pytest.approx(0.7) and se == pytest.approx(0.2 / math.sqrt(3))
    assert probe.mean_and_stderr([0.4]) == (0.4, None) and probe.mean_and_stderr([None]) == (None, None)


def test_trainable_parameters_of_a_lora_model_are_its_adapter(layout):
    from tokencredit.models import add_lora

    lora = add_lora(tiny_qwen3(VOCAB, seed=0, max_position_embeddings=64), rank=2, alpha=4).eval()
    params, described = probe.trainable_parameters(lora)
    names = {id(p): n for n, p in lora.named_parameters()}
    assert params and all("lora_" in names[id(p)] for p in params) and "LoRA adapter" in described
    frozen = [p for p in lora.parameters() if not p.requires_grad]
    # lora_B = 0 at attachment: only lora_B gets a gradient, and the frozen base stays frozen
    g = probe.policy_gradient(lora, layout, _credit(5), params)
    assert g.shape == (sum(p.numel() for p in params),) and bool(g.any())
    assert frozen and all(not p.requires_grad for p in frozen)
    full, described = probe.trainable_parameters(tiny_qwen3(VOCAB, seed=0, max_position_embeddings=64))
    assert "all" in described and "merged" in described and len(full) > len(params)


def test_probe_config_grad_batches():
    kw = dict(groups=2, group_size=2, seed=0, max_new_tokens=None, random_draws=1, batch_size=8, ks="1")
    assert probe.probe_config(None, None, **kw).grad_batches == probe.DEFAULT_GRAD_BATCHES
    assert probe.probe_config(None, None, grad_batches=0, **kw).record()["grad_batches"] == 0
    with pytest.raises(ConfigError, match="--grad-batches must be 0"):
        probe.probe_config(None, None, grad_batches=1, **kw)


TOY = ["--model", "toy", "--groups", "4", "--group-size", "4", "--random-draws", "2", "--threads", "1",
       "--methods", "grpo,gspo,surprisal,arca", "--oracle", "2"]  # fmt: skip


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory):
    """The toy warm start with --oracle 2, with the gradient cosines on 2 batches and turned off."""
    tmp = tmp_path_factory.mktemp("probe_gradients")
    out = {}
    for name, extra in (("on", ["--grad-batches", "2"]), ("off", ["--grad-batches", "0"])):
        path = tmp / f"{name}.json"
        assert cli.main(["probe", "--out", str(path), *TOY, *extra]) == 0
        out[name] = (json.loads(path.read_text()), path.with_suffix(".md").read_text())
    return out


def test_cli_gradient_columns_and_headroom(toy_runs):
    data, md = toy_runs["on"]
    assert data["command"].endswith("--oracle 2 --grad-batches 2") and data["config"]["grad_batches"] == 2
    sec = data["points"][0]["oracle"]
    grads = sec["gradients"]
    assert grads["status"] == "ok" and grads["batches"] == 2 and grads["backward_passes"] > 0
    assert sum(grads["rollouts_per_batch"]) == sec["rollouts"] and grads["seconds"] >= 0
    assert grads["parameter_count"] == 652_736 and "merged" in grads["parameters"]
    star = grads["references"]["oracle"]
    assert star["cos_oracle"]["per_batch"] == pytest.approx([1.0, 1.0])  # A*'s gradient with itself
    assert star["cos_oracle"]["mean"] == pytest.approx(1.0)
    head = grads["headroom"]
    assert head["per_batch"] == pytest.approx([1 - c for c in star["cos_grpo"]["per_batch"]])
    assert 0.0 <= head["mean"] <= 2.0 and head["se"] is not None and math.isfinite(head["se"])
    for name in ("grpo", "gspo", "surprisal"):
        r = sec["methods"][name]
        for ref in ("oracle", "grpo"):
            assert -1.0 <= r[f"grad_cos_{ref}"] <= 1.0 and math.isfinite(r[f"grad_cos_{ref}_se"])
            assert grads["credits"][name][f"cos_{ref}"]["mean"] == r[f"grad_cos_{ref}"]
    assert sec["methods"]["grpo"]["grad_cos_grpo"] == pytest.approx(1.0)
    assert sec["methods"]["gspo"]["grad_cos_grpo"] == pytest.approx(1.0)  # on-policy GSPO is GRPO's credit
    assert sec["methods"]["grpo"]["grad_cos_oracle"] == pytest.approx(1 - head["mean"])
    assert "grad_cos_oracle" not in sec["methods"]["arca"] and "arca" not in grads["credits"]
    table = [line for line in md.split("### Credit fidelity")[1].splitlines() if line.startswith("|")]
    assert table[0].endswith("| cos(g, g*) | cos(g, g_GRPO) |")
    assert all(line.count("|") == 3 + 6 + 2 for line in table if not line.startswith("|---"))
    assert table[-1].startswith("| *Monte-Carlo oracle (K=2)* | cost: ") and table[-1].endswith(
        f"| 1.000 ± 0.000 | {star['cos_grpo']['mean']:.3f} ± {star['cos_grpo']['se']:.3f} |"
    )
    assert f"| {sec['methods']['surprisal']['grad_cos_oracle']:.3f} ± " in md
    assert f"**Headroom index 1 - cos(g_GRPO, g*) = {head['mean']:.3f} ± {head['se']:.3f}**" in md
    assert "at ratio 1" in md and f"{grads['backward_passes']} backward passes" in md


def test_cli_grad_batches_0_turns_it_off(toy_runs):
    (on, md_on), (off, md_off) = toy_runs["on"], toy_runs["off"]
    sec_on, sec_off = on["points"][0]["oracle"], off["points"][0]["oracle"]
    assert "gradients" not in sec_off and "--grad-batches 0" in off["command"]
    assert "cos(g" not in md_off and "Headroom index" not in md_off
    # the same rollouts and every other number: only the gradient keys differ
    for name, row in sec_on["methods"].items():
        assert {k: v for k, v in row.items() if not k.startswith("grad_cos_")} == sec_off["methods"][name]

    def cells(md):
        return [
            line.split("|")[1:-1]
            for line in md.split("### Credit fidelity")[1].splitlines()
            if line.startswith("|")
        ]

    table_on, table_off = cells(md_on), cells(md_off)
    assert len(table_on) == len(table_off) > 4
    # the same table less the two gradient columns (but the oracle's cost row, whose seconds differ)
    assert [row[:-2] for row in table_on[:-1]] == table_off[:-1]

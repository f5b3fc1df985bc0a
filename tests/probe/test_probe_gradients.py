"""`tokencredit.probe.gradients`: the policy gradient of a credit, its cosines, the probe's columns."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from conftest import tiny_qwen3
from tokencredit import cli, probe
from tokencredit.errors import ConfigError
from tokencredit.probe import gradients as gradients_module
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
    rows = PromptResponseLayout(
        *(t[3:] for t in (layout.prompt_ids, layout.prompt_mask, layout.response_ids, layout.response_mask))
    )
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


TOY = [
    "--model",
    "toy",
    "--groups",
    "4",
    "--group-size",
    "4",
    "--random-draws",
    "2",
    "--threads",
    "1",
    "--methods",
    "grpo,gspo,surprisal,arca",
    "--oracle",
    "2",
]


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
    lines = md.split("### Credit fidelity")[1].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = list(itertools.takewhile(lambda line: line.startswith("|"), lines[first:]))  # the fidelity table
    assert table[0].endswith(
        "| cos(g, g*) | corrected | cos(g, g_GRPO) |"
    )  # K = 2 is even: the noise ceiling
    assert all(line.count("|") == 3 + 6 + 3 for line in table if not line.startswith("|---"))
    assert table[-1].startswith("| *Monte-Carlo oracle (K=2)* | cost: ") and table[-1].endswith(
        f"| 1.000 ± 0.000 | – | {star['cos_grpo']['mean']:.3f} ± {star['cos_grpo']['se']:.3f} |"
    )
    s = sec["methods"]["surprisal"]
    assert (
        f"| {s['grad_cos_oracle']:.3f} ± {s['grad_cos_oracle_se']:.3f} | {s['grad_cos_oracle_corrected']:.3f} ± "
        in md
    )
    assert (
        f"**Headroom index 1 - cos(g_GRPO, g*) = {head['mean']:.3f} ± {head['se']:.3f}** (noise-corrected "
        in md
    )
    assert "at ratio 1" in md and f"{grads['backward_passes']} backward passes" in md
    # the expected gradients of two batches: estimates, no jackknife SE (below 3 batches), and their table
    e = grads["expected"]
    assert e["status"] == "ok" and e["batches"] == 2 and set(e["credits"]) == set(grads["credits"])
    assert all(v["se"] is None for row in e["credits"].values() for v in row.values())
    assert "Expected headroom 1 - cos(E g_GRPO, E g*)" in md and "| credit | cos(E g, E g*) |" in md


def test_cli_grad_batches_0_turns_it_off(toy_runs):
    (on, md_on), (off, md_off) = toy_runs["on"], toy_runs["off"]
    sec_on, sec_off = on["points"][0]["oracle"], off["points"][0]["oracle"]
    assert "gradients" not in sec_off and "--grad-batches 0" in off["command"]
    assert "cos(g" not in md_off and "Headroom index" not in md_off
    # the same rollouts and every other number: only the gradient keys differ
    for name, row in sec_on["methods"].items():
        assert {k: v for k, v in row.items() if not k.startswith("grad_cos_")} == sec_off["methods"][name]

    def cells(md):  # the fidelity table: the first block of table lines after its heading
        lines = md.split("### Credit fidelity")[1].splitlines()
        first = next(i for i, line in enumerate(lines) if line.startswith("|"))
        return [
            line.split("|")[1:-1] for line in itertools.takewhile(lambda x: x.startswith("|"), lines[first:])
        ]

    table_on, table_off = cells(md_on), cells(md_off)
    assert len(table_on) == len(table_off) > 4
    # the same table less the three gradient columns (but the oracle's cost row, whose seconds differ)
    assert [row[:-3] for row in table_on[:-1]] == table_off[:-1]


# ------------------------------------------------------------------------ split-half noise ceiling
def test_spearman_brown_and_disattenuation():
    assert probe.spearman_brown(0.5) == pytest.approx(2 / 3) and probe.spearman_brown(1.0) == 1.0
    assert probe.spearman_brown(0.2) == pytest.approx(0.4 / 1.2)
    assert [probe.spearman_brown(r) for r in (0.0, -0.3, None)] == [
        None,
        None,
        None,
    ]  # undefined, not divided
    assert probe.disattenuated(0.6, 0.64) == (pytest.approx(0.75), False)
    assert probe.disattenuated(0.9, 0.64) == (1.0, True) and probe.disattenuated(-0.9, 0.64) == (-1.0, True)
    assert probe.disattenuated(None, 0.5) == (None, False) and probe.disattenuated(0.5, None) == (None, False)
    assert probe.disattenuated(0.5, 0.0) == (None, False)


def test_noise_ceiling_per_batch_and_where_it_is_undefined():
    split = [0.5, -0.2, None, 0.8]  # batch 1: halves anti-aligned; batch 2: a half's gradient was 0
    c = probe.noise_ceiling(split, {"m": [0.4, 0.3, 0.2, 0.99]}, [0.6, 0.5, 0.4, 0.7])
    rel = c["reliability"]
    assert rel["status"] == "ok" and rel["undefined_batches"] == [1, 2] and "batch(es) 1, 2" in rel["reason"]
    assert rel["split_half"]["per_batch"] == split
    assert rel["full_k"]["per_batch"] == pytest.approx([2 / 3, None, None, 1.6 / 1.8])
    r_k = [2 / 3, 1.6 / 1.8]
    want = [0.4 / math.sqrt(r_k[0]), None, None, 1.0]  # 0.99 / sqrt(0.889) > 1: capped
    assert c["credits"]["m"]["per_batch"] == pytest.approx(want) and c["credits"]["m"]["capped"] == 1
    mean, se = probe.mean_and_stderr(want)
    assert (c["credits"]["m"]["mean"], c["credits"]["m"]["se"]) == (pytest.approx(mean), pytest.approx(se))
    head = c["headroom_corrected"]
    assert head["per_batch"] == pytest.approx(
        [1 - 0.6 / math.sqrt(r_k[0]), None, None, 1 - 0.7 / math.sqrt(r_k[1])]
    )
    assert head["mean"] == pytest.approx(probe.mean_and_stderr(head["per_batch"])[0]) and head["capped"] == 0
    none = probe.noise_ceiling([0.0, -0.1], {"m": [0.4, 0.3]}, [0.5, 0.5])
    assert none["reliability"]["status"] == "undefined" and none["headroom_corrected"]["mean"] is None
    assert none["credits"]["m"] == {"mean": None, "se": None, "per_batch": [None, None], "capped": 0}
    # the Markdown says so instead of printing a number
    grads = {
        "status": "ok",
        "parameters": "θ",
        "batches": 2,
        "groups_per_batch": [1, 1],
        "rollouts_per_batch": [2, 2],
        "backward_passes": 8,
        "seconds": 0.1,
        "headroom": {"mean": 0.5, "se": 0.0},
        "reliability": {**none["reliability"], "k_half": 2},
        "headroom_corrected": none["headroom_corrected"],
        "credits": {"m": {"cos_oracle_corrected": none["credits"]["m"]}},
    }
    line = probe.gradient_line(grads)
    assert (
        "(noise-corrected n/a; split-half reliability of g* n/a, from cos(g*_a, g*_b) = -0.050 ± 0.050)"
        in line
    )
    assert "Undefined (null) on batch(es) 0, 1: split-half cosine <= 0" in line


def _ceiling_on(model, rows, t, n_batches, sigma, same_noise, seed=0):
    """The noise ceiling of a signal credit S whose oracle halves are S + sigma noise, on n_batches batches
    of `rows` random rows x t tokens: (its corrected and uncorrected cosines with g*, r_half), mean over batches."""
    g = torch.Generator().manual_seed(seed)
    n = rows * n_batches
    lay = PromptResponseLayout(
        torch.randint(2, VOCAB, (n, P), generator=g),
        torch.ones(n, P, dtype=torch.bool),
        torch.randint(2, VOCAB, (n, t), generator=g),
        torch.ones(n, t, dtype=torch.bool),
    )
    signal, noise_a, noise_b = (torch.randn(n, t, generator=g) for _ in range(3))
    a, b = signal + sigma * noise_a, signal + sigma * (noise_a if same_noise else noise_b)
    params, _ = probe.trainable_parameters(model)
    cos, _ = probe.gradient_cosines(
        model,
        lay,
        {"signal": signal},
        {"oracle": (a + b) / 2},
        list(torch.arange(n).split(rows)),
        params,
        micro_batch_size=rows,
        halves=(a, b),
    )
    raw = cos["credits"]["signal"]["oracle"]
    c = probe.noise_ceiling(cos["split_half"], {"signal": raw}, raw)
    return (
        c["credits"]["signal"]["mean"],
        probe.mean_and_stderr(raw)[0],
        c["reliability"]["split_half"]["mean"],
    )


def test_noise_ceiling_recovers_the_signal_and_not_when_the_halves_share_their_noise(model):
    """A*_x = S + sigma n_x: with independent n_a, n_b the corrected cos(g(S), g*) is ~1 and the raw one
    clearly lower; with n_a = n_b (the model's assumption broken) the halves agree perfectly (r_half 1),
    so nothing is corrected and the cosine stays low: the check can fail."""
    corrected, raw, r_half = _ceiling_on(model, 8, 12, 12, 1.0, same_noise=False)
    assert corrected > 0.95 and raw < 0.88 and corrected - raw > 0.1 and 0.3 < r_half < 0.7
    corrected, raw, r_half = _ceiling_on(model, 8, 12, 12, 1.0, same_noise=True)
    assert r_half == pytest.approx(1.0) and corrected == pytest.approx(raw) and corrected < 0.85


def test_noise_ceiling_of_high_dimensional_vectors_matches_the_model():
    """g_x = g_true + n_x in 50,000 dimensions (|g_true|^2 = 1, E|n_x|^2 = 1.5): r_half -> 1 / 2.5,
    r_K -> 1 / 1.75, cos(g_true, g*) -> sqrt(r_K), and its corrected value -> 1."""
    g = torch.Generator().manual_seed(0)
    d, batches = 50_000, 4
    split, raw = [], []
    for _ in range(batches):
        true = torch.randn(d, generator=g) / math.sqrt(d)
        n_a, n_b = (torch.randn(d, generator=g) * math.sqrt(1.5 / d) for _ in range(2))
        split.append(probe.cosine(true + n_a, true + n_b))
        raw.append(probe.cosine(true, true + (n_a + n_b) / 2))
    c = probe.noise_ceiling(split, {"true": raw}, raw)
    assert c["reliability"]["split_half"]["mean"] == pytest.approx(1 / 2.5, abs=0.02)
    assert c["reliability"]["full_k"]["mean"] == pytest.approx(1 / 1.75, abs=0.02)
    assert probe.mean_and_stderr(raw)[0] == pytest.approx(math.sqrt(1 / 1.75), abs=0.02)
    assert c["credits"]["true"]["mean"] == pytest.approx(1.0, abs=0.02)
    assert c["headroom_corrected"]["mean"] == pytest.approx(0.0, abs=0.02)


def _hand_oracle(k, half=None):
    """A ProbeOracle of the layout's 6 rows, 3 problems of 2 rows, A* and (optionally) its halves given."""
    from tokencredit.oracle import OracleCost, OracleCredit

    mask = torch.ones(N, T, dtype=torch.bool)
    mask[1, 4:] = False
    adv = torch.where(mask, _credit(6) if half is None else half.mean(0), 0.0)
    zero = torch.zeros(N, T)
    credit = OracleCredit(
        advantages=adv,
        stderr=zero,
        mask=mask,
        skipped=torch.zeros_like(mask),
        bound=zero,
        values=torch.zeros(N, T + 1),
        value_stderr=torch.zeros(N, T + 1),
        known=torch.zeros(N, T + 1, dtype=torch.bool),
        rewards=torch.zeros(N),
        cost=OracleCost(),
        half_advantages=half,
    )
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    return probe.ProbeOracle(torch.arange(N), credit, torch.full((N,), -1), groups=groups)


def _method(credit):
    from types import SimpleNamespace

    return SimpleNamespace(credit=SimpleNamespace(effective=lambda: credit), reason="")


def test_gradient_fidelity_split_half_columns_and_odd_k(model, layout):
    half = torch.stack([_credit(6) + 0.5 * _credit(7), _credit(6) + 0.5 * _credit(8)])  # a signal plus noise
    got = {"m": _method(_credit(9))}
    grpo = _method(torch.ones(N, T))
    cfg = probe.ProbeConfig(oracle_k=4, grad_batches=3)
    res = probe.gradient_fidelity(model, layout, _hand_oracle(4, half), got, grpo, cfg)
    rel = res["reliability"]
    assert rel["status"] == "ok" and rel["k_half"] == 2 and rel["undefined_batches"] == []
    params, _ = probe.trainable_parameters(model)
    mask = layout.response_mask
    for i, rows in enumerate(([0, 1], [2, 3], [4, 5])):
        sub = _rows_layout(layout, rows)
        g_a, g_b = (probe.policy_gradient(model, sub, torch.where(mask, h, 0.0)[rows], params) for h in half)
        assert rel["split_half"]["per_batch"][i] == pytest.approx(probe.cosine(g_a, g_b), abs=1e-6)
    assert rel["full_k"]["per_batch"] == pytest.approx(
        [probe.spearman_brown(r) for r in rel["split_half"]["per_batch"]]
    )
    corrected = res["credits"]["m"]["cos_oracle_corrected"]
    want = [
        probe.disattenuated(c, r)[0]
        for c, r in zip(res["credits"]["m"]["cos_oracle"]["per_batch"], rel["full_k"]["per_batch"])
    ]
    assert corrected["per_batch"] == pytest.approx(want)
    row = probe.with_gradient_columns({"methods": {"m": {}}}, res)["methods"]["m"]
    assert (
        row["grad_cos_oracle_corrected"] == corrected["mean"]
        and row["grad_cos_oracle_corrected_se"] == corrected["se"]
    )
    # K odd: no ceiling, the reason instead, every other number the same
    odd = probe.gradient_fidelity(
        model, layout, _hand_oracle(3, half), got, grpo, probe.ProbeConfig(oracle_k=3, grad_batches=3)
    )
    assert odd["reliability"] == {"status": "n/a", "reason": odd["reliability"]["reason"]}
    assert "K = 3 is odd" in odd["reliability"]["reason"] and "headroom_corrected" not in odd
    assert "cos_oracle_corrected" not in odd["credits"]["m"] and odd["headroom"] == res["headroom"]
    assert odd["credits"]["m"]["cos_oracle"] == res["credits"]["m"]["cos_oracle"]
    assert (
        "grad_cos_oracle_corrected"
        not in probe.with_gradient_columns({"methods": {"m": {}}}, odd)["methods"]["m"]
    )
    assert "No noise correction: K = 3 is odd" in probe.gradient_line(odd)
    assert res["backward_passes"] == odd["backward_passes"] + 2 * 3  # two more passes per batch, no more


def _rows_layout(layout, rows):
    return PromptResponseLayout(
        *(t[rows] for t in (layout.prompt_ids, layout.prompt_mask, layout.response_ids, layout.response_mask))
    )


def test_oracle_halves_on_a_toy_probe_leave_a_star_unchanged():
    """The probe's oracle with the ceiling (K even, gradients on) gives the same A* as without, bit for bit,
    and A* = (A*_a + A*_b) / 2 to 1e-6 (A* is linear in the value means; skipped positions 0 in all)."""
    from tokencredit import models

    model, tok = models.load_model("toy")
    kw = dict(
        groups=3,
        group_size=4,
        seed=0,
        max_new_tokens=None,
        random_draws=1,
        batch_size=64,
        ks="1",
        model="toy",
        oracle=4,
    )
    on, off = (probe.probe_config(None, None, grad_batches=b, **kw) for b in (2, 0))
    assert probe.split_halves(on) and not probe.split_halves(off)
    problems = probe.probe_problems(on)
    ro = probe.sample_rollouts(model, tok, problems, on)
    rows = [problems[int(i)] for i in ro.prompt_index]
    every = torch.ones(len(rows), dtype=torch.bool)
    a, b = (probe.run_oracle(model, tok, ro, rows, probe.checker_reward, every, c) for c in (on, off))
    assert b.credit.half_advantages is None
    assert torch.equal(a.credit.advantages, b.credit.advantages) and torch.equal(
        a.credit.stderr, b.credit.stderr
    )
    half = a.credit.half_advantages
    assert half.shape == (2, *a.credit.advantages.shape) and half.dtype == torch.float32
    torch.testing.assert_close(half.mean(0), a.credit.advantages, rtol=0, atol=1e-6)
    assert not bool(half[:, ~a.credit.mask | a.credit.skipped].any()) and bool(a.credit.skipped.any())
    assert not torch.equal(half[0], half[1])


def test_cli_noise_ceiling_keys(toy_runs):
    data, md = toy_runs["on"]
    grads = data["points"][0]["oracle"]["gradients"]
    rel = grads["reliability"]
    assert rel["status"] == "ok" and rel["k_half"] == 1  # --oracle 2: halves of one continuation each
    for part in ("split_half", "full_k"):
        assert set(rel[part]) == {"mean", "se", "per_batch"} and len(rel[part]["per_batch"]) == 2
    assert rel["full_k"]["per_batch"] == pytest.approx(
        [probe.spearman_brown(r) for r in rel["split_half"]["per_batch"]]
    )
    head = grads["headroom_corrected"]
    assert set(head) == {"mean", "se", "per_batch", "capped"} and len(head["per_batch"]) == 2
    for name, row in data["points"][0]["oracle"]["methods"].items():
        if name in grads["credits"]:
            c = grads["credits"][name]["cos_oracle_corrected"]
            assert (
                row["grad_cos_oracle_corrected"] == c["mean"]
                and row["grad_cos_oracle_corrected_se"] == c["se"]
            )
            assert all(x is None or -1.0 <= x <= 1.0 for x in c["per_batch"])
    assert "split-half reliability of g*" in md and 'Noise-corrected (column "corrected")' in md


# ------------------------------------------------------------------------ expected gradients (cross-batch)
def test_gradient_cosines_keeps_the_dot_products_of_every_pair_of_batches(model, layout):
    params, _ = probe.trainable_parameters(model)
    star, uniform, other = _credit(0), torch.ones(N, T), _credit(1)
    batches = [torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([4, 5])]
    refs = {"oracle": star, "grpo": uniform}
    cos, passes = probe.gradient_cosines(
        model,
        layout,
        {"other": other, "grpo": uniform},
        refs,
        batches,
        params,
        micro_batch_size=N,
        grams=True,
    )
    plain, plain_passes = probe.gradient_cosines(
        model, layout, {"other": other, "grpo": uniform}, refs, batches, params, micro_batch_size=N
    )
    assert "grams" not in plain and plain_passes == passes  # keeping the gradients costs no pass
    assert cos["credits"] == plain["credits"]
    g_other = [probe.policy_gradient(model, _rows_layout(layout, b), other[b], params) for b in batches]
    g_star = [probe.policy_gradient(model, _rows_layout(layout, b), star[b], params) for b in batches]
    got = cos["grams"]["credits"]["other"]
    for i in range(3):
        for j in range(3):
            assert got["self"][i][j] == pytest.approx(
                float(g_other[i].double() @ g_other[j].double()), rel=1e-5
            )
            assert got["oracle"][i][j] == pytest.approx(
                float(g_other[i].double() @ g_star[j].double()), rel=1e-5
            )
    # a credit equal to a reference (GRPO's) keeps the reference's gradients: the same dot products
    assert cos["grams"]["credits"]["grpo"] == cos["grams"]["references"]["grpo"]


def test_gradient_fidelity_reports_expected_gradients_and_n_a_over_the_memory_limit(
    model, layout, monkeypatch
):
    got = {"m": _method(_credit(9))}
    grpo = _method(torch.ones(N, T))
    cfg = probe.ProbeConfig(oracle_k=4, grad_batches=3)
    res = probe.gradient_fidelity(model, layout, _hand_oracle(4), got, grpo, cfg)
    e = res["expected"]
    assert e["status"] == "ok" and e["batches"] == 3 and set(e["credits"]) == {"m"}
    assert set(e["references"]) == {"oracle", "grpo"} and set(e["grams"]["credits"]) == {"m"}
    star = e["references"]["oracle"]["cos_oracle"][
        "mean"
    ]  # random credits: the batches may share no direction
    assert star is None or star == pytest.approx(1.0)
    grams = e["grams"]["references"]["oracle"]
    assert grams["self"] == grams["oracle"] and len(grams["self"]) == 3  # A* with itself: one matrix
    json.dumps(e)  # the payload, Gram matrices included, is plain JSON
    lines = probe.expected_table(e)
    assert any(line.startswith("| m | ") for line in lines) and "Expected headroom" in "\n".join(lines)
    monkeypatch.setattr(gradients_module, "EXPECTED_MAX_BYTES", 0)
    off = probe.gradient_fidelity(model, layout, _hand_oracle(4), got, grpo, cfg)
    assert off["expected"]["status"] == "n/a" and "GiB" in off["expected"]["reason"]
    assert off["credits"] == res["credits"]  # everything else unchanged
    assert probe.expected_table(off["expected"])[-1].startswith("Expected gradients: n/a")
    assert probe.expected_table({}) == []  # a result from before the analysis existed

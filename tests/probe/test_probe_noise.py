"""The probe measures what trains: training-sized credit batches, the noise decomposition from two groups
per problem (`tokencredit.probe.noise`), and AdamW's preconditioned metric (`tokencredit.probe.precondition`)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import tiny_qwen3
from tokencredit import cli, probe
from tokencredit.batch import RolloutBatch
from tokencredit.columns import resolve_methods
from tokencredit.errors import ConfigError
from tokencredit.probe import gradients as gr
from tokencredit.probe import noise as nz
from tokencredit.probe import precondition as pc
from tokencredit.probe.score import method_credits, training_batches
from tokencredit.rollout import PromptResponseLayout


# ---------------------------------------------------------------------------- the decomposition's maths
def _block_sums(ga, gb, blocks, mc=None):
    """Per-block sums and the [B, B] Gram of H_b, by hand from per-problem vectors ga, gb [X, P]."""
    h = (ga + gb) / 2
    out, hs = [], []
    for block in blocks:
        idx = torch.tensor(block, dtype=torch.long)
        d = ((ga[idx] ** 2).sum() + (gb[idx] ** 2).sum()) / 2
        blk = {"n": float(len(idx)), "d": float(d), "w": float((ga[idx] * gb[idx]).sum())}
        blk["hh"] = float((h[idx] ** 2).sum())
        if mc is not None:
            blk["mc"] = float(((mc[0][idx] ** 2).sum() + (mc[1][idx] ** 2).sum()) / 8)
        out.append(blk)
        hs.append(h[idx].sum(0))
    gram = [[float(a.double() @ b.double()) for b in hs] for a in hs]
    return out, gram


def _draw(x, p, signal, between, within, seed):
    """g_xc = s + u_x + e_xc: |s|^2 = signal, E|u|^2 = between, E|e|^2 = within (Gaussian coordinates)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(p, generator=g)
    s *= math.sqrt(signal) / s.norm()
    u = torch.randn(x, p, generator=g) * math.sqrt(between / p)
    e = torch.randn(2, x, p, generator=g) * math.sqrt(within / p)
    return s, u, s + u + e[0], s + u + e[1]


@pytest.mark.parametrize("parts", [(1.0, 3.0, 6.0), (0.5, 0.0, 9.5), (2.0, 6.0, 2.0)])
def test_decomposition_recovers_known_signal_between_and_within(parts):
    x, p, b = 300, 1500, 15
    signal, between, within = parts
    _, _, ga, gb = _draw(x, p, signal, between, within, seed=1)
    blocks = [r.tolist() for r in torch.arange(x).tensor_split(b)]
    sums, gram = _block_sums(ga, gb, blocks)
    got = nz.decomposition(sums, gram, batch_problems=8)
    total = sum(parts)
    assert got["problems"] == x and got["blocks"] == b
    for name, value in zip(("signal", "between", "within"), parts):
        share = got["shares"][name]
        assert share["mean"] == pytest.approx(value / total, abs=max(0.03, 4 * share["se"]))
        assert share["se"] is not None and share["se"] < 0.05
    assert sum(got["shares"][k]["mean"] for k in ("signal", "between", "within")) == pytest.approx(1.0)
    assert got["moments"]["mean_square"]["mean"] == pytest.approx(total, rel=0.05)
    assert "monte_carlo" not in got["shares"]
    s = got["shares"]["signal"]["mean"]
    assert got["batch_signal_share"]["mean"] == pytest.approx(8 * s / (1 + 7 * s))


def test_decomposition_monte_carlo_part_and_conditional_cosine():
    """A credit g* = g_true + (n_1 + n_2) / 2 from two halves: the Monte-Carlo part is E|n|^2 / 2 of E|g*|^2;
    a reference sharing the per-problem means has cos(E[g|x], E[r|x]) = 1 under a large within-problem noise,
    and one whose means are independent has 0."""
    x, p, b = 300, 1500, 15
    s, u, ta, tb = _draw(x, p, 0.5, 2.0, 1.5, seed=2)
    g = torch.Generator().manual_seed(3)
    halves = [torch.randn(2, x, p, generator=g) * math.sqrt(2.0 / p) for _ in range(2)]  # E|n_i|^2 = 2
    ga, gb = ta + (halves[0][0] + halves[1][0]) / 2, tb + (halves[0][1] + halves[1][1]) / 2
    delta = (halves[0][0] - halves[1][0], halves[0][1] - halves[1][1])
    blocks = [r.tolist() for r in torch.arange(x).tensor_split(b)]
    sums, gram = _block_sums(ga, gb, blocks, mc=delta)
    got = nz.decomposition(sums, gram)
    total = 0.5 + 2.0 + 1.5 + 1.0  # the full-K noise (n_1 + n_2) / 2 has E|.|^2 = 1, within the problem
    assert got["shares"]["monte_carlo"]["mean"] == pytest.approx(1.0 / total, abs=0.03)
    assert got["shares"]["within"]["mean"] == pytest.approx(2.5 / total, abs=0.05)
    # a reference with the same per-problem means and ten times the within-problem noise
    noisy = torch.randn(2, x, p, generator=g) * math.sqrt(15.0 / p)
    ref, _ = _block_sums(s + u + noisy[0], s + u + noisy[1], blocks)
    cross = [
        ((ga[i] * (s + u + noisy[1])[i]).sum() + (gb[i] * (s + u + noisy[0])[i]).sum()) / 2
        for i in map(torch.tensor, blocks)
    ]
    for blk, c in zip(sums, cross):
        blk["cross_ref"] = float(c)
    same = nz.conditional_cosine(sums, ref, "ref")
    assert same["mean"] == pytest.approx(1.0, abs=0.08) and same["se"] is not None
    # per-problem means independent of the credit's (no shared signal either): cosine 0
    v = torch.randn(x, p, generator=g) * math.sqrt(2.0 / p)
    other, _ = _block_sums(v + noisy[0], v + noisy[1], blocks)
    for blk, i in zip(sums, map(torch.tensor, blocks)):
        blk["cross_other"] = float(
            ((ga[i] * (v + noisy[1])[i]).sum() + (gb[i] * (v + noisy[0])[i]).sum()) / 2
        )
    assert nz.conditional_cosine(sums, other, "other")["mean"] == pytest.approx(0.0, abs=0.1)


def test_paired_difference_recovers_a_known_gap_and_is_tighter_than_two_separate_ses():
    """A credit and a reference with the same per-problem means, the reference's within-problem noise the
    credit's plus as much again of its own (shared rollouts: correlated noises): within shares 2 / 6 and
    6 / 10, a gap of -0.267 that the paired jackknife measures with a smaller SE than the two SEs combined."""
    x, p, b = 300, 1500, 15
    s, u, ga, gb = _draw(x, p, 1.0, 3.0, 2.0, seed=4)
    g = torch.Generator().manual_seed(5)
    extra = torch.randn(2, x, p, generator=g) * math.sqrt(4.0 / p)
    blocks = [r.tolist() for r in torch.arange(x).tensor_split(b)]
    sums, gram = _block_sums(ga, gb, blocks)
    ref, ref_gram = _block_sums(ga + extra[0], gb + extra[1], blocks)
    got = nz.paired_difference(sums, gram, ref, ref_gram, batch_problems=8)
    one, other = (
        nz.decomposition(sums, gram, batch_problems=8),
        nz.decomposition(ref, ref_gram, batch_problems=8),
    )
    within = got["within"]
    assert within["mean"] == pytest.approx(2 / 6 - 6 / 10, abs=max(0.03, 4 * within["se"]))
    assert within["mean"] == pytest.approx(
        one["shares"]["within"]["mean"] - other["shares"]["within"]["mean"]
    )
    separate = math.hypot(one["shares"]["within"]["se"], other["shares"]["within"]["se"])
    assert 0 < within["se"] < separate
    batch = got["batch_signal_share"]
    assert batch["problems"] == 8
    assert batch["mean"] == pytest.approx(
        one["batch_signal_share"]["mean"] - other["batch_signal_share"]["mean"]
    )
    assert batch["mean"] > 0  # less within-problem noise: a larger share of signal in a batch
    # a credit against itself: zero, exactly
    same = nz.paired_difference(sums, gram, sums, gram)
    assert same["within"]["mean"] == 0.0 and "batch_signal_share" not in same


def test_decomposition_undefined_cases():
    assert nz.decomposition([{"n": 1.0, "d": 1.0, "w": 0.0, "hh": 1.0}], [[1.0]])["shares"]["signal"] == {
        "mean": None,
        "se": None,
    }
    zero = [{"n": 2.0, "d": 0.0, "w": 0.0, "hh": 0.0}] * 3
    assert nz.decomposition(zero, [[0.0] * 3] * 3)["shares"]["within"]["mean"] is None
    assert nz.batch_signal_share(None, 8) is None and nz.batch_signal_share(0.5, 1) == pytest.approx(0.5)


# ---------------------------------------------------------------------------- the per-problem gradients
VOCAB, P, T = 40, 4, 5


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3(VOCAB, seed=0, max_position_embeddings=32, tie_word_embeddings=False).eval()


def _sub(layout, rows):
    fields = (layout.prompt_ids, layout.prompt_mask, layout.response_ids, layout.response_mask)
    return PromptResponseLayout(*(t[rows] for t in fields))


def _layout(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(n, T, dtype=torch.bool)
    mask[1, 3:] = False
    return PromptResponseLayout(
        torch.randint(2, VOCAB, (n, P), generator=g),
        torch.ones(n, P, dtype=torch.bool),
        torch.randint(2, VOCAB, (n, T), generator=g),
        mask,
    )


def test_problem_sums_match_the_explicit_per_group_gradients(model):
    """3 problems x 2 groups x 2 rows (problem 2 has no row: zeros); every block sum against the gradients
    of each group's rows computed one by one, raw and in a weighted metric."""
    layout = _layout(8)
    problems = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    copies = torch.tensor([0, 1, 0, 1, 1, 1, 0, 0])
    gen = torch.Generator().manual_seed(4)
    credit, oracle, grpo = (torch.randn(8, T, generator=gen) for _ in range(3))
    halves = (
        oracle + 0.3 * torch.randn(8, T, generator=gen),
        oracle - 0.2 * torch.randn(8, T, generator=gen),
    )
    params, _ = probe.trainable_parameters(model)
    weight = torch.rand(sum(p.numel() for p in params), generator=gen) + 0.5
    blocks = [[0], [1, 2]]
    sums, passes = gr.problem_sums(
        model,
        layout,
        {"c": credit, "same": grpo.clone()},
        {"oracle": oracle, "grpo": grpo},
        problems,
        copies,
        blocks,
        params,
        weights={"raw": None, "w": weight},
        micro_batch_size=8,
        halves=halves,
    )
    # per problem with rows, one pass per group of: 2 references, the halves' difference, "c" ("same" reuses)
    assert passes == 2 * (2 * 4)

    cache = {}

    def g(c, x, copy):
        key = (id(c), x, copy)
        if key not in cache:
            cache[key] = _g(c, x, copy)
        return cache[key]

    def _g(c, x, copy):
        full = torch.where(((problems == x) & (copies == copy))[:, None], c, 0.0)
        return probe.policy_gradient(model, layout, full, params, micro_batch_size=8)

    for metric, w in (("raw", None), ("w", weight)):

        def dot(a, b, w=w):
            return float((a.double() * (1.0 if w is None else w.double())) @ b.double())

        for name, c in (("c", credit), ("same", grpo)):
            got = sums[metric]["credits"][name]
            for k, block in enumerate(blocks):
                want = {"n": 0.0, "d": 0.0, "w": 0.0, "hh": 0.0, "cross_oracle": 0.0}
                for x in block:
                    want["n"] += 1
                    if x == 2:
                        continue
                    ga, gb = g(c, x, 0), g(c, x, 1)
                    oa, ob = g(oracle, x, 0), g(oracle, x, 1)
                    want["d"] += (dot(ga, ga) + dot(gb, gb)) / 2
                    want["w"] += dot(ga, gb)
                    want["hh"] += dot((ga + gb) / 2, (ga + gb) / 2)
                    want["cross_oracle"] += (dot(ga, ob) + dot(gb, oa)) / 2
                for key, value in want.items():
                    assert got[k][key] == pytest.approx(value, rel=1e-4, abs=1e-6 * (1 + abs(want["d"])))
        # the oracle's Monte-Carlo part: |g(A*_1 - A*_2)_xc|^2 / 4, averaged over c
        diff = halves[0] - halves[1]
        mc = sum((dot(g(diff, 0, c), g(diff, 0, c))) for c in (0, 1)) / 8
        assert sums[metric]["references"]["oracle"][0]["mc"] == pytest.approx(mc, rel=1e-4)


def test_problem_blocks_place_every_problem():
    problems = torch.tensor([1, 1, 3, 4, 4])
    batches = [torch.tensor([0, 1]), torch.tensor([2, 3, 4])]
    assert gr.problem_blocks(problems, batches, 6) == [[0, 1], [2, 3, 4, 5]]


# ---------------------------------------------------------------------------- AdamW's metric
def test_preconditioner_from_a_real_adamw_state_by_hand():
    lin = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(lin.parameters(), lr=0.1, betas=(0.9, 0.99))
    grads = []
    for _ in range(3):
        gw, gb = torch.randn(2, 3), torch.randn(2)
        lin.weight.grad, lin.bias.grad = gw.clone(), gb.clone()
        opt.step()
        grads.append(torch.cat([gw.reshape(-1), gb]))
    state = {"model": {n: p.detach() for n, p in lin.named_parameters()}, "optimizer": opt.state_dict()}
    moments = pc.read_adam_moments(state, "checkpoint step 3")
    assert isinstance(moments, pc.AdamMoments) and moments.step == 3
    names = ["weight", "bias"]
    pre = pc.from_moments(moments, names, [lin.weight.shape, lin.bias.shape])
    assert isinstance(pre, pc.Preconditioner) and pre.source == "run"
    v = torch.zeros(8, dtype=torch.float64)
    for gr_ in grads:  # v_t = beta2 v + (1 - beta2) g^2, bias-corrected by 1 - beta2^t
        v = 0.99 * v + 0.01 * gr_.double() ** 2
    want = 1.0 / ((v / (1 - 0.99**3)).sqrt() + 1e-8)
    torch.testing.assert_close(pre.scale.double(), want, rtol=1e-5, atol=0)
    # a weighted dot is the dot of the rescaled vectors, and the Gram's cosine is theirs
    a, b = torch.randn(8), torch.randn(8)
    s = pre.scale
    assert gr._dot(a, b, s.square()) == pytest.approx(float((a * s).double() @ (b * s).double()), rel=1e-6)
    # θ that is not what the optimizer stepped, or a state before any step: a reason, not a number
    assert isinstance(pc.from_moments(moments, ["weight"], [lin.weight.shape]), str)
    assert isinstance(pc.from_moments(moments, ["bias", "weight"], [lin.bias.shape, (3, 2)]), str)
    fresh = torch.optim.AdamW(lin.parameters())
    assert "no second moments" in pc.read_adam_moments(
        {"model": state["model"], "optimizer": fresh.state_dict()}, "x"
    )


def test_standin_preconditioner_by_hand():
    sum_sq = torch.tensor([4.0, 0.0, 16.0])
    pre = pc.standin_moments(sum_sq, 4, "no run")
    assert pre.source == "stand-in" and "no run" in pre.description
    torch.testing.assert_close(pre.scale.double(), 1.0 / (torch.tensor([1.0, 0.0, 2.0]).double() + 1e-8))


def test_gradient_cosines_preconditioned_grams_equal_those_of_rescaled_gradients(model):
    layout = _layout(6, seed=5)
    params, _ = probe.trainable_parameters(model)
    gen = torch.Generator().manual_seed(6)
    refs = {"oracle": torch.randn(6, T, generator=gen), "grpo": torch.randn(6, T, generator=gen)}
    credits = {"c": torch.randn(6, T, generator=gen)}
    batches = [torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([4, 5])]
    seen = {}

    def precondition(sum_sq, n):
        seen["sum_sq"], seen["n"] = sum_sq, n
        return pc.standin_moments(sum_sq, n, "test")

    cos, _ = probe.gradient_cosines(
        model, layout, credits, refs, batches, params, grams=True, preconditioner=precondition
    )
    pre = cos["preconditioner"]
    g_grpo = [probe.policy_gradient(model, _sub(layout, b), refs["grpo"][b], params) for b in batches]
    tokens = [int(layout.response_mask[b].sum()) for b in batches]
    want = sum((g / n).double() ** 2 for g, n in zip(g_grpo, tokens))
    torch.testing.assert_close(seen["sum_sq"], want, rtol=1e-4, atol=1e-12 * float(want.max()))
    assert seen["n"] == 3
    gc = [probe.policy_gradient(model, _sub(layout, b), credits["c"][b], params) for b in batches]
    got = cos["grams_preconditioned"]["credits"]["c"]
    s = pre.scale
    for i in range(3):
        for j in range(3):
            want_ij = float((gc[i] * s).double() @ (gc[j] * s).double())
            assert got["self"][i][j] == pytest.approx(want_ij, rel=1e-4)
            assert got["grpo"][i][j] == pytest.approx(
                float((gc[i] * s).double() @ (g_grpo[j] * s).double()), rel=1e-4
            )


# ---------------------------------------------------------------------------- training-sized credit batches
def _entropy_batch(groups=4, g=4, t=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    n = groups * g
    scores = torch.tensor([1.0, 0.0] * (n // 2))
    # the groups' entropies live on different scales, so a batch-wide quantile differs from each half's
    scale = torch.arange(1, groups + 1).repeat_interleave(g).float()[:, None]
    return RolloutBatch(
        torch.randint(0, 9, (n, t), generator=gen),
        torch.ones(n, t, dtype=torch.bool),
        torch.arange(groups).repeat_interleave(g),
        scores,
        entropy=torch.rand(n, t, generator=gen) * scale,
        old_log_probs=-torch.rand(n, t, generator=gen),
        hidden=torch.randn(n, t, 3, generator=gen) * scale[..., None],
    )


def test_training_batches_cut_whole_groups_and_each_copy_apart():
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
    got = training_batches(groups, 2)
    assert [b.tolist() for b in got] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [b.tolist() for b in training_batches(groups, 0)] == [list(range(10))]
    assert [b.tolist() for b in training_batches(groups, 8)] == [list(range(10))]
    pairs = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])  # problems 0, 1: groups 2p + copy
    copies = pairs % 2
    assert [b.tolist() for b in training_batches(pairs, 2, copies)] == [[0, 1, 4, 5], [2, 3, 6, 7]]


@pytest.mark.parametrize("name", ["entropy-80-20", "delta", "strace"])
def test_batch_statistic_credit_is_the_training_batch_s(name):
    """A batch-statistic method's probe credit equals the credit computed on each training-sized batch on its
    own, and differs from the whole set's on a batch whose groups' entropies (hidden states) differ in scale."""
    batch = _entropy_batch()
    spec = resolve_methods([name])
    batches = training_batches(batch.group_ids, 2)
    assert len(batches) == 2
    chunked = method_credits(batch, spec, batches=batches)[name].credit
    whole = method_credits(batch, spec)[name].credit
    assert chunked is not None and whole is not None
    for rows in batches:
        alone = method_credits(batch.select(rows), spec)[name].credit
        assert alone is not None
        torch.testing.assert_close(chunked.effective()[rows], alone.effective())
        torch.testing.assert_close(chunked.token_advantages[rows], alone.token_advantages)
    assert not torch.allclose(chunked.effective(), whole.effective())
    # a per-group method is the same either way
    grpo = resolve_methods(["grpo"])
    torch.testing.assert_close(
        method_credits(batch, grpo, batches=batches)["grpo"].credit.effective(),
        method_credits(batch, grpo)["grpo"].credit.effective(),
    )


# ---------------------------------------------------------------------------- the command line
def test_cli_two_groups_noise_and_preconditioned_sections(tmp_path):
    out = tmp_path / "p.json"
    args = ["--model", "toy", "--groups", "3", "--group-size", "3", "--oracle", "2", "--grad-batches", "3"]
    args += ["--two-groups", "--prompts-per-step", "2", "--methods", "grpo,entropy-80-20", "--threads", "1"]
    args += ["--random-draws", "1", "--bootstrap", "0"]
    assert cli.main(["probe", "--out", str(out), *args]) == 0
    data, md = json.loads(out.read_text()), out.with_suffix(".md").read_text()
    assert data["command"].endswith("--two-groups --prompts-per-step 2")
    assert data["config"]["two_groups"] and data["config"]["prompts_per_step"] == 2
    pt = data["points"][0]
    # 3 problems x 2 groups of 3: each copy's groups cut in batches of 2 problems
    assert pt["rollouts"]["rollouts"] == 18
    assert pt["credit_batches"] == {
        "prompts_per_step": 2,
        "source": "--prompts-per-step",
        "batches": 4,
        "rollouts_per_batch": [6, 3, 6, 3],
    }
    grads = pt["oracle"]["gradients"]
    pre = grads["preconditioned"]
    assert pre["status"] == "ok" and pre["preconditioner"]["source"] == "stand-in"
    assert "not a training run" in pre["preconditioner"]["description"]
    assert set(pre["credits"]) == {"grpo", "entropy-80-20"}
    noise = grads["noise"]
    assert noise["status"] == "ok" and noise["problems"] == 3 and noise["batch_problems"] == 2
    for metric in ("raw", "adamw"):
        for part in ("credits", "references"):
            for name, d in noise["metrics"][metric][part].items():
                shares = d["shares"]
                if shares["signal"]["mean"] is not None:
                    total = sum(shares[k]["mean"] for k in ("signal", "between", "within"))
                    assert total == pytest.approx(1.0), (metric, name)
        star = noise["metrics"][metric]["references"]["oracle"]
        assert "monte_carlo" in star["shares"] and star["cos_given_x"]["oracle"]["mean"] in (
            None,
            pytest.approx(1.0),
        )
        # every credit's paired difference from GRPO; GRPO's own is exactly zero where defined
        grpo_vs = noise["metrics"][metric]["references"]["grpo"]["vs_grpo"]
        assert grpo_vs["within"]["mean"] in (None, 0.0) and grpo_vs["batch_signal_share"]["problems"] == 2
        assert set(star["vs_grpo"]) == {"within", "batch_signal_share"}
    assert "Credit computed per training batch of 2 problems (--prompts-per-step)" in md
    assert "In AdamW's preconditioned metric" in md and "| credit (AdamW's metric) | signal |" in md
    assert "| credit (raw gradients) | signal | between problems | within problem |" in md
    assert "signal share, batch of 2 | within vs GRPO | batch share vs GRPO |" in md


def test_config_errors_for_the_new_options():
    with pytest.raises(ConfigError, match="--two-groups .* needs --oracle K"):
        probe.probe_config(None, None, **_CFG, two_groups=True)
    with pytest.raises(ConfigError, match="--prompts-per-step must be >= 0"):
        probe.probe_config(None, None, **_CFG, prompts_per_step=-1)
    cfg = probe.probe_config(None, None, **_CFG)
    assert (cfg.prompts_per_step, cfg.prompts_per_step_source) == (
        8,
        "the trainer's default rollout.prompts_per_step",
    )
    assert not cfg.two_groups and cfg.record()["prompts_per_step"] == 8


_CFG = dict(groups=4, group_size=4, seed=0, max_new_tokens=None, random_draws=2, batch_size=8, ks="1,3")

"""Eligibility-trace kernels (docs/spec/strace.md): worked-example vectors, autograd credit, long-T stability, equivalences."""

from __future__ import annotations

import math

import pytest
import torch

from tokencredit.batch import RolloutBatch
from tokencredit.credit.entropy import proximal_entropy, top_entropy_mask
from tokencredit.errors import ConfigError
from tokencredit.objectives import (
    KERNELS,
    ObjectiveArgs,
    aggregate,
    causal_decay_filter,
    clipped_token_loss,
    policy_loss,
    trace_log_weights,
)
from tokencredit.objectives.kernels import prepare_kernel
from tokencredit.objectives.traces import kept_set
from tokencredit.recipes import get_recipe

L_SPEC = [0.02, -0.01, 0.05, 0.00]
H_SPEC = [2.1, 0.05, 1.3, 0.02]


def naive_trace(l_row, active_row, lam, normalized=True, decay="kept"):
    """The docs/spec/strace.md recursion, one token at a time in float64 (the reference)."""
    out = [0.0] * len(l_row)
    num = den = 0.0
    last = None
    for t, (x, a) in enumerate(zip(l_row, active_row)):
        if not a:
            continue
        f = 0.0 if last is None else lam ** (1 if decay == "kept" else t - last)
        num, den, last = f * num + x, f * den + 1.0, t
        out[t] = num / den if normalized else num
    return torch.tensor(out, dtype=torch.float64)


def spec_inputs():
    l = torch.tensor([L_SPEC], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    return l, mask


# ------------------------------------------------- docs/spec/strace.md#worked-example
def test_ptrace_vector():
    l, mask = spec_inputs()
    lw = trace_log_weights(l, mask, 0.5)
    assert torch.allclose(
        lw[0], torch.tensor([0.02, 0.0, 0.028571, 0.013333], dtype=torch.float64), atol=1e-6
    )
    assert torch.allclose(
        lw[0].exp(), torch.tensor([1.020201, 1.000000, 1.028983, 1.013422], dtype=torch.float64), atol=1e-6
    )


def test_gspo_value_is_normalised_trace_at_lambda_one():
    l, mask = spec_inputs()
    lw = trace_log_weights(l, mask, 1.0)
    assert lw[0, -1].item() == pytest.approx(0.015, abs=1e-12)
    assert math.exp(lw[0, -1].item()) == pytest.approx(1.015113, abs=1e-6)
    gspo = KERNELS["gspo"].fn(l, mask)
    assert torch.allclose(gspo, torch.full_like(gspo, 0.015))


def test_lambda_zero_and_accumulating_vectors():
    l, mask = spec_inputs()
    assert torch.allclose(trace_log_weights(l, mask, 0.0), l)
    acc = trace_log_weights(l, mask, 0.5, normalized=False)
    assert torch.allclose(acc[0], torch.tensor([0.02, 0.0, 0.05, 0.025], dtype=torch.float64), atol=1e-12)
    full_is = trace_log_weights(l, mask, 1.0, normalized=False)  # lambda = 1: prefix importance sampling
    assert torch.allclose(full_is, l.cumsum(-1))


def test_strace_kept_set_and_decays():
    l, mask = spec_inputs()
    keep = top_entropy_mask(torch.tensor([H_SPEC]), mask, keep_ratio=0.5, scope="sequence")
    assert keep.tolist() == [[True, False, True, False]]
    kept = trace_log_weights(l, mask, 0.5, keep=keep, decay="kept")
    assert torch.allclose(kept[0], torch.tensor([0.02, 0.0, 0.04, 0.0], dtype=torch.float64), atol=1e-12)
    assert torch.allclose(
        kept[0, [0, 2]].exp(), torch.tensor([1.020201, 1.040811], dtype=torch.float64), atol=1e-6
    )
    pos = trace_log_weights(l, mask, 0.5, keep=keep, decay="position")
    assert torch.allclose(pos[0], torch.tensor([0.02, 0.0, 0.044, 0.0], dtype=torch.float64), atol=1e-12)


def test_strace_kept_set_in_pepos_proximal_frame():
    """frame="proximal" ranks S-trace's kept set by PEPO's proximal entropy (recipe `strace-proximal`); the
    default frame is the raw entropy's, unchanged; a bad frame, window or temperature is one clear error."""
    gen = torch.Generator().manual_seed(3)
    ent = torch.rand(4, 12, generator=gen) * 2 + torch.tensor([[0.0], [3.0], [0.0], [1.0]])
    mask = torch.arange(12)[None] < torch.tensor([[12], [12], [7], [3]])
    batch = RolloutBatch(
        token_ids=torch.zeros(4, 12, dtype=torch.long),
        mask=mask,
        group_ids=torch.zeros(4, dtype=torch.long),
        scores=torch.tensor([1.0, 0.0, 1.0, 0.0]),
        entropy=ent,
    )
    raw = prepare_kernel("strace", batch, {})["keep"]
    assert torch.equal(raw, top_entropy_mask(ent, mask, 0.2))
    prox = prepare_kernel("strace", batch, {"frame": "proximal", "window": 5})["keep"]
    assert torch.equal(prox, top_entropy_mask(proximal_entropy(ent, mask, 5), mask, 0.2))
    assert int(raw[1].sum()) > int(prox[1].sum())  # row 1's entropies are shifted up by 3: only raw sees it
    recipe = get_recipe("strace-proximal")
    assert torch.equal(
        prepare_kernel("strace", batch, recipe.kernel_params)["keep"],
        kept_set(
            batch,
            **{
                k: v
                for k, v in recipe.kernel_params.items()
                if k in ("keep_ratio", "scope", "frame", "window")
            },
        )["keep"],
    )
    with pytest.raises(ConfigError, match="closest: proximal"):
        prepare_kernel("strace", batch, {"frame": "proximl"})
    with pytest.raises(ConfigError, match="closest: window"):
        prepare_kernel("strace", batch, {"windw": 5})
    for bad in ({"window": 0}, {"temperature": 0.0}):
        with pytest.raises(ConfigError, match="strace"):
            prepare_kernel("strace", batch, bad)


# ---------------------------------------------------------------- on-policy credit by autograd
PTRACE_CREDIT = [0.385714, 0.271429, 0.209524, 0.133333]


def test_ptrace_on_policy_credit_autograd():
    l = torch.zeros(1, 4, dtype=torch.float64, requires_grad=True)  # on-policy: every ratio is 1
    mask = torch.ones(1, 4, dtype=torch.bool)
    objective = trace_log_weights(l, mask, 0.5).exp().mean()  # token-mean of w_t * A, A = +1
    (grad,) = torch.autograd.grad(objective, l)
    assert torch.allclose(grad[0], torch.tensor(PTRACE_CREDIT, dtype=torch.float64), atol=1e-6)
    assert grad.sum().item() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize(
    ("kernel", "params", "expected"),
    [
        ("ptrace", {"lam": 0.5}, PTRACE_CREDIT),
        ("gspo", {}, [0.25, 0.25, 0.25, 0.25]),
        ("token", {}, [0.25, 0.25, 0.25, 0.25]),
    ],
)
def test_on_policy_credit_through_policy_loss(kernel, params, expected):
    old = torch.tensor([[-1.0, -0.5, -2.0, -0.3]], dtype=torch.float64)
    logp = old.clone().requires_grad_()
    mask = torch.ones(1, 4, dtype=torch.bool)
    args = ObjectiveArgs(kernel=kernel, kernel_args=params)
    loss, _ = policy_loss(logp, old, torch.ones(1, dtype=torch.float64), mask, args)
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.allclose(-grad[0], torch.tensor(expected, dtype=torch.float64), atol=1e-6)


def test_strace_on_policy_credit_with_kept_normalisation():
    mask = torch.ones(1, 4, dtype=torch.bool)
    keep = top_entropy_mask(torch.tensor([H_SPEC]), mask, keep_ratio=0.5, scope="sequence")
    # direct: |M|-normalised mean of w over the kept set
    l = torch.zeros(1, 4, dtype=torch.float64, requires_grad=True)
    w = trace_log_weights(l, mask, 0.5, keep=keep).exp()
    (grad,) = torch.autograd.grad((w * keep).sum() / keep.sum(), l)
    expected = torch.tensor([2 / 3, 0.0, 1 / 3, 0.0], dtype=torch.float64)
    assert torch.allclose(grad[0], expected, atol=1e-6)
    # through the objective: S-trace's loss terms live on the kept set only
    old = torch.tensor([[-1.0, -0.5, -2.0, -0.3]], dtype=torch.float64)
    logp = old.clone().requires_grad_()
    loss, _ = policy_loss(
        logp,
        old,
        torch.ones(1, dtype=torch.float64),
        mask,
        ObjectiveArgs(kernel="strace", kernel_args={"lam": 0.5, "keep": keep}),
    )
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.allclose(-grad[0], expected, atol=1e-6)


# ---------------------------------------------------------------- against the naive recursion
@pytest.mark.parametrize("decay", ["kept", "position"])
@pytest.mark.parametrize("normalized", [True, False])
def test_matches_naive_recursion_random(decay, normalized):
    g = torch.Generator().manual_seed(3)
    n, t = 4, 300
    l = torch.randn(n, t, generator=g, dtype=torch.float64) * 0.2
    mask = torch.rand(n, t, generator=g) > 0.1  # holes, not only right padding
    keep = torch.rand(n, t, generator=g) > 0.6
    for lam in (0.0, 0.3, 0.9, 0.99, 1.0):
        for kp in (None, keep):
            got = trace_log_weights(l, mask, lam, normalized=normalized, keep=kp, decay=decay)
            active = mask if kp is None else mask & kp
            for i in range(n):
                ref = naive_trace(l[i].tolist(), active[i].tolist(), lam, normalized, decay)
                assert torch.allclose(got[i], ref, atol=1e-10), (lam, kp is None, i)


def test_causal_decay_filter_multi_level_chunks():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 1000, generator=g, dtype=torch.float64)
    got = causal_decay_filter(x, 0.97, chunk=8)  # three levels of chunking
    for i in range(2):
        ref = naive_trace(x[i].tolist(), [True] * 1000, 0.97, normalized=False)
        assert torch.allclose(got[i], ref, atol=1e-10)


@pytest.mark.parametrize("lam", [0.01, 0.5, 0.95, 0.999, 1.0])
def test_stable_at_32k_tokens(lam):
    g = torch.Generator().manual_seed(1)
    n, t = 2, 32768
    l = (torch.randn(n, t, generator=g) * 0.3).requires_grad_()
    mask = torch.ones(n, t, dtype=torch.bool)
    mask[1, 30000:] = False
    keep = torch.rand(n, t, generator=g) > 0.8
    for kp in (None, keep):
        lw = trace_log_weights(l, mask, lam, keep=kp)
        assert lw.dtype == torch.float32 and bool(torch.isfinite(lw).all())
        (grad,) = torch.autograd.grad(lw.exp().sum(), l)
        assert bool(torch.isfinite(grad).all())
        active = mask if kp is None else mask & kp
        ref = naive_trace(l[0].detach().double().tolist(), active[0].tolist(), lam)
        assert torch.allclose(lw[0].double(), ref, atol=2e-5)  # the whole row, float32 vs float64
        assert bool((lw[1, 30000:] == 0).all())


# ---------------------------------------------------------------- properties
def test_partial_trust_region_property():
    """w_t of the normalised trace is a weighted geometric mean: inside [min, max] of the past ratios."""
    g = torch.Generator().manual_seed(5)
    l = torch.randn(3, 200, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 200, dtype=torch.bool)
    lw = trace_log_weights(l, mask, 0.9)
    assert bool((lw <= l.cummax(-1).values + 1e-12).all())
    assert bool((lw >= l.cummin(-1).values - 1e-12).all())


def test_masked_positions_zero_and_nan_padding_does_not_leak():
    l = torch.tensor([[0.1, -0.2, float("nan"), float("inf")]], requires_grad=True)
    mask = torch.tensor([[True, True, False, False]])
    for kernel in ("ptrace", "accumulating"):
        lw = KERNELS[kernel].fn(l, mask, lam=0.9)
        assert lw[0, 2:].tolist() == [0.0, 0.0] and bool(torch.isfinite(lw).all())
        (grad,) = torch.autograd.grad(lw.sum(), l)
        assert bool(torch.isfinite(grad).all()) and grad[0, 2:].tolist() == [0.0, 0.0]


def test_bf16_input_computed_in_float32():
    l = torch.tensor([L_SPEC], dtype=torch.bfloat16)
    lw = trace_log_weights(l, torch.ones(1, 4, dtype=torch.bool), 0.5)
    assert lw.dtype == torch.float32


def test_bad_configuration_errors():
    l, mask = spec_inputs()
    with pytest.raises(ConfigError, match="keep"):
        KERNELS["strace"].fn(l, mask, lam=0.5)
    with pytest.raises(ConfigError, match="lam"):
        trace_log_weights(l, mask, 1.5)
    with pytest.raises(ConfigError, match="decay"):
        trace_log_weights(l, mask, 0.5, decay="tokens")
    with pytest.raises(ValueError, match="mask shape"):
        trace_log_weights(l, mask[:, :3], 0.5)
    assert KERNELS["strace"].uses_keep and not KERNELS["ptrace"].uses_keep


# ---------------------------------------------------------------- equivalences through policy_loss
def random_rollouts(seed, n=6, t=12, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=g, dtype=torch.float64) * 3
    logp = (old + torch.randn(n, t, generator=g, dtype=torch.float64) * scale).requires_grad_()
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    adv = torch.randn(n, t, generator=g, dtype=torch.float64)
    entropy = torch.rand(n, t, generator=g, dtype=torch.float64) * 3
    return logp, old, adv, mask, entropy


def loss_and_grad(logp, old, adv, mask, **kw):
    loss, _ = policy_loss(logp, old, adv, mask, ObjectiveArgs(**kw))
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_lambda_zero_equals_per_token_ppo(seed, agg):
    logp, old, adv, mask, _ = random_rollouts(seed)
    common = dict(loss_params={"eps_low": 0.2, "eps_high": 0.28, "dual_clip": 3.0}, loss_agg_mode=agg)
    want = loss_and_grad(logp, old, adv, mask, kernel="token", **common)
    for kernel in ("ptrace", "accumulating"):
        got = loss_and_grad(logp, old, adv, mask, kernel=kernel, kernel_args={"lam": 0.0}, **common)
        assert torch.allclose(got[0], want[0], atol=1e-12) and torch.allclose(got[1], want[1], atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("decay", ["kept", "position"])
def test_keep_all_strace_equals_ptrace(seed, decay):
    logp, old, adv, mask, entropy = random_rollouts(seed)
    keep = top_entropy_mask(entropy, mask, keep_ratio=1.0)
    assert torch.equal(keep, mask)
    clip = {"eps_low": 0.2, "eps_high": 0.28}
    trace = {"lam": 0.95, "decay": decay}
    got = loss_and_grad(
        logp, old, adv, mask, loss_params=clip, kernel="strace", kernel_args={**trace, "keep": keep}
    )
    want = loss_and_grad(logp, old, adv, mask, loss_params=clip, kernel="ptrace", kernel_args=trace)
    assert torch.allclose(got[0], want[0], atol=1e-12) and torch.allclose(got[1], want[1], atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_gspo_kernel_equals_trace_at_last_token(seed):
    logp, old, adv, mask, _ = random_rollouts(seed, n=8, scale=4e-4)
    adv = adv[:, 0]  # GSPO: one advantage per response
    gspo = dict(loss_params={"eps_low": 3e-4, "eps_high": 4e-4}, loss_agg_mode="seq-mean-token-mean")
    want = loss_and_grad(logp, old, adv, mask, kernel="gspo", **gspo)

    # lambda = 1 normalised trace, read at each response's last valid token, given to all its tokens
    log_ratio = logp - old
    last = (mask.sum(-1) - 1).clamp(min=0)
    seq = trace_log_weights(log_ratio, mask, 1.0).gather(1, last[:, None])
    per_tok = clipped_token_loss(old + seq.expand_as(old), old, adv, mask, eps_low=3e-4, eps_high=4e-4)
    loss = aggregate(per_tok, mask, "seq-mean-token-mean")
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.allclose(loss.detach(), want[0], atol=1e-12)
    assert torch.allclose(grad, want[1], atol=1e-12)
    assert bool((grad != 0).any())  # some responses inside the clip range: the gradient check bites

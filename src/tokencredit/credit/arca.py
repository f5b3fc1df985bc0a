"""ARCA: adapter-residual credit assignment, and the salience baselines it is compared with (docs/spec/arca.md).

Paper: Lafuente-Mercado 2026, "ARCA: Adapter-Residual Credit Assignment When Token Signals
Degenerate", arXiv 2606.00257. Each completion gets token weights w_t >= 0 summing to 1 over
its valid tokens, from a raw salience score alpha_t >= 0 (`normalize_scores`):

| method             | alpha_t                                                   | signals             |
|--------------------|-----------------------------------------------------------|---------------------|
| arca               | ||h_t^adapted - h_t^base||_2, last hidden layer (LoRA)    | hidden, base_hidden |
| surprisal          | -log pi_old(y_t)                                          | old_log_probs       |
| entropy-reduction  | max(0, H_t - H_{t+1}); 0 at the last valid token          | entropy             |
| policy-divergence  | |log pi_old(y_t) - log pi_base(y_t)| (sampled token only) | old/base_log_probs  |

The paper's objective per completion is A_i * sum_t w_t log pi(y_t) (plain on-policy REINFORCE,
loss = -mean over completions). As a credit method we return Â[i,t] = A_i * T_i * w[i,t]
(`form="mean"`, T_i = number of valid tokens): each completion's mean Â is A_i, so Â plugs into
the clipped objectives like any other token advantage, and with the "reinforce" kernel and
seq-mean-token-mean aggregation the loss is exactly the paper's:
-(1/N) sum_i (1/T_i) sum_t A_i T_i w_t log pi = -(1/N) sum_i A_i sum_t w_t log pi.
`form="sum"` returns Â = A_i * w[i,t] (each completion's sum is A_i), which gives the same loss
with seq-mean-token-sum aggregation.

Differences from the released code (rodlaf/tokenweighting): the base hidden states come from one
adapter-disabled pass in eval mode (the release runs two extra passes with LoRA dropout on), and
the entropy drop at a completion's last valid token is 0 (the release compares it with the
entropy at the first padding position). `sharpening` = 1.0 is the paper's equation; the reported
runs used 2.0.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from tokencredit.batch import RolloutBatch
from tokencredit.credit.registry import register
from tokencredit.errors import ConfigError, closest

__all__ = [
    "FORMS",
    "SALIENCE",
    "entropy_reduction",
    "normalize_scores",
    "policy_divergence",
    "residual_norm",
    "salience_scores",
    "salience_weights",
    "surprisal",
    "weighted_advantages",
]

PAPER = "Lafuente-Mercado 2026, ARCA (arXiv 2606.00257)"
FORMS = ("mean", "sum")
_NORM_BLOCK = 1 << 20  # elements of [rows, T, H] upcast to float32 at once in residual_norm


def _zero(x: Tensor) -> Tensor:
    return torch.zeros((), dtype=x.dtype, device=x.device)


def _check_pair(a: Tensor, b: Tensor, names: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{names}: shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}")


def normalize_scores(scores: Tensor, mask: Tensor, sharpening: float = 1.0, eps: float = 1e-8) -> Tensor:
    """Salience scores alpha [N,T] (>= 0) -> token weights w [N,T], each row summing to 1 over valid tokens.

    w_t = (alpha_t + eps)^sharpening / sum_s (alpha_s + eps)^sharpening over the valid tokens s
    (docs/spec/arca.md#normalisation). A row whose sum is <= eps falls back to uniform 1/L over its L valid tokens; a row
    without a valid token is all zeros. Padding is exactly 0. Computed in float64; returns float32
    (float64 for float64 input), detached. Negative or non-finite scores on valid tokens are an error.
    """
    _check_pair(scores, mask, "normalize_scores: scores and mask")
    if not (sharpening >= 0.0 and sharpening < float("inf")):
        raise ConfigError(f"sharpening must be a finite number >= 0, got {sharpening}")
    m = mask.bool()
    s = scores.detach().double()
    bad = m & ~(torch.isfinite(s) & (s >= 0))
    if bool(bad.any()):
        i, j = (int(x) for x in bad.nonzero()[0])
        raise ValueError(
            f"normalize_scores: salience scores must be finite and >= 0 on valid tokens; "
            f"rollout {i}, token {j} has {float(s[i, j])} ({int(bad.sum())} bad in all)"
        )
    s = torch.where(m, s, _zero(s))
    powered = torch.where(m, (s + eps).pow(sharpening).clamp(min=0.0), _zero(s))
    total = powered.sum(-1, keepdim=True)
    n_valid = m.sum(-1, keepdim=True).to(torch.float64)
    uniform = m.to(torch.float64) / n_valid.clamp(min=1.0)
    w = torch.where(total > eps, powered / total.clamp(min=eps), uniform)
    out_dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
    return w.to(out_dtype)


# ---------------------------------------------------------------- raw salience scores (alpha >= 0)
def residual_norm(hidden: Tensor, base_hidden: Tensor, mask: Tensor) -> Tensor:
    """ARCA's alpha_t = ||h_t - h_t^base||_2 [N,T] from hidden states [N,T,H] (adapter on / off).

    h_t is the final hidden state that feeds the LM head at the position predicting y_t. The
    difference is taken in float32, one block of tokens at a time in one reused buffer (a fresh
    float32 copy per block costs more in page faults than the arithmetic). Padding is 0.
    """
    _check_pair(hidden, base_hidden, "residual_norm: hidden and base_hidden")
    if hidden.dim() != 3 or tuple(hidden.shape[:2]) != tuple(mask.shape):
        raise ValueError(
            f"residual_norm: hidden must be [N, T, H] matching mask {tuple(mask.shape)}, got {tuple(hidden.shape)}"
        )
    n, t, h = hidden.shape
    flat, flat_base = hidden.detach().reshape(n * t, h), base_hidden.detach().reshape(n * t, h)
    out = torch.empty(n * t, dtype=torch.float32, device=hidden.device)
    tokens = max(1, _NORM_BLOCK // max(1, h))
    buf = torch.empty(min(tokens, n * t), h, dtype=torch.float32, device=hidden.device)
    # a loop over blocks of tokens (not single tokens): caps the float32 buffer for long batches
    for i in range(0, n * t, tokens):
        j = min(n * t, i + tokens)
        block = buf[: j - i]
        block.copy_(flat[i:j]).sub_(flat_base[i:j])
        torch.linalg.vector_norm(block, dim=-1, out=out[i:j])
    out = out.reshape(n, t)
    return torch.where(mask.bool(), out, _zero(out))


def surprisal(log_probs: Tensor, mask: Tensor) -> Tensor:
    """alpha_t = -log pi(y_t) [N,T] (clamped at 0 against rounding: a log-probability is <= 0)."""
    _check_pair(log_probs, mask, "surprisal: log_probs and mask")
    a = (-log_probs.detach().float()).clamp(min=0.0)
    return torch.where(mask.bool(), a, _zero(a))


def entropy_reduction(entropy: Tensor, mask: Tensor) -> Tensor:
    """alpha_t = max(0, H_t - H_{t+1}) [N,T]; 0 where position t+1 is not a valid token (the last one)."""
    _check_pair(entropy, mask, "entropy_reduction: entropy and mask")
    m = mask.bool()
    e = entropy.detach().float()
    nxt = torch.nn.functional.pad(e[:, 1:], (0, 1))
    nxt_valid = torch.nn.functional.pad(m[:, 1:], (0, 1), value=False)
    drop = (e - nxt).clamp(min=0.0)
    return torch.where(m & nxt_valid, drop, _zero(drop))


def policy_divergence(log_probs: Tensor, base_log_probs: Tensor, mask: Tensor) -> Tensor:
    """alpha_t = |log pi(y_t) - log pi_base(y_t)| [N,T] on the sampled token (not a KL)."""
    _check_pair(log_probs, base_log_probs, "policy_divergence: log_probs and base_log_probs")
    _check_pair(log_probs, mask, "policy_divergence: log_probs and mask")
    a = (log_probs.detach().float() - base_log_probs.detach().float()).abs()
    return torch.where(mask.bool(), a, _zero(a))


def _uniform(batch: RolloutBatch) -> Tensor:
    return batch.mask.float()


# name -> (signals it needs, alpha from a batch)
def _adapter_residual(batch: RolloutBatch) -> Tensor:
    """ARCA's alpha: the engine's `adapter_residual` (computed where the hidden states live) when the batch
    carries it, else from the two hidden states."""
    if batch.adapter_residual is not None:
        return batch.adapter_residual.float()
    who = "salience 'arca'"
    return residual_norm(batch.signal("hidden", who), batch.signal("base_hidden", who), batch.mask)


SALIENCE: dict[str, tuple[tuple[str, ...], Callable[[RolloutBatch], Tensor]]] = {
    "arca": (("hidden", "base_hidden"), _adapter_residual),
    "surprisal": (
        ("old_log_probs",),
        lambda b: surprisal(b.signal("old_log_probs", "salience 'surprisal'"), b.mask),
    ),
    "entropy-reduction": (
        ("entropy",),
        lambda b: entropy_reduction(b.signal("entropy", "salience 'entropy-reduction'"), b.mask),
    ),
    "policy-divergence": (
        ("old_log_probs", "base_log_probs"),
        lambda b: policy_divergence(
            b.signal("old_log_probs", "salience 'policy-divergence'"),
            b.signal("base_log_probs", "salience 'policy-divergence'"),
            b.mask,
        ),
    ),
    "uniform": ((), _uniform),
}


def salience_scores(name: str, batch: RolloutBatch) -> Tensor:
    """Raw salience alpha [N,T] (>= 0, padding 0) of salience method `name` (see `SALIENCE`)."""
    if name not in SALIENCE:
        raise ConfigError(f"unknown salience {name!r}{closest(name, SALIENCE)}; one of {', '.join(SALIENCE)}")
    needs, fn = SALIENCE[name]
    if not (name == "arca" and batch.adapter_residual is not None):
        batch.require(needs, f"salience {name!r}")
    return fn(batch)


def salience_weights(name: str, batch: RolloutBatch, sharpening: float = 1.0, eps: float = 1e-8) -> Tensor:
    """Token weights w [N,T] of salience method `name`, rows summing to 1 (for diagnostics and plots)."""
    return normalize_scores(salience_scores(name, batch), batch.mask, sharpening, eps)


def weighted_advantages(weights: Tensor, advantages: Tensor, mask: Tensor, form: str = "mean") -> Tensor:
    """Â [N,T] from weights w (rows sum to 1) and A [N].

    form="mean": Â = A_i * T_i * w (row mean A_i; with seq-mean-token-mean REINFORCE, the paper's loss);
    form="sum":  Â = A_i * w       (row sum A_i; the same loss with seq-mean-token-sum).
    """
    if form not in FORMS:
        raise ConfigError(f"form must be one of {FORMS}, got {form!r}{closest(form, FORMS)}")
    m = mask.bool()
    w = weights.float()
    if form == "mean":
        w = w * m.sum(-1, keepdim=True).float()
    out = advantages.float()[:, None] * w
    return torch.where(m, out, _zero(out))


def _salience_credit(
    name: str, batch: RolloutBatch, advantages: Tensor, sharpening: float, form: str
) -> Tensor:
    return weighted_advantages(salience_weights(name, batch, sharpening), advantages, batch.mask, form)


@register(
    "arca", needs=("hidden", "base_hidden"), paper=PAPER, requires_lora=True, reduced="adapter_residual"
)
def arca(batch: RolloutBatch, advantages: Tensor, sharpening: float = 1.0, form: str = "mean") -> Tensor:
    """ARCA: Â = A * T_i * w, w from the LoRA adapter's hidden-state residual norm (form="sum": A * w).

    A batch carrying `adapter_residual` (the norms, computed where the hidden states live) needs no hidden state."""
    return _salience_credit("arca", batch, advantages, sharpening, form)


@register("surprisal", needs=("old_log_probs",), paper=f"salience baseline in {PAPER}")
def surprisal_credit(
    batch: RolloutBatch, advantages: Tensor, sharpening: float = 1.0, form: str = "mean"
) -> Tensor:
    """Surprisal salience: Â = A * T_i * w, w proportional to -log pi_old(y_t)."""
    return _salience_credit("surprisal", batch, advantages, sharpening, form)


@register("entropy-reduction", needs=("entropy",), paper=f"salience baseline in {PAPER}")
def entropy_reduction_credit(
    batch: RolloutBatch, advantages: Tensor, sharpening: float = 1.0, form: str = "mean"
) -> Tensor:
    """Entropy-reduction salience: Â = A * T_i * w, w proportional to max(0, H_t - H_{t+1})."""
    return _salience_credit("entropy-reduction", batch, advantages, sharpening, form)


@register(
    "policy-divergence",
    needs=("old_log_probs", "base_log_probs"),
    paper=f"salience baseline in {PAPER}",
    requires_lora=True,
)
def policy_divergence_credit(
    batch: RolloutBatch, advantages: Tensor, sharpening: float = 1.0, form: str = "mean"
) -> Tensor:
    """Policy-divergence salience: Â = A * T_i * w, w proportional to |log pi_old - log pi_base|."""
    return _salience_credit("policy-divergence", batch, advantages, sharpening, form)

"""Ratio kernels, PPO-clip (asymmetric, dual clip), REINFORCE, KL and loss aggregation (baselines.md).

A *ratio kernel* maps per-token log-ratios l = log pi - log pi_old [N,T] to log importance
weights log w [N,T]: "token" (PPO/GRPO/DAPO, log w_t = l_t), "gspo" (log w_t = mean_k l_k, the
sequence ratio), "gspo-token" (sg(mean l) + l_t - sg(l_t)), and, in `traces.py`, the
eligibility-trace kernels. `policy_loss` clips w against the token advantages, adds an optional
KL to a reference policy and aggregates with one of verl's four `loss_agg_mode`s. "reinforce" is
the on-policy loss -Â log pi with no ratio and no clip (ARCA's experiments).

Micro-batch invariance: pass the whole step's token count (`global_tokens`) or sequence count
(`global_seqs`) and the sum of the micro-batch losses equals the loss of the undivided batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from tokencredit.errors import ConfigError, closest

__all__ = [
    "AGG_MODES",
    "KERNELS",
    "Kernel",
    "aggregate",
    "clipped_token_loss",
    "get_kernel",
    "kl_penalty",
    "loss_token_mask",
    "policy_loss",
    "register_kernel",
    "sequence_log_ratio",
]

LOG_RATIO_CLAMP = 20.0
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")

KernelFn = Callable[..., Tensor]


@dataclass(frozen=True)
class Kernel:
    name: str
    fn: KernelFn  # fn(log_ratio [N,T], mask [N,T] bool, **params) -> log_w [N,T]
    needs: frozenset[str]  # per-token signals (e.g. entropy for S-trace's kept set)
    uses_keep: bool  # True: only tokens in the kept set carry a loss term


KERNELS: dict[str, Kernel] = {}


def register_kernel(name: str, *, needs: tuple[str, ...] = (), uses_keep: bool = False) -> Callable[[KernelFn], KernelFn]:
    """Register a ratio kernel `fn(log_ratio, mask, **params) -> log_w`; unused params arrive in **_."""

    def deco(fn: KernelFn) -> KernelFn:
        if name in KERNELS:
            raise ValueError(f"ratio kernel {name!r} is already registered")
        KERNELS[name] = Kernel(name, fn, frozenset(needs), uses_keep)
        return fn

    return deco


def get_kernel(name: str) -> Kernel:
    try:
        return KERNELS[name]
    except KeyError:
        raise ConfigError(
            f"unknown ratio kernel {name!r}{closest(name, KERNELS)}; registered: {', '.join(sorted(KERNELS))}"
        ) from None


def sequence_log_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """[N] GSPO's log s_i = mean over valid tokens of l (0 for an empty response)."""
    m = mask.to(log_ratio.dtype)
    return (log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1)


@register_kernel("token")
def _token_kernel(log_ratio: Tensor, mask: Tensor, **_: object) -> Tensor:
    """Per-token ratio (PPO/GRPO/DAPO): log w_t = l_t."""
    return log_ratio


@register_kernel("gspo")
def _gspo_kernel(log_ratio: Tensor, mask: Tensor, **_: object) -> Tensor:
    """GSPO sequence ratio: log w_t = log s_i = mean_k l_k for every token of response i."""
    return sequence_log_ratio(log_ratio, mask)[:, None].expand_as(log_ratio)


@register_kernel("gspo-token")
def _gspo_token_kernel(log_ratio: Tensor, mask: Tensor, **_: object) -> Tensor:
    """GSPO-token: log w_t = sg(log s_i) + l_t - sg(l_t); GSPO's value, per-token gradient path."""
    seq = sequence_log_ratio(log_ratio, mask).detach()
    return seq[:, None] + log_ratio - log_ratio.detach()


def _masked(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _clip(
    log_w: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float, dual_clip: float | None
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """PPO-clip on weights w = exp(log_w): per-token loss [N,T] and the ratio, plus clip indicators."""
    if dual_clip is not None and dual_clip <= 1.0:
        raise ConfigError(f"dual_clip must be > 1 (verl default 3, DAPO 10), got {dual_clip}")
    ratio = torch.exp(log_w)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    ind = {
        "clip_high": (advantages > 0) & (ratio > 1.0 + eps_high),
        "clip_low": (advantages < 0) & (ratio < 1.0 - eps_low),
    }
    if dual_clip is not None:
        cap = -advantages * dual_clip
        dual = (advantages < 0) & (loss > cap)
        loss = torch.where(advantages < 0, torch.minimum(loss, cap), loss)
        ind["clip_dual"] = dual
    return _masked(loss, mask), ratio, ind


def clipped_token_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
) -> Tensor:
    """Per-token PPO-clip loss [N,T] (0 where masked).

    r = exp(clamp(logp - logp_old, -20, 20)); loss_t = max(-Â r, -Â clip(r, 1 - eps_low, 1 + eps_high)),
    and for Â < 0 with dual clip c: min(loss_t, -Â c). advantages: [N,T] or [N] (broadcast).
    """
    mask = mask.bool()
    adv = advantages[:, None].expand_as(log_prob) if advantages.dim() == 1 else advantages
    log_ratio = (log_prob - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    loss, _, _ = _clip(log_ratio, adv.to(log_prob.dtype), mask, eps_low, eps_high, dual_clip)
    return loss


def kl_penalty(log_prob: Tensor, ref_log_prob: Tensor, kind: str = "k3") -> Tensor:
    """Per-token KL estimate to the reference policy [N,T].

    k1 = logp - logp_ref; k2 = 0.5 (logp - logp_ref)^2; k3 = exp(ref - logp) - (ref - logp) - 1
    clamped to [-10, 10] (verl's "low_var_kl").
    """
    d = log_prob - ref_log_prob
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        x = (-d).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return (torch.exp(x) - x - 1.0).clamp(-10.0, 10.0)
    raise ConfigError(f"kl_type must be 'k1', 'k2' or 'k3', got {kind!r}")


def aggregate(
    loss: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    norm_constant: float | None = None,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> Tensor:
    """Scalar loss from per-token losses [N,T] (verl's `loss_agg_mode` names).

    token-mean:              sum of valid tokens / number of valid tokens
    seq-mean-token-mean:     mean over each response's tokens, then mean over responses
    seq-mean-token-sum:      sum over each response, then mean over responses
    seq-mean-token-sum-norm: sum over each response / norm_constant (default T), then mean over responses
    Responses with no valid token are left out of the response count. `global_tokens` /
    `global_seqs` replace the local counts with the whole step's, for gradient accumulation.
    """
    mask = mask.bool()
    m = mask.to(loss.dtype)
    total = _masked(loss, mask)
    if mode == "token-mean":
        denom = m.sum() if global_tokens is None else torch.as_tensor(global_tokens, dtype=loss.dtype)
        return total.sum() / denom.clamp(min=1)
    lens = m.sum(-1)
    seq_sum = total.sum(-1)
    if mode == "seq-mean-token-mean":
        per_seq = seq_sum / lens.clamp(min=1)
    elif mode == "seq-mean-token-sum":
        per_seq = seq_sum
    elif mode == "seq-mean-token-sum-norm":
        c = float(loss.shape[-1]) if norm_constant is None else float(norm_constant)
        if c <= 0:
            raise ConfigError(f"norm_constant must be > 0, got {c}")
        per_seq = seq_sum / c
    else:
        raise ConfigError(f"unknown loss_agg_mode {mode!r}{closest(mode, AGG_MODES)}; one of {', '.join(AGG_MODES)}")
    n_seq = (lens > 0).to(loss.dtype).sum() if global_seqs is None else torch.as_tensor(global_seqs, dtype=loss.dtype)
    return per_seq.sum() / n_seq.clamp(min=1)


def loss_token_mask(mask: Tensor, kernel: str = "token", keep: Tensor | None = None) -> Tensor:
    """bool[N,T]: the tokens that carry a loss term (all valid tokens, or the kept set for S-trace)."""
    mask = mask.bool()
    if kernel != "reinforce" and get_kernel(kernel).uses_keep:
        if keep is None:
            raise ConfigError(f"ratio kernel {kernel!r} needs a kept-token mask `keep`")
        return mask & keep.bool()
    return mask


def policy_loss(
    log_prob: Tensor,
    old_log_prob: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    kernel: str = "token",
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
    loss_agg_mode: str = "token-mean",
    norm_constant: float | None = None,
    ref_log_prob: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_type: str = "k3",
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    entropy: Tensor | None = None,
    **kernel_params: object,
) -> tuple[Tensor, dict[str, float]]:
    """The policy objective for one (micro-)batch: (scalar loss, metrics).

    log_prob [N,T] (with grad), old_log_prob [N,T] (None only for kernel="reinforce"),
    advantages Â [N,T] or A [N], mask [N,T]. kernel: "reinforce" or a registered ratio kernel;
    kernel_params go to the kernel (lam, keep, decay for the trace kernels). KL (k1/k2/k3) to
    `ref_log_prob` is added per token with weight kl_coef. `global_tokens` / `global_seqs`: the
    step's counts of loss-carrying tokens / responses (see `aggregate`).
    """
    mask = mask.bool()
    adv = (advantages[:, None].expand_as(log_prob) if advantages.dim() == 1 else advantages).to(log_prob.dtype)
    adv = adv.detach()
    keep = kernel_params.get("keep")
    lmask = loss_token_mask(mask, kernel, keep if isinstance(keep, Tensor) else None)
    metrics: dict[str, float] = {}
    n_tok = lmask.sum().clamp(min=1)

    def frac(x: Tensor) -> float:
        return float((x & lmask).sum() / n_tok)

    if kernel == "reinforce":
        per_tok = _masked(-adv * log_prob, lmask)
    else:
        if old_log_prob is None:
            raise ConfigError(f"ratio kernel {kernel!r} needs old_log_prob")
        k = get_kernel(kernel)
        log_ratio = (log_prob - old_log_prob.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        log_ratio = _masked(log_ratio, mask)
        log_w = k.fn(log_ratio, mask, **kernel_params)
        per_tok, ratio, ind = _clip(log_w, adv, lmask, eps_low, eps_high, dual_clip)
        with torch.no_grad():
            r = ratio[lmask]
            lr = log_ratio[mask]
            metrics.update({f"{name}_frac": frac(v) for name, v in ind.items()})
            metrics["clip_frac"] = metrics["clip_high_frac"] + metrics["clip_low_frac"]
            metrics["approx_kl"] = float((0.5 * lr * lr).mean()) if lr.numel() else 0.0
            if r.numel():
                metrics.update(ratio_mean=float(r.mean()), ratio_max=float(r.max()), ratio_min=float(r.min()))
    if kl_coef:
        if ref_log_prob is None:
            raise ConfigError("kl_coef > 0 needs ref_log_prob")
        kl = kl_penalty(log_prob, ref_log_prob.detach(), kl_type)
        per_tok = per_tok + kl_coef * _masked(kl, lmask)
        metrics["kl_ref"] = float(kl.detach()[lmask].mean()) if bool(lmask.any()) else 0.0
    if entropy is not None:
        metrics["entropy"] = float(entropy.detach()[mask].mean()) if bool(mask.any()) else 0.0
    loss = aggregate(per_tok, lmask, loss_agg_mode, norm_constant, global_tokens, global_seqs)
    metrics["pg_loss"] = float(loss.detach())
    return loss, metrics

"""The policy objective: ratio kernel -> loss -> KL -> aggregation (docs/spec/baselines.md), plus metrics.

`policy_loss` composes the registered pieces: the ratio kernel turns per-token log-ratios into
log importance weights (`kernels.py`, `traces.py`), the loss turns them and Â into per-token loss
terms (`losses.py`), an optional KL to a reference policy is added per token, and one of verl's
four `loss_agg_mode`s reduces them to a scalar.

Micro-batch invariance: pass the whole step's token count (`global_tokens`) or sequence count
(`global_seqs`) and the sum of the micro-batch losses equals the loss of the undivided batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tokencredit.errors import ConfigError, closest
from tokencredit.objectives.args import AGG_MODES, ObjectiveArgs
from tokencredit.objectives.kernels import get_kernel
from tokencredit.objectives.losses import LOG_RATIO_CLAMP, LossInputs, get_loss

__all__ = ["aggregate", "is_per_token", "kl_penalty", "loss_token_mask", "policy_loss"]


def _masked(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


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
        raise ConfigError(
            f"unknown loss_agg_mode {mode!r}{closest(mode, AGG_MODES)}; one of {', '.join(AGG_MODES)}"
        )
    n_seq = (
        (lens > 0).to(loss.dtype).sum()
        if global_seqs is None
        else torch.as_tensor(global_seqs, dtype=loss.dtype)
    )
    return per_seq.sum() / n_seq.clamp(min=1)


def loss_token_mask(mask: Tensor, keep: Tensor | None = None) -> Tensor:
    """bool[N,T]: the tokens that carry a loss term (the valid tokens, within the kept set if one is given)."""
    mask = mask.bool()
    return mask if keep is None else mask & keep.bool()


def policy_loss(
    log_prob: Tensor,
    old_log_prob: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    args: ObjectiveArgs | None = None,
    *,
    ref_log_prob: Tensor | None = None,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    entropy: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The policy objective for one (micro-)batch: (scalar loss, metrics).

    Over 60 lines on purpose: kernel -> loss -> KL -> aggregation and the metrics they produce stay in
    one function, so the whole objective every recipe trains with reads in one place.

    log_prob [N,T] (with grad), old_log_prob [N,T] (None for a loss without a ratio, e.g.
    "reinforce"), advantages Â [N,T] or A [N], mask [N,T]. `args`: the loss, the ratio kernel, their
    parameters (per-row tensors cut to these N rows, `ObjectiveArgs.rows`), the aggregation and the
    KL term; None is PPO-clip 0.2 with the per-token ratio under token-mean. KL (k1/k2/k3) to
    `ref_log_prob` is added per token with weight args.kl_coef. `global_tokens` / `global_seqs`: the
    step's counts of loss-carrying tokens / responses (see `aggregate`). `entropy` [N,T] (optional)
    only adds its mean over valid tokens to the metrics.
    """
    args = ObjectiveArgs() if args is None else args
    spec = get_loss(args.loss)
    mask = mask.bool()
    adv = (advantages[:, None].expand_as(log_prob) if advantages.dim() == 1 else advantages).to(
        log_prob.dtype
    )
    adv = adv.detach()
    metrics: dict[str, float] = {}
    if spec.uses_ratio:
        if old_log_prob is None:
            raise ConfigError(f"policy loss {args.loss!r} needs old_log_prob (it uses an importance ratio)")
        lmask = loss_token_mask(mask, args.keep)
        log_ratio = _masked((log_prob - old_log_prob.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), mask)
        log_w = get_kernel(args.kernel).fn(log_ratio, mask, **args.kernel_args)
        inputs = LossInputs(log_prob, adv, lmask, log_ratio, log_w, old_log_prob.detach())
    else:
        lmask = mask
        inputs = LossInputs(log_prob, adv, lmask)
    per_tok, indicators = spec.fn(inputs, **args.loss_params)
    n_tok = lmask.sum().clamp(min=1)
    with torch.no_grad():
        for name, ind in indicators.items():
            metrics[f"{name}_frac"] = float((ind & lmask).sum() / n_tok)
        if "clip_high" in indicators or "clip_low" in indicators:
            metrics["clip_frac"] = metrics.get("clip_high_frac", 0.0) + metrics.get("clip_low_frac", 0.0)
        if inputs.log_w is not None and inputs.log_ratio is not None:
            lr = inputs.log_ratio[mask]
            r = torch.exp(inputs.log_w[lmask])
            metrics["approx_kl"] = float((0.5 * lr * lr).mean()) if lr.numel() else 0.0
            if r.numel():
                metrics.update(ratio_mean=float(r.mean()), ratio_max=float(r.max()), ratio_min=float(r.min()))
    if args.kl_coef:
        if ref_log_prob is None:
            raise ConfigError("kl_coef > 0 needs ref_log_prob")
        kl = kl_penalty(log_prob, ref_log_prob.detach(), args.kl_type)
        per_tok = per_tok + args.kl_coef * _masked(kl, lmask)
        metrics["kl_ref"] = float(kl.detach()[lmask].mean()) if bool(lmask.any()) else 0.0
    if entropy is not None:
        metrics["entropy"] = float(entropy.detach()[mask].mean()) if bool(mask.any()) else 0.0
    total = aggregate(per_tok, lmask, args.loss_agg_mode, args.norm_constant, global_tokens, global_seqs)
    metrics["pg_loss"] = float(total.detach())
    return total, metrics


def is_per_token(loss: str, kernel: str) -> bool:
    """True when the on-policy gradient weight of every token is its own Â_t (the effective credit is Â)."""
    spec = get_loss(loss)
    return spec.per_token and (not spec.uses_ratio or get_kernel(kernel).per_token)

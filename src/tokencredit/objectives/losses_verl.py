"""The policy losses of verl 0.9.1's registry, re-implemented from the formulas of its ``core_algos``.

verl's names in brackets. w_t = exp(log w_t) is the ratio kernel's importance weight (with the
per-token kernel w_t = pi(y_t) / pi_old(y_t); any kernel composes), Â_t the token advantage from
any credit method, l_t = log pi(y_t) - log pi_old(y_t) (clamped to +-20 for every loss).
``tests/objectives/test_vs_verl.py`` checks values and gradients against verl's functions.

| loss      | per-token loss                                                                  | parameters (verl's defaults) |
|-----------|---------------------------------------------------------------------------------|------------------------------|
| cispo     | -sg(clip(w, 1 - eps_low, 1 + eps_high)) Â log pi                   [cispo]      | eps_low, eps_high (the recipe's clip range) |
| sapo      | -Â (4 / tau) sigmoid(tau (w - 1)), tau = tau_pos if Â > 0 else tau_neg [sapo]  | tau_pos 1.0, tau_neg 1.05 |
| clip-cov  | PPO-clip, with a random clip_cov_ratio share of the unclipped tokens whose      | clip_cov_ratio 2e-4, clip_cov_lb 1, clip_cov_ub 5 |
|           | cov_t = (Â_t - mean Â)(log pi_t - mean log pi) lies in (lb, ub) removed [clip_cov] |                    |
| kl-cov    | -Â w, plus ppo_kl_coef |l| on the top kl_cov_ratio share of tokens by cov_t [kl_cov] | kl_cov_ratio 2e-4, ppo_kl_coef 0.1 |
| gmpo      | -mean_t(Â) exp(mean_t sgn(Â) min(sgn(Â) log w, sgn(Â) clip(log w, -eps_low, eps_high))), | eps_low, eps_high (log-space bounds) |
|           | the response's value on each of its tokens                          [geo_mean] |                              |
| dppo-tv   | -Â sg(min(w, clip_ratio_c)) log pi on tokens inside the TV trust region:        | eps_low, eps_high (thresholds), clip_ratio_c 20 |
|           | pi - pi_old <= eps_high (Â > 0), >= -eps_low (Â <= 0), 0 elsewhere  [dppo_tv]  |                              |
| dppo-kl   | the same inside the binary-KL region: KL(pi_old || pi) on {y_t, not y_t} <= eps_high | eps_low, eps_high, clip_ratio_c 20 |
|           | or pi <= pi_old (Â > 0); <= eps_low or pi >= pi_old (Â <= 0)        [dppo_kl]  |                              |

Aggregation: every loss here returns per-token terms aggregated by the recipe's loss_agg_mode, as
verl's do, except two of verl's that fix their own: verl's sapo always aggregates
seq-mean-token-mean (the sapo recipe sets it), and verl's geo_mean averages the per-response losses
over all N rows, an empty response counting as 0: with GMPO's response value on each of its
tokens, seq-mean-token-mean gives that mean over the non-empty responses (pass global_seqs=N to
count empty ones as verl does). Clip-Cov and KL-Cov select tokens from statistics of the
(micro-)batch they are given, as verl does; Clip-Cov draws its tokens with torch's global
generator (torch.randperm), so it is reproducible under a fixed seed.

DPPO's trust region is the per-token probability divergence; a ratio kernel other than "token"
changes only its truncated importance weight. verl sets clip_ratio_c from the actor config (3.0
unless overridden); 20 is its DPPO functions' own default, a large threshold as the paper
recommends (arXiv 2602.04879, Sec. 5.4).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tokencredit.errors import ConfigError
from tokencredit.objectives.losses import LossInputs, _masked, register_loss

__all__ = ["cispo", "clip_cov", "dppo_kl", "dppo_tv", "gmpo", "kl_cov", "sapo"]

_Out = tuple[Tensor, dict[str, Tensor]]


def _weights(inputs: LossInputs) -> Tensor:
    assert inputs.log_w is not None  # uses_ratio: policy_loss always supplies it
    return torch.exp(inputs.log_w)


def _positive(name: str, **values: float) -> None:
    for key, value in values.items():
        if not value > 0:
            raise ConfigError(f"policy loss {name!r}: {key} must be > 0, got {value}")


@register_loss("cispo", paper="MiniMax 2025, MiniMax-M1 CISPO (arXiv 2506.13585)")
def cispo(inputs: LossInputs, eps_low: float = 0.2, eps_high: float = 0.2) -> _Out:
    """loss_t = -sg(clip(w_t, 1 - eps_low, 1 + eps_high)) Â_t log pi(y_t): the clipped weight scales the
    REINFORCE term; no token loses its gradient."""
    w, a = _weights(inputs), inputs.advantages
    loss = -w.clamp(1.0 - eps_low, 1.0 + eps_high).detach() * a * inputs.log_prob
    return _masked(loss, inputs.mask), {"clip_high": w > 1.0 + eps_high, "clip_low": w < 1.0 - eps_low}


@register_loss("sapo", paper="Gao et al. 2025, SAPO (arXiv 2511.20347)")
def sapo(inputs: LossInputs, tau_pos: float = 1.0, tau_neg: float = 1.05) -> _Out:
    """loss_t = -Â_t (4 / tau) sigmoid(tau (w_t - 1)), tau = tau_pos where Â_t > 0 else tau_neg: a smooth
    gate with slope 1 at w = 1 in place of the hard clip."""
    _positive("sapo", tau_pos=tau_pos, tau_neg=tau_neg)
    w, a = _weights(inputs), inputs.advantages
    tau = torch.where(a > 0, torch.full_like(a, tau_pos), torch.full_like(a, tau_neg))
    gate = torch.sigmoid(tau * (w - 1.0)) * (4.0 / tau)
    return _masked(-gate * a, inputs.mask), {}


def _covariance(inputs: LossInputs) -> Tensor:
    """cov_t = (Â_t - mean Â)(log pi_t - mean log pi) over the loss tokens (log pi detached), [N,T]."""
    m = inputs.mask
    a, lp = inputs.advantages.detach(), inputs.log_prob.detach()
    n = m.sum().clamp(min=1)
    mean_a = torch.where(m, a, torch.zeros_like(a)).sum() / n
    mean_lp = torch.where(m, lp, torch.zeros_like(lp)).sum() / n
    return (a - mean_a) * (lp - mean_lp)


@register_loss("clip-cov", per_token=False, paper="Cui et al. 2025, Clip-Cov (arXiv 2505.22617)")
def clip_cov(
    inputs: LossInputs,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
) -> _Out:
    """PPO-clip without dual clip, minus the tokens Clip-Cov removes: among the loss tokens the PPO clip left
    alone with covariance in (clip_cov_lb, clip_cov_ub), max(1, int(clip_cov_ratio x n_tokens)) drawn at
    random (torch.randperm over them in row-major order) get no loss term and no gradient."""
    _positive("clip-cov", clip_cov_ratio=clip_cov_ratio)
    m, a = inputs.mask, inputs.advantages
    w = _weights(inputs)
    unclipped = -a * w
    clipped = -a * w.clamp(1.0 - eps_low, 1.0 + eps_high)
    with torch.no_grad():
        by_clip = (clipped > unclipped) & m
        cov = _covariance(inputs)
        candidates = (
            (m & ~by_clip & (cov > clip_cov_lb) & (cov < clip_cov_ub)).flatten().nonzero().squeeze(-1)
        )
        k = max(int(clip_cov_ratio * int(m.sum())), 1)
        removed = torch.zeros(m.numel(), dtype=torch.bool, device=m.device)
        if candidates.numel():
            pick = torch.randperm(candidates.numel())[: min(k, candidates.numel())].to(candidates.device)
            removed[candidates[pick]] = True
        removed = removed.view_as(m)
    loss = torch.where(removed, torch.zeros_like(unclipped), torch.maximum(unclipped, clipped))
    ind = {
        "clip_high": (a > 0) & (w > 1.0 + eps_high),
        "clip_low": (a < 0) & (w < 1.0 - eps_low),
        "cov": removed,
    }
    return _masked(loss, m), ind


@register_loss("kl-cov", paper="Cui et al. 2025, KL-Cov (arXiv 2505.22617)")
def kl_cov(inputs: LossInputs, kl_cov_ratio: float = 0.0002, ppo_kl_coef: float = 0.1) -> _Out:
    """loss_t = -Â_t w_t (no clip), plus ppo_kl_coef |l_t| on the max(1, int(kl_cov_ratio x n_tokens)) loss
    tokens of largest covariance (torch.topk over them in row-major order)."""
    _positive("kl-cov", kl_cov_ratio=kl_cov_ratio)
    if ppo_kl_coef < 0:
        raise ConfigError(f"policy loss 'kl-cov': ppo_kl_coef must be >= 0, got {ppo_kl_coef}")
    assert inputs.log_ratio is not None
    m, a = inputs.mask, inputs.advantages
    loss = -a * _weights(inputs)
    with torch.no_grad():
        positions = m.flatten().nonzero().squeeze(-1)
        chosen = torch.zeros(m.numel(), dtype=torch.bool, device=m.device)
        if positions.numel():
            va, vlp = a.detach()[m], inputs.log_prob.detach()[m]
            cov = (va - va.mean()) * (vlp - vlp.mean())
            k = max(1, int(positions.numel() * kl_cov_ratio))
            chosen[positions[torch.topk(cov, k, largest=True).indices]] = True
        chosen = chosen.view_as(m)
    loss = loss + torch.where(chosen, ppo_kl_coef * inputs.log_ratio.abs(), torch.zeros_like(loss))
    return _masked(loss, m), {"cov": chosen}


@register_loss("gmpo", per_token=False, paper="Zhao et al. 2025, GMPO (arXiv 2507.20673)")
def gmpo(inputs: LossInputs, eps_low: float = 0.2, eps_high: float = 0.2) -> _Out:
    """Geometric-mean policy optimisation: per response, the token log-weights are clipped in log space to
    [-eps_low, eps_high] on the side sgn(Â_t) would exploit, averaged, and exponentiated;
    loss_i = -mean_t(Â_t) exp(that mean), put on each of the response's tokens."""
    assert inputs.log_w is not None
    m, a, lw = inputs.mask, inputs.advantages, inputs.log_w
    sgn = torch.sign(a)
    bounded = lw.clamp(-eps_low, eps_high)
    pessimistic = sgn * torch.min(sgn * lw, sgn * bounded)
    mf = m.to(lw.dtype)
    length = mf.sum(-1).clamp(min=1)
    log_s = (pessimistic * mf).sum(-1) / length
    per_response = -((a * mf).sum(-1) / length) * torch.exp(log_s)
    out = per_response[:, None].expand_as(lw)
    moved = lw != bounded
    return _masked(out, m), {"clip_high": moved & (a > 0), "clip_low": moved & (a < 0)}


def _dppo(name: str, inputs: LossInputs, inside_pos: Tensor, inside_neg: Tensor, clip_ratio_c: float) -> _Out:
    """-Â_t sg(min(w_t, c)) log pi(y_t) on the tokens inside the trust region, 0 on the others."""
    _positive(name, clip_ratio_c=clip_ratio_c)
    a, w = inputs.advantages, _weights(inputs)
    inside = torch.where(a > 0, inside_pos, inside_neg).detach()
    loss = -a * w.clamp(max=clip_ratio_c).detach() * inputs.log_prob * inside.to(a.dtype)
    ind = {
        "clip_high": ~inside & (a > 0),
        "clip_low": ~inside & (a <= 0),
        "truncated": inside & (w > clip_ratio_c),
    }
    return _masked(loss, inputs.mask), ind


def _probs(inputs: LossInputs) -> tuple[Tensor, Tensor]:
    if inputs.old_log_prob is None:
        raise ConfigError("the DPPO losses need old_log_prob (their trust region compares pi and pi_old)")
    return torch.exp(inputs.log_prob), torch.exp(inputs.old_log_prob)


@register_loss("dppo-tv", paper="DPPO-Binary-TV, Rethinking the Trust Region in LLM RL (arXiv 2602.04879)")
def dppo_tv(
    inputs: LossInputs, eps_low: float = 0.2, eps_high: float = 0.2, clip_ratio_c: float = 20.0
) -> _Out:
    """DPPO with the total-variation region: pi - pi_old <= eps_high where Â > 0, >= -eps_low where Â <= 0."""
    p, p_old = _probs(inputs)
    return _dppo("dppo-tv", inputs, p - p_old <= eps_high, p - p_old >= -eps_low, clip_ratio_c)


@register_loss("dppo-kl", paper="DPPO-Binary-KL, Rethinking the Trust Region in LLM RL (arXiv 2602.04879)")
def dppo_kl(
    inputs: LossInputs, eps_low: float = 0.2, eps_high: float = 0.2, clip_ratio_c: float = 20.0
) -> _Out:
    """DPPO with the binary-KL region: KL = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p))
    (1e-8 inside the second log) <= eps_high or p <= p_old where Â > 0; <= eps_low or p >= p_old where Â <= 0."""
    p, p_old = _probs(inputs)
    assert inputs.old_log_prob is not None
    kl = p_old * (inputs.old_log_prob - inputs.log_prob) + (1.0 - p_old) * torch.log(
        (1.0 - p_old + 1e-8) / (1.0 - p + 1e-8)
    )
    return _dppo(
        "dppo-kl", inputs, (kl <= eps_high) | (p <= p_old), (kl <= eps_low) | (p >= p_old), clip_ratio_c
    )

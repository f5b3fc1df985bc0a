"""GCPO token weights from a negative-prompt forward pass (docs/spec/baselines.md#gcpo).

Paper: Li et al. 2026, GCPO (arXiv 2605.29198); released code: github.com/jacklishufan/gcpo.
The same sampled response is scored under the real prompt (log p_t = old_log_probs) and under a
"negative" prompt that asks for a wrong answer (log q_t = neg_log_probs). Tokens whose
probability the negative prompt changes most are the ones that carry the answer:

    delta_t = clamp(log q_t - log p_t, -20, 20)
    d_t     = min(exp(delta_t) - delta_t - 1, 10)          (k3-style pointwise divergence, >= 0)
    u_t     = rank_t / N_valid                              (rank 1 = smallest d in the response)
    w_t     = u_t^a, rescaled to mean 1 over the valid tokens
    Â_t     = A * w_t

with a = ln(1 - mass) / ln(1 - top) - 1, so that the top `top` fraction of tokens carries about
`mass` of the weight (continuous approximation); the default a = ln(0.2)/ln(0.6) - 1 ~ 2.1507
is top 40% -> 80%.

Ties: tokens with equal d get the average of the ranks they span ("fractional" ranking), so
equal divergences get equal weights (d = 0 when both prompts agree exactly, d = 10 at the cap).
The released code ranks with an unstable argsort, which breaks ties arbitrarily; `ties="first"`
instead breaks them by position (earlier token = lower rank). Without ties both rules agree.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tokencredit.batch import RolloutBatch
from tokencredit.credit.registry import register
from tokencredit.errors import ConfigError

__all__ = [
    "DEFAULT_POWER",
    "TIES",
    "divergence",
    "negative_prompt",
    "rank_power_exponent",
    "rank_power_weights",
    "ranks",
]

TIES = ("average", "first")


def rank_power_exponent(top: float = 0.4, mass: float = 0.8) -> float:
    """a such that, for w = u^a on uniform ranks u, the top `top` fraction of tokens holds `mass` of the weight."""
    if not (0.0 < top < 1.0 and 0.0 < mass < 1.0):
        raise ConfigError(f"top and mass must be in (0, 1), got top={top}, mass={mass}")
    return math.log(1.0 - mass) / math.log(1.0 - top) - 1.0


DEFAULT_POWER = rank_power_exponent(0.4, 0.8)  # ln(0.2)/ln(0.6) - 1 ~ 2.1507


def divergence(log_p: Tensor, log_q: Tensor, mask: Tensor) -> Tensor:
    """d [N,T] = min(exp(delta) - delta - 1, 10), delta = clamp(log q - log p, -20, 20); float64, padding 0."""
    if log_p.shape != log_q.shape or log_p.shape != mask.shape:
        raise ValueError(
            f"gcpo: log_p {tuple(log_p.shape)}, log_q {tuple(log_q.shape)} and mask {tuple(mask.shape)} must match"
        )
    m = mask.bool()
    delta = (log_q.detach().double() - log_p.detach().double()).clamp(-20.0, 20.0)
    bad = m & ~torch.isfinite(delta)
    if bool(bad.any()):
        i, j = (int(x) for x in bad.nonzero()[0])
        raise ValueError(f"gcpo: non-finite log-probability at rollout {i}, token {j}")
    d = (torch.expm1(delta) - delta).clamp(min=0.0, max=10.0)
    return torch.where(m, d, torch.zeros((), dtype=d.dtype, device=d.device))


def ranks(values: Tensor, mask: Tensor, ties: str = "average") -> Tensor:
    """Ascending ranks [N,T] (1 = smallest) of `values` among each row's valid entries; 0 on padding.

    ties="average": equal values share the mean of their ranks; ties="first": by position.
    Sort-based and vectorised over rows.
    """
    if ties not in TIES:
        raise ConfigError(f"ties must be one of {TIES}, got {ties!r}")
    m = mask.bool()
    n, t = values.shape
    v = torch.where(
        m, values.double(), torch.full((), float("inf"), dtype=torch.float64, device=values.device)
    )
    srt, order = torch.sort(v, dim=-1, stable=True)  # padding (+inf) after every valid entry
    pos = torch.arange(t, device=values.device).expand(n, t)
    if ties == "first":
        sorted_rank = (pos + 1).double()
    else:
        new_run = torch.ones_like(m)
        new_run[:, 1:] = srt[:, 1:] != srt[:, :-1]
        run_end = torch.ones_like(m)
        run_end[:, :-1] = srt[:, :-1] != srt[:, 1:]
        first = torch.where(new_run, pos, torch.zeros_like(pos)).cummax(-1).values
        last = torch.where(run_end, pos, torch.full_like(pos, t)).flip(-1).cummin(-1).values.flip(-1)
        sorted_rank = (first + last).double() / 2.0 + 1.0
    out = torch.empty_like(sorted_rank).scatter_(1, order, sorted_rank)
    return torch.where(m, out, torch.zeros((), dtype=out.dtype, device=out.device))


def rank_power_weights(
    log_p: Tensor, log_q: Tensor, mask: Tensor, a: float = DEFAULT_POWER, ties: str = "average"
) -> Tensor:
    """GCPO token weights w [N,T]: w = (rank(d) / N_valid)^a rescaled to mean 1 over each row's valid tokens.

    log_p: log-probs of the response under the real prompt [N,T]; log_q: under the negative prompt.
    Float32 (float64 for float64 input), detached; padding and rows without valid tokens are 0.
    """
    if not math.isfinite(a) or a < 0:
        raise ConfigError(f"gcpo power a must be finite and >= 0, got {a}")
    m = mask.bool()
    r = ranks(divergence(log_p, log_q, m), m, ties)
    n_valid = m.sum(-1, keepdim=True).double().clamp(min=1.0)
    w = torch.where(m, (r / n_valid).pow(a), torch.zeros((), dtype=torch.float64, device=r.device))
    w = w * n_valid / w.sum(-1, keepdim=True).clamp(min=1e-300)
    out_dtype = torch.float64 if log_p.dtype == torch.float64 else torch.float32
    return w.to(out_dtype)


def negative_prompt(problem: str) -> str:
    """The "negative" prompt for GCPO's second forward pass: the problem plus a request for a wrong answer.

    Our own wording. The released code (jacklishufan/gcpo, template
    examples/format_prompt/math_format_perception_wrong_answer.jinja) appends its usual
    think-then-\\boxed{} format instruction and a note asking for an intentionally incorrect answer;
    the weights depend on this text, so results with other wordings are not directly comparable.
    """
    if not isinstance(problem, str) or not problem.strip():
        raise ValueError("negative_prompt: problem must be a non-empty string")
    return (
        f"{problem.strip()}\n\n"
        "Solve this problem, but on purpose arrive at an incorrect result: reason step by step as usual, "
        "then give a final answer that is wrong, in \\boxed{}."
    )


@register(
    "gcpo",
    needs=("old_log_probs", "neg_log_probs"),
    paper="Li et al. 2026, GCPO (arXiv 2605.29198)",
    reconstruction="the negative prompt is our own wording (the released template's differs), so results are "
    "not directly comparable with the paper's",
)
def gcpo(batch: RolloutBatch, advantages: Tensor, a: float = DEFAULT_POWER, ties: str = "average") -> Tensor:
    """GCPO: Â = A * w, w the rank-power weights of the real- vs negative-prompt divergence (mean 1)."""
    who = "credit method 'gcpo'"
    w = rank_power_weights(
        batch.signal("old_log_probs", who), batch.signal("neg_log_probs", who), batch.mask, a, ties
    )
    return advantages.float()[:, None] * w.float()

"""Eligibility-trace ratio kernels: P-trace, accumulating trace, S-trace (docs/spec/strace.md), and GRPO(lambda).

Paper: Mou, Zhuang, Chen, Zhang, "Beyond Uniform Credit Assignment: Selective Eligibility
Traces for RLVR", arXiv 2605.05965 (2026). No code was released and only the abstract was
available, so **the P-trace / S-trace kernels below are our reconstruction**, consistent with
what the abstract states. Assumptions we made (none of them is stated in the paper):

- the trace lives in log space over per-token log-ratios l_k = log pi_theta(y_k) - log pi_old(y_k):
  log w_t = sum_{k<=t} e[t,k] l_k, causal, with geometric decay lambda^(t-k);
- P-trace normalises the decay weights (log w_t = N_t / D_t, N_t = lambda N_{t-1} + l_t,
  D_t = lambda D_{t-1} + 1), so w_t is a weighted geometric mean of past ratios and stays inside
  any box that holds every single ratio (our reading of "partial trust region preservation");
  the unnormalised ("accumulating") trace z_t = lambda z_{t-1} + l_t is offered as an option;
- S-trace runs the same recursion over a kept set M only (high-entropy tokens, chosen by the
  caller, e.g. `tokencredit.credit.entropy.top_entropy_mask`); other tokens get no loss term and
  do not enter the trace; decay is counted in kept steps (default) or in absolute positions;
- the weights enter PPO-clip in place of the per-token ratio.

The one property the paper states precisely holds exactly: lambda = 1 with the normalised kernel,
read at the last token and given to every token, is GSPO's sequence ratio; lambda = 0 is the
per-token ratio.

GRPO(lambda) (Parthasarathi et al. 2025, arXiv 2510.00194; the baseline S-trace compares
against) puts an unnormalised trace inside the ratio, log w_t = sum_{j<=t} tr(t, j) l_j with
d = gamma * lambda and the kernels "recent" tr = d^(t-j) (the accumulating trace with lam = d)
and "both" tr = max(d^(t-j), d^j), then the PPO clip. This is the form independent
re-implementations report for its Sec. 3.2, Eq. (2) (docs/spec/strace.md, GRPO(lambda) section); the paper's full text and its
gamma / lambda values were not reachable, so the defaults (gamma 1, lambda 0.95, "recent") are
ours. Positions j, t count valid tokens.

Numerics: the closed form lambda^t * cumsum(lambda^(-k) l_k) overflows for long responses. We
evaluate the causal filter y_t = sum_{k<=t} lambda^(t-k) x_k as a chunked scan in which every
power of lambda has a non-negative exponent: inside a chunk of C positions a [C,C] Toeplitz
matmul, across chunks the same filter applied (recursively) to the chunk-end states with decay
lambda^C. No loop over tokens or over chunks; memory O(N T); exact gradients through autograd.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tokencredit.batch import RolloutBatch
from tokencredit.credit.entropy import DEFAULT_WINDOW, entropy_kept_set
from tokencredit.errors import ConfigError
from tokencredit.objectives.kernels import Preparation, needs_keep, register_kernel

__all__ = [
    "DECAYS",
    "GRPO_LAMBDA_TRACES",
    "KEPT_SET",
    "causal_decay_filter",
    "grpo_lambda_log_weights",
    "kept_set",
    "trace_log_weights",
]

DECAYS = ("kept", "position")
GRPO_LAMBDA_TRACES = ("recent", "both")
_CHUNK = 128


def _decay_matrix(size: int, lam: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    """[size, size] lower-triangular K[i, j] = lam^(i - j) for j <= i (0^0 = 1), 0 above the diagonal."""
    idx = torch.arange(size, device=device)
    diff = idx[:, None] - idx[None, :]
    powers = torch.pow(torch.tensor(lam, dtype=dtype, device=device), diff.clamp(min=0).to(dtype))
    return torch.where(diff >= 0, powers, torch.zeros((), dtype=dtype, device=device))


def causal_decay_filter(x: Tensor, lam: float, chunk: int = _CHUNK) -> Tensor:
    """y[r, t] = sum_{k<=t} lam^(t-k) x[r, k] for x [R, L], lam in [0, 1]; differentiable in x.

    Chunked scan: within chunks of `chunk` positions a Toeplitz matmul; the carry between chunks
    obeys the same recursion with decay lam^chunk, so it is computed by the same function on the
    [R, L/chunk] chunk-end states (depth log_chunk(L)). All exponents are >= 0: no overflow.
    """
    r, length = x.shape
    if length <= chunk:
        return x @ _decay_matrix(length, lam, x.dtype, x.device).T
    n_chunks = -(-length // chunk)
    pad = n_chunks * chunk - length
    xb = torch.nn.functional.pad(x, (0, pad)).view(r, n_chunks, chunk)
    intra = xb @ _decay_matrix(chunk, lam, x.dtype, x.device).T  # [R, B, C], chunk-local states
    # state at the end of chunk b: S_b = lam^C S_{b-1} + intra[b, C-1]
    ends = causal_decay_filter(intra[..., -1], lam**chunk, chunk)
    carry = torch.nn.functional.pad(ends[:, :-1], (1, 0))  # S_{b-1}, 0 before the first chunk
    steps = torch.arange(1, chunk + 1, device=x.device, dtype=x.dtype)
    lead_in = torch.pow(torch.tensor(lam, dtype=x.dtype, device=x.device), steps)  # lam^(i+1)
    y = intra + carry[..., None] * lead_in
    return y.reshape(r, n_chunks * chunk)[:, :length]


def trace_log_weights(
    log_ratio: Tensor,
    mask: Tensor,
    lam: float,
    normalized: bool = True,
    keep: Tensor | None = None,
    decay: str = "kept",
) -> Tensor:
    """Log importance weights log w [N,T] of the eligibility-trace kernels (OUR RECONSTRUCTION).

    Over 60 lines on purpose: the reconstruction's one recursion (both decays, normalised or not,
    with or without a kept set) as one readable vectorised scan.

    Reconstructed from the abstract of Mou et al. 2026 (arXiv 2605.05965); see the module
    docstring for the assumptions. With A = mask & keep the active tokens (A = mask when keep is
    None) and c_t a clock that advances by one per active token (decay="kept") or per position
    (decay="position"):

        N_t = sum_{k<=t, k in A} lam^(c_t - c_k) l_k,   D_t = sum_{k<=t, k in A} lam^(c_t - c_k)
        log w_t = N_t / D_t   (normalized=True: P-trace; with keep: S-trace)
        log w_t = N_t         (normalized=False: accumulating trace)

    for t in A, and 0 elsewhere. lam = 0 gives log w_t = l_t; lam = 1 with normalized=True gives
    the running mean of l, whose value at the last token is GSPO's log s_i.

    log_ratio [N,T] float (gradient flows through it; values at inactive positions are ignored,
    NaN included), mask [N,T] bool/0-1, keep [N,T] bool/0-1 or None. Computed in float32 (float64
    if log_ratio is float64); safe for any T.
    """
    if log_ratio.dim() != 2:
        raise ValueError(f"trace_log_weights: log_ratio must be [N, T], got shape {tuple(log_ratio.shape)}")
    if tuple(mask.shape) != tuple(log_ratio.shape):
        raise ValueError(
            f"trace_log_weights: mask shape {tuple(mask.shape)} differs from log_ratio shape {tuple(log_ratio.shape)}"
        )
    lam = float(lam)
    if not 0.0 <= lam <= 1.0:
        raise ConfigError(f"trace decay lam must be in [0, 1], got {lam}")
    if decay not in DECAYS:
        raise ConfigError(f"trace decay must be one of {DECAYS}, got {decay!r}")
    active = mask.bool()
    if keep is not None:
        if tuple(keep.shape) != tuple(log_ratio.shape):
            raise ValueError(
                f"trace_log_weights: keep shape {tuple(keep.shape)} differs from log_ratio shape {tuple(log_ratio.shape)}"
            )
        active = active & keep.bool()

    dtype = torch.float64 if log_ratio.dtype == torch.float64 else torch.float32
    zero = torch.zeros((), dtype=dtype, device=log_ratio.device)
    x = torch.where(active, log_ratio.to(dtype), zero)
    # When every row's active tokens form a prefix (right padding, no kept-set holes) both decays
    # share the clock c_t = t. Otherwise "kept" compacts each row's active tokens to a prefix.
    prefix = bool((active[:, 1:] <= active[:, :-1]).all()) if active.shape[1] > 1 else True
    if prefix or decay == "kept":
        if prefix:
            num = causal_decay_filter(x, lam)
            clock = torch.arange(x.shape[1], device=x.device).expand_as(x)
        else:
            # Permutation that moves each row's active tokens, in order, to the front.
            n_act = active.sum(-1, keepdim=True)
            dest = torch.where(active, active.cumsum(-1) - 1, n_act + (~active).cumsum(-1) - 1)
            compact = torch.zeros_like(x).scatter(1, dest, x)
            num = causal_decay_filter(compact, lam).gather(1, dest)
            clock = torch.where(active, active.cumsum(-1) - 1, 0)
        den = _geometric_sum(clock, lam, dtype) if normalized else None
    else:
        num = causal_decay_filter(x, lam)
        with torch.no_grad():
            den = causal_decay_filter(active.to(dtype), lam) if normalized else None
    if den is not None:  # normalized: the P-trace / S-trace weight N_t / D_t
        num = num / torch.where(active, den, torch.ones((), dtype=dtype, device=x.device))
    return torch.where(active, num, zero)


def _geometric_sum(clock: Tensor, lam: float, dtype: torch.dtype) -> Tensor:
    """sum_{i=0..c} lam^i for an integer tensor c >= 0 (float64 internally: stable for lam near 1)."""
    c = clock.to(torch.float64) + 1.0
    if lam == 1.0:
        return c.to(dtype)
    if lam == 0.0:
        return torch.ones_like(c, dtype=dtype)
    log_lam = math.log(lam)
    return (torch.expm1(c * log_lam) / math.expm1(log_lam)).to(dtype)


def kept_set(
    batch: RolloutBatch,
    keep_ratio: float = 0.2,
    scope: str = "batch",
    frame: str = "global",
    window: int = DEFAULT_WINDOW,
    temperature: float = 1.0,
) -> dict[str, Tensor]:
    """S-trace's kept set, detached: the top-`keep_ratio` old-policy entropy tokens, as the 80/20 rule selects
    them, ranked by raw entropy (frame="global", the reconstruction's default) or by PEPO's proximal entropy
    (frame="proximal", Kim & Kwak 2026 Eq. 6, with its `window` and `temperature`; our extension: PEPO
    applies the proximal frame to the 80/20 rule only)."""
    keep = entropy_kept_set(
        batch, keep_ratio, scope, frame, window, temperature, "strace", "S-trace's kept set"
    )
    return {"keep": keep}


KEPT_SET = Preparation(kept_set, needs=frozenset({"entropy"}), provides=frozenset({"keep"}))


# The trace kernels' faithfulness, shown by the documentation's catalog (docs/methods.md has the details).
_TRACE_RECONSTRUCTION = (
    "only the abstract of Mou et al. 2026 (arXiv 2605.05965) was available: the normalised causal trace, "
    "the kept set and the decay are our reading of it"
)
_GRPO_LAMBDA_RECONSTRUCTION = (
    "the form independent re-implementations report for Parthasarathi et al. 2025, Eq. (2) (the full text was "
    "not reachable); gamma 1, lambda 0.95 and the 'recent' trace are our defaults"
)


@register_kernel("ptrace", reconstruction=_TRACE_RECONSTRUCTION)
def _ptrace_kernel(log_ratio: Tensor, mask: Tensor, lam: float = 0.95, decay: str = "kept") -> Tensor:
    """P-trace (our reconstruction of Mou et al. 2026): normalised causal trace over all valid tokens."""
    return trace_log_weights(log_ratio, mask, lam, normalized=True, keep=None, decay=decay)


@register_kernel("accumulating", reconstruction=_GRPO_LAMBDA_RECONSTRUCTION)
def _accumulating_kernel(log_ratio: Tensor, mask: Tensor, lam: float = 0.95, decay: str = "kept") -> Tensor:
    """Accumulating trace z_t = lam z_{t-1} + l_t over all valid tokens (no trust-region property)."""
    return trace_log_weights(log_ratio, mask, lam, normalized=False, keep=None, decay=decay)


@register_kernel("strace", prepare=KEPT_SET, reconstruction=_TRACE_RECONSTRUCTION)
def _strace_kernel(
    log_ratio: Tensor, mask: Tensor, lam: float = 0.95, keep: Tensor | None = None, decay: str = "kept"
) -> Tensor:
    """S-trace (our reconstruction of Mou et al. 2026): the P-trace over the kept (high-entropy) tokens."""
    return trace_log_weights(
        log_ratio, mask, lam, normalized=True, keep=needs_keep("strace", keep), decay=decay
    )


def grpo_lambda_log_weights(log_ratio: Tensor, mask: Tensor, decay: float, trace: str = "recent") -> Tensor:
    """GRPO(lambda)'s log importance weights [N,T]: log w_t = sum_{j<=t} tr(t, j) l_j over valid tokens, 0 elsewhere.

    trace="recent": tr = decay^(t-j), the accumulating trace. trace="both": tr = max(decay^(t-j), decay^j),
    evaluated without a [T, T] matrix: for j >= ceil(t/2) the first term is the larger, so
    log w_t = (y_t - decay^(t-c+1) y_{c-1}) + S_{c-1} with c = ceil(t/2), y the recent trace and
    S_k = sum_{j<=k} decay^j l_j (every power has a non-negative exponent). decay = gamma * lambda in [0, 1].
    """
    decay = float(decay)
    if not 0.0 <= decay <= 1.0:
        raise ConfigError(f"GRPO(lambda): gamma * lam must be in [0, 1], got {decay}")
    if trace not in GRPO_LAMBDA_TRACES:
        raise ConfigError(f"GRPO(lambda) trace must be one of {GRPO_LAMBDA_TRACES}, got {trace!r}")
    if trace == "recent":
        return trace_log_weights(log_ratio, mask, decay, normalized=False, keep=None, decay="kept")
    if log_ratio.dim() != 2 or tuple(mask.shape) != tuple(log_ratio.shape):
        raise ValueError(
            f"grpo_lambda_log_weights: expected log_ratio and mask [N, T], got {tuple(log_ratio.shape)} and "
            f"{tuple(mask.shape)}"
        )
    active = mask.bool()
    dtype = torch.float64 if log_ratio.dtype == torch.float64 else torch.float32
    zero = torch.zeros((), dtype=dtype, device=log_ratio.device)
    x = torch.where(active, log_ratio.to(dtype), zero)
    n, length = x.shape
    prefix = bool((active[:, 1:] <= active[:, :-1]).all()) if length > 1 else True
    dest: Tensor | None = None  # set when the rows are compacted: where each token went
    if not prefix:  # move each row's valid tokens, in order, to the front (positions count valid tokens)
        n_act = active.sum(-1, keepdim=True)
        dest = torch.where(active, active.cumsum(-1) - 1, n_act + (~active).cumsum(-1) - 1)
        x = torch.zeros_like(x).scatter(1, dest, x)
    t = torch.arange(length, device=x.device)
    c = (t + 1) // 2  # first position of the "recent" half
    prev = (c - 1).clamp(min=0)
    powers = torch.pow(torch.tensor(decay, dtype=torch.float64, device=x.device), t.double())
    y = causal_decay_filter(x, decay)
    lead = torch.where(c >= 1, powers[(t - c + 1).clamp(max=length - 1)], torch.zeros_like(powers)).to(dtype)
    recent = y - lead * y[:, prev]
    head = torch.cumsum(powers.to(dtype) * x, -1)[:, prev]
    out = recent + torch.where(c >= 1, head, torch.zeros_like(head))
    if dest is not None:
        out = out.gather(1, dest)
    return torch.where(active, out, zero)


@register_kernel("grpo-lambda", reconstruction=_GRPO_LAMBDA_RECONSTRUCTION)
def _grpo_lambda_kernel(
    log_ratio: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 0.95, trace: str = "recent"
) -> Tensor:
    """GRPO(lambda) (Parthasarathi et al. 2025): the trace tr(t, j) of decay gamma * lam inside the ratio."""
    return grpo_lambda_log_weights(log_ratio, mask, gamma * lam, trace)

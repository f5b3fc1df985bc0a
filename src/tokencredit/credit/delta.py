"""DelTA: discriminative token credit assignment (Zhang, Wu, Lin 2026, arXiv 2605.21467).

The paper body was not available to us: this module follows the released code
(github.com/RUCBM/DelTA, `dp_actor.py::compute_log_prob_h`) as documented in docs/spec/delta.md;
the centroid-discriminator reading below is our reconstruction of the paper's argument.

Each valid response token t carries a last-layer token-gradient proxy v_t = s_t h_t, with h_t
the final hidden state (after the final norm) and s_t = 1 - pi_old(y_t). Over the whole batch,
with P / Q / Z the tokens of rollouts with A > 0 / A < 0 / A = 0 (Z excluded from all
statistics):

    mu+ = sum_P w |A| v / sum_P w |A|,   mu- likewise over Q       (w = 1 at first)
    m_t = |v - mu-|^2 - |v - mu+|^2 on P,  |v - mu+|^2 - |v - mu-|^2 on Q
    gamma+/- = population std of m over P / Q (variance floored at 1e-8)
    K refinements (the released code's disc_steps loop): gamma <- std(m_0); for k = 1..K:
    w = sigmoid(m_{k-1} / gamma); gamma <- std(m_{k-1}); new centroids from w; m_k <- margins.
    So the sigmoid of m_{k-1} uses the std of m_{k-2} (m_0 its own), and the final one std(m_{K-1}).
    c = lam_min + (lam_max - lam_min) sigmoid(m_K / gamma_side);  c = lam_min on Z
    c~ = c * N_valid / sum c  (mean 1 over all valid tokens),   Â = A * c~

Margins are affine in v: on P, m = 2 s h . (mu+ - mu-) + |mu-|^2 - |mu+|^2 (negated on Q),
and centroids are weighted sums of h, so the computation is two passes over h per stage
(one batched mat-vec giving per-rollout weighted sums for both centroids, one mat-vec for the
margins) and never builds v or any other [N_tok, H] temporary. Work is float32; bf16 / fp16 hidden states are upcast one chunk
of rollouts at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from tokencredit.batch import RolloutBatch
from tokencredit.credit.registry import register
from tokencredit.distributed import Shard, all_sum
from tokencredit.errors import ConfigError

# Elements per float32 block when hidden states must be upcast or copied (64 MiB: few blocks,
# since each block costs a few parallel-region launches).
_CHUNK_ELEMS = 1 << 24
_VAR_FLOOR = 1e-8
_DEN_FLOOR = 1e-8


@dataclass(frozen=True)
class DeltaTerms:
    """Coefficients and the intermediate quantities that produced them.

    coefficients: c~ [N,T] float32, mean 1 over valid tokens, 0 where masked.
    raw: c [N,T] before self-normalisation (lam_min on Z tokens, 0 where masked).
    margins / initial_margins: m [N,T] after the last / before the first refinement
      (0 on Z and masked tokens).
    centroids: ((mu+, mu-), ...) [H] each: the initial pair, then one pair per refinement.
    gammas: (gamma+, gamma-) 0-dim tensors used in the final sigmoid.
    """

    coefficients: Tensor
    raw: Tensor
    margins: Tensor
    initial_margins: Tensor
    centroids: tuple[tuple[Tensor, Tensor], ...]
    gammas: tuple[Tensor, Tensor]


# ---------------------------------------------------------------------------- passes over h
def _upcast_buffer(hidden: Tensor) -> Tensor | None:
    """The float32 block buffer the passes over `hidden` share, or None when no copy is needed.

    One buffer per `discriminate` call, reused by every pass: a fresh 64 MiB block per pass costs
    more in page faults than the copy itself (docs/experiments/credit-cost.md#hidden-state-statistics-per-data-parallel-rank).
    """
    n, t, h = hidden.shape
    if hidden.dtype == torch.float32 and hidden.is_contiguous():
        return None
    rows = max(1, min(n, _CHUNK_ELEMS // max(1, t * h)))
    return torch.empty(rows, t, h, dtype=torch.float32, device=hidden.device)


def _row_blocks(hidden: Tensor, buf: Tensor | None) -> Iterator[tuple[int, int, Tensor]]:
    """(i0, i1, hidden[i0:i1] as a contiguous float32 [B,T,H] tensor).

    Contiguous float32 input (buf None) is one zero-copy block; anything else (bf16, fp16, strided)
    is upcast / copied into `buf` one block of rollouts at a time, so no full float32 copy is made.
    """
    n = hidden.shape[0]
    if buf is None:
        yield 0, n, hidden
        return
    rows = buf.shape[0]
    for i0 in range(0, n, rows):
        i1 = min(n, i0 + rows)
        block = buf[: i1 - i0]
        block.copy_(hidden[i0:i1])
        yield i0, i1, block


def _project(hidden: Tensor, buf: Tensor | None, direction: Tensor) -> Tensor:
    """[N,T] float32: h[i,t] . direction (one mat-vec pass over h)."""
    n, t, h = hidden.shape
    out = torch.empty(n, t, dtype=torch.float32, device=hidden.device)
    for i0, i1, block in _row_blocks(hidden, buf):
        torch.mv(block.view(-1, h), direction, out=out[i0:i1].view(-1))
    return out


def _rollout_sums(hidden: Tensor, buf: Tensor | None, weights: Tensor) -> Tensor:
    """[N,H] float32: sum over t of weights[i,t] * h[i,t] (one batched mat-vec pass over h).

    Per-rollout sums serve both centroids in one pass, because a rollout's tokens all sit on
    the same side (P or Q); MKL's gemm with two output rows is ~2x slower than this.
    """
    n, _, h = hidden.shape
    out = torch.empty(n, h, dtype=torch.float32, device=hidden.device)
    for i0, i1, block in _row_blocks(hidden, buf):
        torch.bmm(weights[i0:i1].unsqueeze(1), block, out=out[i0:i1].unsqueeze(1))
    return out


# ---------------------------------------------------------------------------- statistics
# A rollout's tokens all share its side (sign of A_i), so side bookkeeping is per rollout ([N]
# tensors) and per-token work is a handful of [N,T] element-wise ops per stage.
class _Sides:
    """Per-rollout side (sign of A), token counts per side, and the side statistics.

    Under a shard every side total is the sum over ranks (`all_sum`), so the statistics are the
    whole batch's on every rank.
    """

    def __init__(self, adv: Tensor, valid: Tensor, shard: Shard | None) -> None:
        self.shard = shard
        self.sign = torch.sign(adv)  # [N] +1 P, -1 Q, 0 Z
        self.pos, self.neg = self.sign > 0, self.sign < 0
        lengths = valid.sum(1).to(torch.float64)
        self.count_pos, self.count_neg = self.side_sums(lengths)
        self.abs_len = adv.abs().to(torch.float64) * lengths  # sum over a row's tokens of |A|

    def side_sums(self, per_row: Tensor) -> tuple[Tensor, ...]:
        """(sum over P rows, sum over Q rows) of float64 per-row values [N, ...], summed over ranks in one call."""
        local = torch.stack([per_row[self.pos].sum(0), per_row[self.neg].sum(0)])
        return tuple(all_sum(local, self.shard).unbind(0))

    def temperatures(self, margins: Tensor, valid_f: Tensor) -> tuple[Tensor, Tensor]:
        """Population std of the margins over P and over Q (variance floored at 1e-8), float32."""
        sum_pos, sum_neg = self.side_sums(margins.sum(1).to(torch.float64))
        mean_pos = sum_pos / self.count_pos.clamp(min=1)
        mean_neg = sum_neg / self.count_neg.clamp(min=1)
        row_mean = torch.where(self.pos, mean_pos, torch.where(self.neg, mean_neg, 0.0)).to(torch.float32)
        # Two-pass variance: margins are not centred, so E[m^2] - E[m]^2 could cancel.
        dev = margins - row_mean[:, None]
        sq_pos, sq_neg = self.side_sums(dev.square_().mul_(valid_f).sum(1).to(torch.float64))
        var_pos = sq_pos / self.count_pos.clamp(min=1)
        var_neg = sq_neg / self.count_neg.clamp(min=1)
        return (
            var_pos.clamp(min=_VAR_FLOOR).sqrt().to(torch.float32),
            var_neg.clamp(min=_VAR_FLOOR).sqrt().to(torch.float32),
        )

    def row_gamma(self, gammas: tuple[Tensor, Tensor]) -> Tensor:
        """[N,1] gamma of each rollout's side (gamma- on Z rows, whose margins are 0 anyway)."""
        return torch.where(self.pos, gammas[0], gammas[1])[:, None]


def _centroids(
    hidden: Tensor, buf: Tensor | None, weights: Tensor, den_rows: Tensor, sides: _Sides
) -> tuple[Tensor, Tensor]:
    """mu+/- = sum_side weights * h / max(sum_side den, 1e-8), float32 [H] each.

    weights [N,T] = omega * s (0 on Z rows and masked positions); den_rows [N] = a row's sum of
    omega (the centroid denominators do not include s).
    """
    per_rollout = _rollout_sums(hidden, buf, weights)
    if not bool(torch.isfinite(per_rollout).all()):
        i = int((~torch.isfinite(per_rollout)).any(1).nonzero()[0, 0])
        raise ValueError(
            f"DelTA: hidden states / proxy of rollout {i} hold inf or NaN (masked positions are read "
            "too with weight 0, so padding must be finite, e.g. zeros); the centroid sums are not finite"
        )
    # One reduction per stage: [2, H + 1] (the side sums and their denominators).
    rows = torch.cat([per_rollout.to(torch.float64), den_rows.to(torch.float64)[:, None]], 1)
    sum_pos, sum_neg = sides.side_sums(rows)
    mu_pos = (sum_pos[:-1] / sum_pos[-1].clamp(min=_DEN_FLOOR)).to(torch.float32)
    mu_neg = (sum_neg[:-1] / sum_neg[-1].clamp(min=_DEN_FLOOR)).to(torch.float32)
    return mu_pos, mu_neg


def _margins(
    hidden: Tensor,
    buf: Tensor | None,
    scale: Tensor,
    valid_f: Tensor,
    mu_pos: Tensor,
    mu_neg: Tensor,
    sides: _Sides,
) -> Tensor:
    """m [N,T] = side * (2 s h.(mu+ - mu-) + |mu-|^2 - |mu+|^2): |v - mu_other|^2 - |v - mu_own|^2.

    0 on Z rows and masked positions (s = 0 and valid_f = 0 there).
    """
    proj = _project(hidden, buf, mu_pos - mu_neg)
    offset = (mu_neg.double().square().sum() - mu_pos.double().square().sum()).to(torch.float32)
    m = torch.add(valid_f * offset, proj.mul_(scale), alpha=2.0)
    return m.mul_(sides.sign[:, None])


def _check(
    hidden: Tensor,
    scale: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    lam_min: float,
    lam_max: float,
    refine_iters: int,
    what: str,
) -> None:
    if hidden.dim() != 3 or not hidden.dtype.is_floating_point:
        raise ValueError(
            f"{what}: expected a floating tensor of shape [N, T, H], got {tuple(hidden.shape)} {hidden.dtype}"
        )
    n, t, _ = hidden.shape
    if tuple(mask.shape) != (n, t):
        raise ValueError(f"mask: expected shape ({n}, {t}), got {tuple(mask.shape)}")
    if tuple(advantages.shape) != (n,):
        raise ValueError(f"advantages: expected shape ({n},), got {tuple(advantages.shape)}")
    bad = ~torch.isfinite(advantages)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"advantages: non-finite value {advantages[i].item()} at rollout {i}")
    if scale is not None:
        if tuple(scale.shape) != (n, t):
            raise ValueError(f"scale: expected shape ({n}, {t}), got {tuple(scale.shape)}")
        bad = ~torch.isfinite(scale) & mask.bool()
        if bool(bad.any()):
            i, j = (int(x) for x in bad.nonzero()[0])
            raise ValueError(f"scale: non-finite value at rollout {i}, token {j}")
    if not 0.0 < lam_min <= lam_max:
        raise ConfigError(f"DelTA needs 0 < lam_min <= lam_max, got lam_min={lam_min}, lam_max={lam_max}")
    if isinstance(refine_iters, bool) or not isinstance(refine_iters, int) or refine_iters < 0:
        raise ConfigError(f"DelTA refine_iters must be an integer >= 0, got {refine_iters!r}")


# ---------------------------------------------------------------------------- public API
def discriminate(
    hidden: Tensor,
    scale: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    lam_min: float = 0.8,
    lam_max: float = 1.2,
    refine_iters: int = 1,
    *,
    shard: Shard | None = None,
) -> DeltaTerms:
    """DelTA coefficients for proxies v = scale * hidden, with every intermediate (DeltaTerms).

    Over 60 lines on purpose: steps 1-6 of docs/spec/delta.md (centroids, margins, temperatures, refinements,
    sigmoid, normalisation) read top to bottom in one place, as the released code's loop does.

    hidden [N,T,H] float (bf16/fp16 are upcast per chunk), scale [N,T] (s = 1 - p_old; None
    means 1, i.e. `hidden` already is the proxy), advantages [N], mask [N,T] bool/0-1.
    Scope is the whole batch. Masked positions of `hidden` are read (weight 0) and must be finite.
    `shard`: this process holds only its rows of a batch split across ranks (`tokencredit.distributed`);
    the statistics (side counts, centroid sums, margin moments, the normaliser) are then summed over
    the ranks, one all-reduce each, so every rank gets its rows of the whole batch's c~. Collective:
    every rank calls it, also one without rollouts.

    Degenerate inputs give finite, documented values:
    - no token with A != 0 (all-zero advantages, e.g. only all-correct / all-wrong /
      single-rollout groups under GRPO): c~ = 1 on every valid token (so Â = A c~ = 0),
      centroids are zero, gammas are 1e-4, and `hidden` is not read;
    - no valid token at all (empty responses): c~ = 0 everywhere; rows without valid tokens
      are 0;
    - only positive (or only negative) rollouts: the missing side's centroid is the zero vector
      (its denominator clamps at 1e-8), so margins compare each token with its own centroid
      and the origin: m = |v|^2 - |v - mu_own|^2;
    - a side whose margins are constant (e.g. a single token) has gamma = 1e-4, so its
      sigmoid saturates at 0, 1/2 or 1.
    """
    _check(hidden, scale, advantages, mask, lam_min, lam_max, refine_iters, "hidden")
    n, t, h = hidden.shape
    device = hidden.device
    valid = mask.to(device) != 0
    valid_f = valid.to(torch.float32)
    adv = advantages.to(device=device, dtype=torch.float32)
    sides = _Sides(adv, valid, shard)
    s = valid_f if scale is None else torch.where(valid, scale.to(device=device, dtype=torch.float32), 0.0)
    abs_adv = adv.abs()[:, None]
    floor = torch.tensor(_VAR_FLOOR, dtype=torch.float32, device=device).sqrt()

    # Decided on whole-batch counts, so all ranks take the same branch (and make the same collectives).
    if bool(sides.count_pos + sides.count_neg > 0):
        # Initial weights omega = |A| (0 on Z rows, since |A| = 0 there).
        base = s * abs_adv
        buf = _upcast_buffer(hidden)
        mu_pos, mu_neg = _centroids(hidden, buf, base, sides.abs_len, sides)
        centroids = [(mu_pos, mu_neg)]
        margins = _margins(hidden, buf, s, valid_f, mu_pos, mu_neg, sides)
        initial = margins
        # The released code's disc_steps loop (dp_actor.py::compute_log_prob_h): the sigmoid of
        # margins m_{k-1} uses the temperature of m_{k-2} (m_0's own for k = 1); the temperature
        # is then updated to std(m_{k-1}), which the next sigmoid (or the final one) uses.
        gammas = sides.temperatures(margins, valid_f)
        for _ in range(refine_iters):
            sig = torch.sigmoid(margins / sides.row_gamma(gammas))
            gammas = sides.temperatures(margins, valid_f)
            den_rows = (sig * valid_f).sum(1).to(torch.float64) * abs_adv[:, 0].to(torch.float64)
            mu_pos, mu_neg = _centroids(hidden, buf, sig.mul_(base), den_rows, sides)
            centroids.append((mu_pos, mu_neg))
            margins = _margins(hidden, buf, s, valid_f, mu_pos, mu_neg, sides)
        sig = torch.sigmoid(margins / sides.row_gamma(gammas))
        scored = (sides.sign != 0)[:, None] & valid
        raw = torch.where(scored, sig.mul_(lam_max - lam_min).add_(lam_min), valid_f * lam_min)
        gam_pos, gam_neg = gammas
    else:
        margins = initial = torch.zeros(n, t, dtype=torch.float32, device=device)
        zeros_h = torch.zeros(h, dtype=torch.float32, device=device)
        centroids = [(zeros_h, zeros_h)] * (refine_iters + 1)
        gam_pos = gam_neg = floor
        raw = valid_f * lam_min

    n_valid, total = all_sum(
        torch.stack([valid_f.sum(dtype=torch.float64), raw.sum(dtype=torch.float64)]), shard
    )
    factor = torch.where(n_valid > 0, n_valid / total.clamp(min=1e-30), 0.0).to(torch.float32)
    return DeltaTerms(raw * factor, raw, margins, initial, tuple(centroids), (gam_pos, gam_neg))


def coefficients_from_hidden(
    hidden: Tensor,
    scale: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    lam_min: float = 0.8,
    lam_max: float = 1.2,
    refine_iters: int = 1,
    *,
    shard: Shard | None = None,
) -> Tensor:
    """c~[N,T] for the proxy v = scale[..., None] * hidden, without materialising v.

    See `discriminate` for shapes, `shard` and the values on degenerate inputs.
    """
    return discriminate(
        hidden, scale, advantages, mask, lam_min, lam_max, refine_iters, shard=shard
    ).coefficients


def coefficients(
    proxy: Tensor,
    advantages: Tensor,
    mask: Tensor,
    lam_min: float = 0.8,
    lam_max: float = 1.2,
    refine_iters: int = 1,
) -> Tensor:
    """DelTA token coefficients c~[N,T] from proxies v [N,T,H] (docs/spec/delta.md#coefficients-steps-1-7, steps 1-6).

    advantages A[N], mask [N,T]. Returns float32, mean 1 over valid tokens, 0 where masked.
    Degenerate inputs: see `discriminate` (e.g. an all-zero-advantage batch gives c~ = 1 on
    every valid token).
    """
    return coefficients_from_hidden(proxy, None, advantages, mask, lam_min, lam_max, refine_iters)


@register(
    "delta",
    needs=("hidden", "old_log_probs"),
    paper="Zhang, Wu, Lin, DelTA, 2026 (arXiv 2605.21467); follows the released code",
    reduced="delta_coefficients",
)
def delta(
    batch: RolloutBatch,
    advantages: Tensor,
    lam_min: float = 0.8,
    lam_max: float = 1.2,
    refine_iters: int = 1,
) -> Tensor:
    """Discriminative token credit: Â[i,t] = A_i * c~[i,t], proxy v = (1 - p_old) * h.

    A batch carrying `delta_coefficients` (c~ computed where the hidden states live, e.g. verl's workers,
    with these hyperparameters and these A; the engine checks the A) gives Â = A c~ without reading h.
    """
    if batch.delta_coefficients is not None:
        return advantages.float()[:, None] * batch.delta_coefficients.float()
    return advantages.float()[:, None] * delta_coefficients(batch, advantages, lam_min, lam_max, refine_iters)


def delta_coefficients(
    batch: RolloutBatch, advantages: Tensor, lam_min: float = 0.8, lam_max: float = 1.2, refine_iters: int = 1
) -> Tensor:
    """c~ [N,T] of a batch carrying `hidden` and `old_log_probs` (the proxy's s = 1 - p_old), for A [N];
    the whole batch's statistics when `batch.shard` is set (collective)."""
    who = "credit method 'delta'"
    logp = batch.signal("old_log_probs", who).to(torch.float32)
    bad = (logp > 1e-3) & batch.mask
    if bool(bad.any()):
        i, j = (int(x) for x in bad.nonzero()[0])
        raise ValueError(
            f"old_log_probs: value {logp[i, j].item()} > 0 at rollout {i}, token {j} (not a log-probability)"
        )
    # 1 - p via expm1 keeps precision for small p; clamp absorbs rounding of log p ~ 0.
    scale = (-torch.expm1(logp)).clamp(0.0, 1.0)
    return coefficients_from_hidden(
        batch.signal("hidden", who),
        scale,
        advantages,
        batch.mask,
        lam_min,
        lam_max,
        refine_iters,
        shard=batch.shard,
    )

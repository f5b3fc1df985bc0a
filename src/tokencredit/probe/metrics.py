"""The probe's rank and mass metrics: pure functions of a credit tensor, a mask and target tokens.

Ties. Tokens whose credit equals the target's (within ``rtol`` x the row's largest |Â|) are
ranked in random order, and every metric is the *expectation* over that order: with ``a`` tokens
strictly ranked before the target and ``e`` tied tokens (target included), hit@k =
clamp(k - a, 0, e) / e and rank = a + (e + 1) / 2. Uniform credit is therefore exactly at chance,
hit@k = min(k, L) / L. The targets can come from any ground truth (the synthetic task's first wrong
token, or another oracle's choice of token).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tokencredit.data.synthetic import LABELS

__all__ = [
    "DEFAULT_RTOL",
    "blame_hits",
    "expected_hits",
    "mass_shares",
    "mean_of",
    "mean_rank",
    "random_credit",
    "stderr_of",
    "target_ranks",
    "tie_counts",
    "uniform_credit",
]

DEFAULT_RTOL = 1e-6


def mean_of(x: Tensor) -> float | None:
    """Mean over rollouts of a per-rollout number (None when there is no rollout)."""
    return float(x.double().mean()) if x.numel() else None


def stderr_of(x: Tensor) -> float | None:
    """Standard error of the mean over rollouts (None below 2 rollouts)."""
    return float(x.double().std() / math.sqrt(x.numel())) if x.numel() >= 2 else None


def _check_ranked(
    credit: Tensor, mask: Tensor, target_pos: Tensor, who: str
) -> tuple[Tensor, Tensor, Tensor]:
    """(credit float64, mask bool, target int64) after checking shapes, target validity and finiteness."""
    if credit.dim() != 2:
        raise ValueError(f"{who}: credit must be [N, T], got shape {tuple(credit.shape)}")
    if tuple(mask.shape) != tuple(credit.shape):
        raise ValueError(f"{who}: mask shape {tuple(mask.shape)} differs from credit {tuple(credit.shape)}")
    n, t = credit.shape
    if (
        tuple(target_pos.shape) != (n,)
        or target_pos.dtype.is_floating_point
        or target_pos.dtype == torch.bool
    ):
        raise ValueError(
            f"{who}: target_pos must be an integer tensor of shape ({n},), got {tuple(target_pos.shape)} "
            f"{target_pos.dtype}"
        )
    m = mask.bool()
    tgt = target_pos.long().to(credit.device)
    out_of_range = (tgt < 0) | (tgt >= t)
    if bool(out_of_range.any()):
        i = int(out_of_range.nonzero()[0])
        raise ValueError(f"{who}: target position {int(tgt[i])} of rollout {i} is outside [0, {t})")
    off = ~m.gather(1, tgt[:, None]).squeeze(1)
    if bool(off.any()):
        i = int(off.nonzero()[0])
        raise ValueError(
            f"{who}: target position {int(tgt[i])} of rollout {i} is not a valid (masked-in) token"
        )
    x = credit.detach().double()
    bad = m & ~torch.isfinite(x)
    if bool(bad.any()):
        i, j = (int(v) for v in bad.nonzero()[0])
        raise ValueError(f"{who}: non-finite credit at rollout {i}, token {j}")
    return x, m, tgt


def tie_counts(
    credit: Tensor,
    mask: Tensor,
    target_pos: Tensor,
    *,
    descending: bool = False,
    rtol: float = DEFAULT_RTOL,
) -> tuple[Tensor, Tensor, Tensor]:
    """(ahead [N], tied [N], length [N]) int64 for the target token of every rollout.

    ahead: valid tokens ranked strictly before the target (credit smaller than the target's, or
    larger with ``descending``); tied: valid tokens whose credit equals the target's within
    ``rtol`` x the row's largest |credit| (the target included, so tied >= 1); length: valid tokens.
    """
    x, m, tgt = _check_ranked(credit, mask, target_pos, "tie_counts")
    if descending:
        x = -x
    xt = x.gather(1, tgt[:, None])
    tol = rtol * torch.where(m, x.abs(), torch.zeros((), dtype=x.dtype, device=x.device)).amax(
        1, keepdim=True
    )
    ahead = ((x < xt - tol) & m).sum(1)
    tied = (((x - xt).abs() <= tol) & m).sum(1)
    return ahead, tied, m.sum(1)


def expected_hits(
    credit: Tensor,
    mask: Tensor,
    target_pos: Tensor,
    k: int,
    *,
    descending: bool = False,
    rtol: float = DEFAULT_RTOL,
) -> Tensor:
    """[N] float64: P(target among the k first-ranked valid tokens), ties broken uniformly at random.

    Ranked by ascending credit (most negative first), or descending with ``descending``. With a
    tokens ahead and e tied: clamp(k - a, 0, e) / e, so all-equal credit gives min(k, L) / L.
    """
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    ahead, tied, _ = tie_counts(credit, mask, target_pos, descending=descending, rtol=rtol)
    return (k - ahead).clamp(min=0).minimum(tied).double() / tied.double()


def blame_hits(adv: Tensor, mask: Tensor, target_pos: Tensor, k: int) -> Tensor:
    """[N] float64 expected blame-hit@k: is the first wrong token among the k smallest Â of its rollout?

    adv: Â [N,T]; mask [N,T] valid tokens; target_pos [N] int: first wrong token per rollout
    (must be a valid token). Ties are broken uniformly at random (expectation; see the module doc).
    """
    return expected_hits(adv, mask, target_pos, k)


def target_ranks(adv: Tensor, mask: Tensor, target_pos: Tensor, *, descending: bool = False) -> Tensor:
    """[N] float64 expected rank of the target token (1 = most negative Â; ties at random: a + (e + 1) / 2)."""
    ahead, tied, _ = tie_counts(adv, mask, target_pos, descending=descending)
    return ahead.double() + (tied.double() + 1) / 2


def mean_rank(adv: Tensor, mask: Tensor, target_pos: Tensor) -> float:
    """Mean over rollouts of the expected rank of the first wrong token (1 = most negative); NaN-free (N >= 1)."""
    if target_pos.numel() == 0:
        raise ValueError("mean_rank: no rollout to average over")
    return float(target_ranks(adv, mask, target_pos).mean())


def mass_shares(
    adv: Tensor, mask: Tensor, labels: Tensor, n_labels: int = len(LABELS)
) -> tuple[Tensor, Tensor]:
    """(shares [N, n_labels] float64, defined [N] bool): per rollout, the share of sum |Â| on each label.

    labels [N,T] int: a code in [0, n_labels) at every valid token (`LABELS` order: format, computed,
    answer, free). Rows without credit mass (sum |Â| = 0) are not defined and get 0 shares.
    """
    if tuple(labels.shape) != tuple(adv.shape) or tuple(mask.shape) != tuple(adv.shape):
        raise ValueError(
            f"mass_shares: adv {tuple(adv.shape)}, mask {tuple(mask.shape)} and labels {tuple(labels.shape)} "
            "must have the same shape"
        )
    m = mask.bool()
    lab = labels.long()
    bad = m & ((lab < 0) | (lab >= n_labels))
    if bool(bad.any()):
        i, j = (int(v) for v in bad.nonzero()[0])
        raise ValueError(
            f"mass_shares: label {int(lab[i, j])} at rollout {i}, token {j} is not in [0, {n_labels})"
        )
    a = torch.where(m, adv.detach().double().abs(), torch.zeros((), dtype=torch.float64, device=adv.device))
    if bool((m & ~torch.isfinite(a)).any()):
        i, j = (int(v) for v in (m & ~torch.isfinite(a)).nonzero()[0])
        raise ValueError(f"mass_shares: non-finite credit at rollout {i}, token {j}")
    onehot = torch.nn.functional.one_hot(torch.where(m, lab, 0), n_labels).double()
    per_label = (a[..., None] * onehot).sum(1)
    total = a.sum(1)
    defined = total > 0
    shares = torch.where(
        defined[:, None], per_label / total.clamp(min=1e-300)[:, None], torch.zeros_like(per_label)
    )
    return shares, defined


def random_credit(mask: Tensor, generator: torch.Generator) -> Tensor:
    """[N,T] float32 i.i.d. standard-normal credit on valid tokens, 0 elsewhere (the chance baseline)."""
    m = mask.bool()
    z = torch.randn(m.shape, generator=generator, dtype=torch.float64).to(m.device)
    return torch.where(m, z, torch.zeros((), dtype=torch.float64, device=m.device)).float()


def uniform_credit(mask: Tensor, value: float = -1.0) -> Tensor:
    """[N,T] float32: one value on every valid token (GRPO's credit up to the row's sign and scale)."""
    m = mask.bool()
    return torch.where(m, torch.tensor(float(value)), torch.tensor(0.0)).to(m.device)

"""Placebo controls for a token-credit method: the same update size, not the same placement.

A credit method R changes two things at once: *where* credit goes (which tokens get more or less of the
advantage) and *how much* there is (the size of Â, hence the step). A placebo keeps one and destroys the
other, so a difference between R and GRPO can be traced to one of them. For each response i with training
tokens L_i and R's effective credit Â_i,t (each token's on-policy gradient weight; see
`tokencredit.recipes.placebo_credit`, which trains the result with the per-token objective):

| placebo        | Â_placebo on t in L_i                          | keeps                                   |
|----------------|------------------------------------------------|-----------------------------------------|
| `none`         | Â_i,t                                          | everything (R itself)                   |
| `permute`      | Â_i,π_i(t), π_i a random permutation of L_i    | the multiset of values: size and signs   |
| `uniform-rms`  | s_i sqrt(mean_{L_i} Â²)                        | the response's root-mean-square Â       |
| `uniform-mean` | mean_{L_i} Â                                   | the response's total credit Σ_t Â        |

s_i = sign(mean_{L_i} Â), or sign(A_i) where that mean is 0. Off L_i, Â is unchanged. A kept set (S-trace's)
is part of the placement: its zeros are values like any other, moved by `permute` and averaged by the
uniform placebos. When R's credit is A_i on every token (GRPO), every placebo returns it unchanged, and
uniform-mean equals R's whenever the method's weights average to 1 over the response.

The permutation is a function of the response's own tokens (a splitmix64 hash of its ids and positions),
so it is the same on one process and on any split of the batch over data-parallel ranks, and the same
when a run is resumed: no generator state to carry. Rollouts differ from step to step and seed to seed,
so their permutations do too.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tokencredit.errors import ConfigError, closest

__all__ = ["PLACEBOS", "apply_placebo"]

PLACEBOS = ("none", "permute", "uniform-rms", "uniform-mean")

_MASK64 = (1 << 64) - 1


def _signed(c: int) -> int:
    """A 64-bit constant as the int64 that holds the same bits."""
    c &= _MASK64
    return c - (1 << 64) if c >= 1 << 63 else c


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_M1 = _signed(0xBF58476D1CE4E5B9)
_M2 = _signed(0x94D049BB133111EB)


def _shr(x: Tensor, k: int) -> Tensor:
    """Logical right shift of int64 bits (torch's >> is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _mix(x: Tensor) -> Tensor:
    """splitmix64's finaliser on int64 (wrapping multiplication): a well-mixed hash of each element."""
    z = x + _GOLDEN
    z = (z ^ _shr(z, 30)) * _M1
    z = (z ^ _shr(z, 27)) * _M2
    return z ^ _shr(z, 31)


def _row_keys(token_ids: Tensor, loss_mask: Tensor) -> Tensor:
    """float64 [N,T] in [0, 1): per-position keys seeded by each row's token ids on its loss tokens."""
    n, t = token_ids.shape
    pos = torch.arange(t, device=token_ids.device, dtype=torch.int64)
    per_token = _mix(token_ids.long() * 1_000_003 + pos)
    seed = torch.where(loss_mask, per_token, torch.zeros_like(per_token)).sum(-1)  # wraps: still a hash
    keys = _mix(seed[:, None] * 31 + pos[None, :] + 1)
    return _shr(keys, 11).double() / float(1 << 53)


def apply_placebo(
    placebo: str,
    token_advantages: Tensor,
    loss_mask: Tensor,
    seq_advantages: Tensor,
    token_ids: Tensor,
) -> Tensor:
    """Â [N,T] with R's placement replaced by `placebo`'s (table in the module docstring).

    token_advantages Â [N,T] (R's effective credit); loss_mask bool [N,T] (L_i, the training tokens); seq_advantages
    A [N] (the sign of uniform-rms where mean Â is 0); token_ids [N,T] (seed the permutation). Returns a new
    tensor of Â's dtype; `none` returns Â itself.
    """
    if placebo not in PLACEBOS:
        raise ConfigError(
            f"unknown placebo {placebo!r}{closest(placebo, PLACEBOS)}; choose one of: {', '.join(PLACEBOS)}"
        )
    if placebo == "none":
        return token_advantages
    adv = token_advantages
    m = loss_mask.to(torch.float64)
    count = m.sum(-1, keepdim=True)
    values = adv.double() * m
    if placebo == "permute":
        keys = _row_keys(token_ids, loss_mask)
        big = torch.full_like(keys, 2.0)
        # loss positions first: in a random order (`src`) and in their own order (`dst`)
        src = torch.argsort(torch.where(loss_mask, keys, big), dim=-1, stable=True)
        order = torch.arange(adv.shape[-1], device=adv.device, dtype=torch.float64).expand_as(keys)
        dst = torch.argsort(torch.where(loss_mask, order, order + adv.shape[-1]), dim=-1, stable=True)
        moved = values.gather(-1, src)
        # past the row's loss-token count both gathers read non-loss positions, whose kept value is restored below
        out = torch.zeros_like(values).scatter(-1, dst, moved)
        return torch.where(loss_mask, out, adv.double()).to(adv.dtype)
    mean = values.sum(-1, keepdim=True) / count.clamp(min=1)
    if placebo == "uniform-mean":
        level = mean
    else:
        rms = ((values**2).sum(-1, keepdim=True) / count.clamp(min=1)).sqrt()
        sign = torch.where(mean != 0, mean.sign(), seq_advantages.double()[:, None].sign())
        level = sign * rms
    return torch.where(loss_mask, level.expand_as(values), adv.double()).to(adv.dtype)

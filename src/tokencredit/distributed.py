"""One rank's slice of a batch split across the ranks of a `torch.distributed` group, and the collectives
the credit methods reduce their batch statistics with.

An engine that runs data parallel (verl's FSDP workers, TRL under accelerate) holds on each rank
only its own rollouts, and the per-token signals of those rollouts (hidden states above all) are
too large to gather. A `RolloutBatch` whose `shard` is set is such a slice; every batch statistic
of a credit method is then computed over the whole batch by reducing per-rank partial statistics:

- DelTA: per-side centroid sums [2, H], token counts, margin moments: sums (`all_sum`);
- the 80/20 kept set and S-trace's: the exact global top-k of the entropies (`global_top_k`), with
  ties at the boundary broken in global row-major order, as on one process;
- KTAE: per-(prompt, token id) presence counts of the prompts whose responses sit on several ranks,
  and per-prompt counts (`sum_by_key`);
- group baselines: the [N] scores and prompt ids (`gather_rows`): scalars, a few bytes per rollout.

So the result on each rank equals the single-process result on the concatenated batch, for any split
of the rollouts over ranks (a prompt's responses on different ranks included), up to the order of
floating-point summation. Every rank of the group must make the same calls in the same order (they
are collectives); a rank without rollouts still calls them. Reductions run in float64 / int64.

With `shard=None` each function is the identity on this process's batch, so the core code has one
path. The backend is the group's: gloo on CPU tensors, nccl on CUDA tensors (tensors are moved to
the device the backend needs and back).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from tokencredit.errors import ConfigError

__all__ = ["Shard", "all_max", "all_sum", "gather_rows", "global_top_k", "sum_by_key", "world_size"]


@dataclass(frozen=True)
class Shard:
    """This process's rollouts within a batch split across the ranks of `group`.

    rows [N_local] int64: each local rollout's index in the whole batch (0 .. num_rows - 1; the
      order that breaks ties of the 80/20 kept set, as on one process); num_rows: N of the whole batch;
    group: a torch.distributed process group (None: the default group).
    """

    rows: Tensor
    num_rows: int
    group: Any = None

    def __post_init__(self) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise ConfigError("Shard: torch.distributed is not initialised (init_process_group first)")
        if self.rows.dim() != 1 or self.rows.dtype != torch.int64:
            raise ConfigError(
                f"Shard.rows: expected an int64 tensor [N_local], got {tuple(self.rows.shape)} {self.rows.dtype}"
            )
        if self.rows.numel() and (int(self.rows.min()) < 0 or int(self.rows.max()) >= self.num_rows):
            raise ConfigError(
                f"Shard.rows: indices must lie in [0, {self.num_rows}), got {self.rows.min()}..{self.rows.max()}"
            )

    @classmethod
    def split(cls, n_local: int, group: Any = None) -> Shard:
        """The shard of a batch cut into contiguous pieces in rank order (rank 0 first). Collective."""
        sizes = _all_gather_sizes(n_local, group)
        rank = dist.get_rank(group)
        start = int(sum(sizes[:rank]))
        return cls(torch.arange(start, start + n_local), int(sum(sizes)), group)

    @property
    def world(self) -> int:
        return dist.get_world_size(self.group)


def world_size(shard: Shard | None) -> int:
    """Ranks the batch is split over (1 without a shard)."""
    return 1 if shard is None else shard.world


def _device(group: Any) -> torch.device:
    """The device the group's backend reduces on (gloo: CPU, nccl: this process's CUDA device)."""
    backend = dist.get_backend(group)
    if "nccl" in str(backend):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_gather_sizes(n: int, group: Any) -> list[int]:
    size = torch.tensor([n], dtype=torch.int64, device=_device(group))
    out = [torch.zeros_like(size) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, size, group=group)
    return [int(s) for s in out]


def _all_reduce(x: Tensor, shard: Shard | None, op: Any) -> Tensor:
    if shard is None:
        return x
    buf = x.detach().to(_device(shard.group), copy=True)
    dist.all_reduce(buf, op=op, group=shard.group)
    return buf.to(x.device)


def all_sum(x: Tensor, shard: Shard | None) -> Tensor:
    """The sum of `x` over the ranks of the shard's group (a new tensor on x's device; x itself if no shard)."""
    return _all_reduce(x, shard, dist.ReduceOp.SUM)


def all_max(x: Tensor, shard: Shard | None) -> Tensor:
    """The element-wise maximum of `x` over the ranks (x itself if no shard)."""
    return _all_reduce(x, shard, dist.ReduceOp.MAX)


def _all_gather_rows(x: Tensor, group: Any) -> Tensor:
    """Concatenation over ranks (rank order) of tensors [M_r, ...] whose first dimension differs by rank."""
    dev = _device(group)
    sizes = _all_gather_sizes(x.shape[0], group)
    top = max(sizes) if sizes else 0
    padded = torch.zeros((top, *x.shape[1:]), dtype=x.dtype, device=dev)
    padded[: x.shape[0]] = x.to(dev)
    out = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(out, padded, group=group)
    return torch.cat([o[:s] for o, s in zip(out, sizes)]).to(x.device)


def gather_rows(values: Tensor, shard: Shard | None) -> Tensor:
    """The whole batch's [N_global, ...] from each rank's rows [N_local, ...] of a per-rollout value.

    Meant for scalars per rollout (scores, prompt ids); never for per-token tensors.
    """
    if shard is None:
        return values
    rows = _all_gather_rows(shard.rows.to(values.device), shard.group)
    vals = _all_gather_rows(values, shard.group)
    if rows.numel() != shard.num_rows or bool((torch.bincount(rows, minlength=shard.num_rows) != 1).any()):
        raise ConfigError(
            f"Shard: the ranks' rows must cover 0..{shard.num_rows - 1} exactly once; got {rows.numel()} rows"
        )
    out = torch.empty((shard.num_rows, *values.shape[1:]), dtype=values.dtype, device=values.device)
    out[rows] = vals
    return out


def sum_by_key(keys: Tensor, values: Tensor, shard: Shard | None) -> Tensor:
    """For each local row of `keys` [M, k] int64, the sum over ALL ranks of `values` [M, c] at equal keys.

    Each key appears at most once per rank. Ranks exchange only the rows they pass, so callers pass
    only the keys other ranks may share (e.g. the prompts split across ranks). Collective.
    """
    if shard is None:
        return values
    if keys.dim() != 2 or values.dim() != 2 or keys.shape[0] != values.shape[0]:
        raise ValueError(
            f"sum_by_key: keys [M, k] and values [M, c], got {tuple(keys.shape)}, {tuple(values.shape)}"
        )
    group = shard.group
    sizes = _all_gather_sizes(keys.shape[0], group)
    all_keys = _all_gather_rows(keys, group)
    all_vals = _all_gather_rows(values, group)
    uniq, inverse = torch.unique(all_keys, dim=0, return_inverse=True)
    totals = torch.zeros((uniq.shape[0], values.shape[1]), dtype=values.dtype, device=values.device)
    totals.index_add_(0, inverse, all_vals)
    start = sum(sizes[: dist.get_rank(group)])
    return totals[inverse[start : start + keys.shape[0]]]


def _order_key(values: Tensor) -> Tensor:
    """int64 in [0, 2^32) with the order of float32 `values` (finite; -0.0 counted as +0.0)."""
    bits = (values.float() + 0.0).view(torch.int32).long()
    neg = bits < 0
    # Negative floats: flip all bits (larger magnitude -> smaller key); positive: set the sign bit.
    return torch.where(neg, (~bits) & 0xFFFFFFFF, bits | 0x80000000)


def global_top_k(values: Tensor, valid: Tensor, k: int, shard: Shard) -> Tensor:
    """bool [N_local, L]: the k largest valid `values` over all ranks, ties broken by global (row, column).

    The same set a stable descending sort of the whole batch (rows in global order) keeps. The k-th
    largest value is found by radix selection on its float32 bits: four rounds of a 256-bin
    histogram, all-reduced (2 KiB per round); the ties at it are then split by one all-reduce of
    per-row tie counts [N_global]. Collective.
    """
    valid = valid.bool()
    key = torch.where(valid, _order_key(values), torch.full((), -1, dtype=torch.int64, device=values.device))
    total = int(all_sum(valid.sum().to(torch.int64).reshape(1), shard)[0])
    if k <= 0:
        return torch.zeros_like(valid)
    if k >= total:
        return valid.clone()
    # The k-th largest key, byte by byte from the top: among the candidates that share the prefix
    # found so far, count each next byte's value over all ranks and descend into the bin holding the
    # k-th largest.
    prefix, remaining = 0, k
    for shift in (24, 16, 8, 0):
        high_mask = ~((1 << (shift + 8)) - 1) & 0xFFFFFFFF
        cand = (key >= 0) & ((key & high_mask) == prefix)
        byte = (key[cand] >> shift) & 0xFF
        hist = all_sum(torch.bincount(byte, minlength=256).to(torch.int64), shard)
        above = torch.cumsum(hist.flip(0), 0).flip(0)  # above[b] = candidates with byte >= b
        b = int((above >= remaining).nonzero().max())
        remaining -= int(above[b + 1]) if b < 255 else 0
        prefix |= b << shift
    threshold = prefix
    keep = key > threshold
    ties = key == threshold
    # `remaining` ties are kept: the first ones in global (row, column) order.
    per_row = torch.zeros(shard.num_rows, dtype=torch.int64, device=values.device)
    per_row[shard.rows.to(values.device)] = ties.sum(1)
    per_row = all_sum(per_row, shard)
    before = (torch.cumsum(per_row, 0) - per_row)[shard.rows.to(values.device)]  # ties in earlier rows
    rank_in_row = torch.cumsum(ties.long(), 1) - 1
    return keep | (ties & (before[:, None] + rank_in_row < remaining))

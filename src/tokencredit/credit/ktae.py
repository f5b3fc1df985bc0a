"""KTAE: key-token advantage estimation (Sun et al., NeurIPS 2025, arXiv 2505.16826).

Within one prompt's G rollouts, every vocabulary id that occurs in the group gets a signed
"key value" k(t) in (-top, top) from a 2x2 presence table over correct vs wrong rollouts
(a = correct rollouts containing t, b = wrong ones, c = N_T - a, d = N_F - b):

    F  = exp(-2 p), p the two-sided Fisher exact p-value (F = 0 when p = 1)
    IG = H(Y) - H(Y | X) in bits
    h  = asin(sqrt(a / (N_T + 1e-10))) - asin(sqrt(b / (N_F + 1e-10)))      (Cohen's h / 2)
    D  = h + tf_T / (tf_F + 1e-5) - tf_F / (tf_T + 1e-5)     (BM25 contrast, use_tf=True)
    S  = (alpha F + beta IG) / (alpha + beta)
    k  = top * tanh(S D / 2)

and the token advantage is Â[i,t] = mask[i,t] * (A_i + k(token[i,t])). This follows the
official code (verl fork, `compute_key_tokens.py` / `core_algos.py`), which differs from the
paper's formulas in places; see docs/spec/ktae.md#official-code-compatibility.

Implementation: vectorised over the whole batch. One sort of bit-packed int64 keys
(group | id | correctness | rank of the rollout in its group) gives the distinct (group, id)
pairs, their presence counts (distinct rollouts) and occurrence counts by segment sums over
runs. F, IG and h depend only on (G, N_T, a, b): they are computed for every (a, b) of each
distinct (G, N_T) combo once and cached (a run sees only a few combos). Cost grows with the
number of valid tokens, never with the vocabulary size; there is no Python loop over groups
or ids (only over the distinct (G, N_T) combos, at most G + 1 per group size).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tokencredit.batch import RolloutBatch
from tokencredit.credit.ktae_tables import (
    FISHER_MODES,
    _combo_table,
    fisher_pvalue,
    fisher_pvalue_official_fp32,
    table_statistics,
)
from tokencredit.credit.registry import register
from tokencredit.distributed import Shard, sum_by_key
from tokencredit.errors import ConfigError, closest

__all__ = [
    "FISHER_MODES",
    "fisher_pvalue",
    "fisher_pvalue_official_fp32",
    "key_token_values",
    "ktae",
    "table_statistics",
]

# BM25 constants of the official frequency term.
_K1 = 2.0
_B = 0.5


# ---------------------------------------------------------------------------- helpers
def _segment_sums(values: Tensor, ends: Tensor) -> Tensor:
    """int64 sums of `values` [M] (bool/int) over consecutive segments ending (inclusive) at `ends` [P]."""
    csum = torch.cumsum(values, 0, dtype=torch.int64)[ends]
    return csum.diff(prepend=csum.new_zeros(1))


def _check_inputs(token_ids: Tensor, mask: Tensor, correct: Tensor, group_ids: Tensor) -> None:
    if token_ids.dim() != 2:
        raise ValueError(f"token_ids: expected shape [N, T], got {tuple(token_ids.shape)}")
    if token_ids.dtype.is_floating_point or token_ids.dtype == torch.bool:
        raise ValueError(f"token_ids: expected an integer dtype, got {token_ids.dtype}")
    n = token_ids.shape[0]
    if mask.shape != token_ids.shape:
        raise ValueError(f"mask: expected shape {tuple(token_ids.shape)}, got {tuple(mask.shape)}")
    if tuple(correct.shape) != (n,):
        raise ValueError(f"correct: expected shape ({n},), got {tuple(correct.shape)}")
    if tuple(group_ids.shape) != (n,):
        raise ValueError(f"group_ids: expected shape ({n},), got {tuple(group_ids.shape)}")
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids: expected an integer dtype, got {group_ids.dtype}")


def _check_params(fisher: str, alpha: float, beta: float) -> None:
    if fisher not in FISHER_MODES:
        raise ConfigError(
            f"fisher must be one of {FISHER_MODES}, got {fisher!r}{closest(str(fisher), FISHER_MODES)}"
        )
    if alpha < 0 or beta < 0 or alpha + beta <= 0:
        raise ConfigError(
            f"KTAE needs alpha >= 0, beta >= 0 and alpha + beta > 0, got alpha={alpha}, beta={beta}"
        )


# ---------------------------------------------------------------------------- key values
@dataclass(frozen=True)
class _Groups:
    """Per-rollout group index and per-group counts (only `mixed` groups carry key values)."""

    index: Tensor  # [N] group of each rollout, 0..n-1
    size: Tensor  # [n] rollouts per group
    n_true: Tensor  # [n] correct rollouts per group
    len_true: Tensor  # [n] valid tokens of the correct rollouts
    len_false: Tensor  # [n] valid tokens of the wrong rollouts
    mixed: Tensor  # [n] bool: the group has both outcomes


def _groups(valid: Tensor, correct: Tensor, group_ids: Tensor) -> _Groups:
    gidx = torch.unique(group_ids.to(valid.device), return_inverse=True)[1]
    n = int(gidx.max().item()) + 1
    size = torch.bincount(gidx, minlength=n)
    n_true = torch.bincount(gidx[correct], minlength=n)
    lengths = valid.sum(1)
    zeros = torch.zeros(n, dtype=torch.int64, device=valid.device)
    len_true = zeros.clone().index_add_(0, gidx, lengths * correct)
    len_false = zeros.index_add_(0, gidx, lengths * ~correct)
    return _Groups(gidx, size, n_true, len_true, len_false, (n_true > 0) & (n_true < size))


def _global_groups(g: _Groups, group_ids: Tensor, shard: Shard) -> tuple[_Groups, Tensor]:
    """The local groups' counts summed over all ranks, and which of them are split across ranks [n] bool."""
    uniq = torch.unique(group_ids.to(g.index.device))  # row r of the counts is group uniq[r] (as g.index)
    local = torch.stack([g.size, g.n_true, g.len_true, g.len_false], 1)
    size, n_true, len_true, len_false = sum_by_key(uniq[:, None], local, shard).unbind(1)
    mixed = (n_true > 0) & (n_true < size)
    return _Groups(g.index, size, n_true, len_true, len_false, mixed), size > g.size


@dataclass(frozen=True)
class _Pairs:
    """Statistics of every (group, token id) pair occurring in the live tokens.

    count_all / count_true: occurrences in all / the correct rollouts; a / b: correct / wrong
    rollouts of the group containing the id at least once; group, token_id: the pair's group and
    id; perm, pair_of_sorted: how the sorted live tokens map back (for scattering k).
    """

    count_all: Tensor
    count_true: Tensor
    a: Tensor
    b: Tensor
    group: Tensor
    token_id: Tensor
    perm: Tensor
    pair_of_sorted: Tensor


def _global_pairs(p: _Pairs, split: Tensor, group_ids: Tensor, shard: Shard) -> _Pairs:
    """Pair counts of the groups split across ranks summed over the ranks (only those pairs are exchanged)."""
    uniq = torch.unique(group_ids.to(p.a.device))
    shared = split[p.group]
    keys = torch.stack([uniq[p.group[shared]], p.token_id[shared]], 1)
    counts = torch.stack([p.count_all, p.count_true, p.a, p.b], 1)
    summed = counts.clone()
    summed[shared] = sum_by_key(keys, counts[shared], shard)
    count_all, count_true, a, b = summed.unbind(1)
    return _Pairs(count_all, count_true, a, b, p.group, p.token_id, p.perm, p.pair_of_sorted)


def _pairs(token_ids: Tensor, live: Tensor, correct: Tensor, g: _Groups) -> _Pairs:
    """One sort of packed int64 keys: group | id | wrong bit | rank of the rollout in its group.

    Bit fields (shifts, no divisions) so that sorting groups tokens by (group, id) pair, and within
    a pair by rollout: pairs and (pair, rollout) presence are runs of equal (sub)keys.
    """
    n_rows, device = token_ids.shape[0], token_ids.device
    ids = token_ids.masked_select(live).long()  # row-major order of the live positions
    order = torch.argsort(g.index, stable=True)
    starts = torch.cumsum(g.size, 0) - g.size
    rank = torch.empty_like(g.index)
    rank[order] = torch.arange(n_rows, device=device) - starts[g.index[order]]
    rank_bits = max(1, (int(g.size.max()) - 1).bit_length())
    id_bits = max(1, int(ids.max()).bit_length())
    group_bits = max(1, (g.size.numel() - 1).bit_length())
    if group_bits + id_bits + rank_bits + 1 > 63:
        raise ValueError(
            f"KTAE key does not fit in int64 ({g.size.numel()} groups, max id {int(ids.max())}, "
            f"max group size {int(g.size.max())}); split the batch"
        )
    pair_shift = rank_bits + 1
    row_key = (g.index << (id_bits + pair_shift)) | ((~correct).long() << rank_bits) | rank
    key = (ids << pair_shift) | row_key.repeat_interleave(live.sum(1))
    sorted_key, perm = torch.sort(key)
    del key, ids

    sorted_pair = sorted_key >> pair_shift
    new_pair = torch.ones_like(sorted_key, dtype=torch.bool)
    torch.ne(sorted_pair[1:], sorted_pair[:-1], out=new_pair[1:])
    new_rollout = torch.ones_like(new_pair)
    torch.ne(sorted_key[1:], sorted_key[:-1], out=new_rollout[1:])
    is_true = ((sorted_key >> rank_bits) & 1) == 0
    pair_start = new_pair.nonzero().squeeze(1)
    pair_end = torch.cat([pair_start[1:], pair_start.new_tensor([sorted_key.numel()])]) - 1
    a = _segment_sums(new_rollout & is_true, pair_end)
    pair_key = sorted_pair[pair_start]
    return _Pairs(
        count_all=pair_end - pair_start + 1,
        count_true=_segment_sums(is_true, pair_end),
        a=a,
        b=_segment_sums(new_rollout, pair_end) - a,
        group=pair_key >> id_bits,
        token_id=pair_key & ((1 << id_bits) - 1),
        perm=perm,
        pair_of_sorted=torch.cumsum(new_pair, 0, dtype=torch.int32) - 1,
    )


def _strength_direction(
    g: _Groups, p: _Pairs, fisher: str, alpha: float, beta: float
) -> tuple[Tensor, Tensor]:
    """(S, h) per pair from cached tables: S and h depend only on (G, N_T, a, b), so one
    [2, (N_T+1)(N_F+1)] table per distinct (G, N_T) combo, concatenated; a pair's entry is
    base[group] + a * (N_F + 1) + b."""
    side = int(g.size.max()) + 1
    combos, combo_of_mixed = torch.unique((g.size * side + g.n_true)[g.mixed], return_inverse=True)
    luts, bases = [], []
    offset = 0
    for c in combos.tolist():
        table = _combo_table(c // side, c % side, fisher, alpha, beta)
        luts.append(table)
        bases.append((offset, c // side - c % side + 1))
        offset += table.shape[1]
    device = g.index.device
    lut = torch.cat(luts, 1).to(device)
    group_base = torch.zeros(g.size.numel(), 2, dtype=torch.int64, device=device)
    group_base[g.mixed] = torch.tensor(bases, dtype=torch.int64, device=device)[combo_of_mixed]
    base_stride = group_base[p.group]
    per_pair = lut[:, base_stride[:, 0] + p.a * base_stride[:, 1] + p.b]
    return per_pair[0], per_pair[1]


def _tf_contrast(g: _Groups, p: _Pairs) -> Tensor:
    """BM25 frequency contrast per pair: tf_T / (tf_F + 1e-5) - tf_F / (tf_T + 1e-5)."""
    l_true, l_false = g.len_true.double(), g.len_false.double()
    l_avg = ((l_true + l_false) / 2.0).clamp(min=1.0)
    per_group = torch.stack(
        [
            1.0 / l_true.clamp(min=1.0),
            _K1 * (1.0 - _B + _B * l_true / l_avg),
            1.0 / l_false.clamp(min=1.0),
            _K1 * (1.0 - _B + _B * l_false / l_avg),
        ],
        1,
    )[p.group]  # one [P, 4] row lookup per pair
    f_true = p.count_true * per_group[:, 0]
    f_false = (p.count_all - p.count_true) * per_group[:, 2]
    tf_true = f_true * (_K1 + 1.0) / (f_true + per_group[:, 1])
    tf_false = f_false * (_K1 + 1.0) / (f_false + per_group[:, 3])
    return tf_true / (tf_false + 1e-5) - tf_false / (tf_true + 1e-5)


def _join_exchanges(shard: Shard | None, *, groups: bool) -> None:
    """A rank with nothing to send (no rollouts: `groups`; no live token) still joins the other ranks'
    exchanges of counts, which are collectives."""
    if shard is None:
        return
    empty = torch.zeros(0, 4, dtype=torch.int64)
    if groups:
        sum_by_key(torch.zeros(0, 1, dtype=torch.int64), empty, shard)
    sum_by_key(torch.zeros(0, 2, dtype=torch.int64), empty, shard)


def _pair_values(
    g: _Groups,
    p: _Pairs,
    use_tf: bool,
    alpha: float,
    beta: float,
    top: float,
    fisher: str,
    ignore_token_ids: tuple[int, ...] | list[int] | Tensor,
) -> Tensor:
    """k = top * tanh(S D / 2) per (group, id) pair, float32; 0 for the ignored ids."""
    strength, direction = _strength_direction(g, p, fisher, alpha, beta)
    if use_tf:
        direction = direction + _tf_contrast(g, p)
    # "+ 0.0" turns the -0.0 of a zero strength times a negative direction into +0.0.
    k_pair = (top * torch.tanh(strength * direction / 2.0) + 0.0).float()
    ignore = torch.as_tensor(ignore_token_ids, dtype=torch.int64, device=k_pair.device).flatten()
    if ignore.numel():
        k_pair = torch.where(torch.isin(p.token_id, ignore), 0.0, k_pair)
    return k_pair


def key_token_values(
    token_ids: Tensor,
    mask: Tensor,
    correct: Tensor,
    group_ids: Tensor,
    use_tf: bool = True,
    alpha: float = 1.0,
    beta: float = 1.0,
    top: float = 1.0,
    fisher: str = "exact",
    ignore_token_ids: tuple[int, ...] | list[int] | Tensor = (),
    *,
    shard: Shard | None = None,
) -> Tensor:
    """Per-token key value k[N,T] float32 (KTAE, arXiv 2505.16826, official-code formulas).

    token_ids [N,T] int (response only), mask [N,T] bool/0-1, correct [N] bool,
    group_ids [N] int. Every occurrence of an id within a group gets the same value
    k = top * tanh(S * D / 2) (module docstring); positions do not matter.

    - Groups with no correct or no wrong rollout get k = 0; masked positions are exactly 0.
    - Ids in `ignore_token_ids` (the tokenizer's EOS / pad / special ids, given by the caller)
      get k = 0; their occurrences still count in the rollout lengths L_T / L_F.
    - use_tf=False drops the BM25 frequency contrast (D = h).
    - fisher="exact" (default): float64 p-value with scipy's relative tolerance.
      fisher="official-fp32" reproduces a quirk of the published code (float32 lgamma sums,
      no tolerance, F = 0 only when p == 1.0 exactly in float32), for reproducing the paper's
      runs; see `fisher_pvalue_official_fp32`.
    - If the correct (wrong) side of a group has no valid token, its frequencies are 0.
    - `shard`: these rows are one rank's part of a batch split across ranks (`tokencredit.distributed`;
      `group_ids` global). The per-group counts are summed over ranks, and the per-(group, id) counts
      of the groups whose rollouts sit on several ranks; k is then the single-process value. Collective.
    """
    _check_inputs(token_ids, mask, correct, group_ids)
    _check_params(fisher, alpha, beta)
    device = token_ids.device
    out = torch.zeros(token_ids.shape, dtype=torch.float32, device=device)
    if token_ids.shape[0] == 0:
        _join_exchanges(shard, groups=True)
        return out
    correct = correct.to(device=device, dtype=torch.bool)
    valid = mask.to(device) != 0
    g = local = _groups(valid, correct, group_ids)
    if shard is not None:
        g, split = _global_groups(local, group_ids, shard)
    negative = valid & (token_ids < 0)
    if bool(negative.any()):
        i, j = (int(x) for x in negative.nonzero()[0])
        raise ValueError(f"token_ids: negative id {int(token_ids[i, j])} at rollout {i}, token {j}")
    live = valid & g.mixed[g.index][:, None]  # only valid tokens of groups with both outcomes
    if not bool(live.any()):
        _join_exchanges(shard, groups=False)
        return out
    pairs = _pairs(token_ids, live, correct, local)  # local sizes: the rank of a rollout in its group here
    if shard is not None:
        pairs = _global_pairs(pairs, split, group_ids, shard)
    k_pair = _pair_values(g, pairs, use_tf, float(alpha), float(beta), top, fisher, ignore_token_ids)
    k_live = k_pair.new_empty(pairs.perm.shape)
    k_live[pairs.perm] = k_pair[pairs.pair_of_sorted]
    return out.masked_scatter_(live, k_live)


@register("ktae", paper="Sun et al., KTAE, NeurIPS 2025 (arXiv 2505.16826)")
def ktae(
    batch: RolloutBatch,
    advantages: Tensor,
    threshold: float = 0.0,
    use_tf: bool = True,
    alpha: float = 1.0,
    beta: float = 1.0,
    top: float = 1.0,
    fisher: str = "exact",
    ignore_token_ids: tuple[int, ...] = (),
) -> Tensor:
    """Key-token advantage: Â[i,t] = mask * (A_i + k(token[i,t])), correct = score > threshold.

    `ignore_token_ids` should hold the tokenizer's EOS / pad / special ids (never hard-coded).
    """
    k = key_token_values(
        batch.token_ids,
        batch.mask,
        batch.correct(threshold),
        batch.group_ids,
        use_tf=use_tf,
        alpha=alpha,
        beta=beta,
        top=top,
        fisher=fisher,
        ignore_token_ids=ignore_token_ids,
        shard=batch.shard,
    )
    return torch.where(batch.mask, advantages.float()[:, None] + k, 0.0)

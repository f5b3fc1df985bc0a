"""Groups -> one right-padded `RolloutBatch` (credit is computed on every group at once, as in training)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from tokencredit.batch import RolloutBatch
from tokencredit.errors import ConfigError
from tokencredit.report.explain.inputs import SAVED_SIGNALS, GroupInput

__all__ = ["assemble_batch", "padded", "with_signals"]


def padded(
    rows: Sequence[Sequence[float]], value: float, dtype: torch.dtype, left: bool = False
) -> tuple[Tensor, Tensor]:
    """([n, width] rows padded with `value` on the right (or left), bool mask of the real entries); width >= 1."""
    seqs = [torch.as_tensor(list(r), dtype=dtype) for r in rows]
    lengths = torch.tensor([len(r) for r in seqs], dtype=torch.int64)
    width = max(1, int(lengths.max()) if len(seqs) else 1)
    seqs.append(torch.zeros(width, dtype=dtype))  # fixes the padded width at >= 1 (dropped below)
    side = "left" if left else "right"
    out = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=value, padding_side=side)[:-1]
    pos = torch.arange(width)[None, :]
    mask = pos >= width - lengths[:, None] if left else pos < lengths[:, None]
    return out, mask


def assemble_batch(
    groups: Sequence[GroupInput], tokenizer: Any = None, *, use_saved_signals: bool = True
) -> RolloutBatch:
    """A right-padded RolloutBatch of every completion of `groups` (rows in order, group ids from the groups).

    Completions without token_ids are tokenised with `tokenizer` (no special tokens added; the ids
    are stored on the completion). The saved signals (entropy, old_log_probs, an oracle / VinePPO
    run's Monte-Carlo values) become batch signals when every completion carries them.
    """
    rows: list[list[int]] = []
    for g in groups:
        for i, c in enumerate(g.completions):
            if c.token_ids is None:
                if tokenizer is None:
                    raise ConfigError(
                        f"{g.where}: completions[{i}] has no token_ids and no tokenizer was given"
                    )
                c.token_ids = list(tokenizer(c.text, add_special_tokens=False)["input_ids"])
            rows.append(c.token_ids)
    comps = [c for g in groups for c in g.completions]
    pad = 0 if tokenizer is None or tokenizer.pad_token_id is None else int(tokenizer.pad_token_id)
    ids, mask = padded(rows, pad, torch.int64)
    signals: dict[str, Tensor] = {}
    if use_saved_signals:
        for name in SAVED_SIGNALS:
            if all(getattr(c, name) is not None for c in comps):
                signals[name] = padded([getattr(c, name) for c in comps], 0.0, torch.float32)[0]
    return RolloutBatch(
        token_ids=ids,
        mask=mask,
        group_ids=torch.tensor([g.group_id for g in groups for _ in g.completions], dtype=torch.int64),
        scores=torch.tensor([c.score for c in comps], dtype=torch.float32),
        truncated=torch.tensor([c.truncated for c in comps], dtype=torch.bool),
        **signals,
    )


def with_signals(batch: RolloutBatch, signals: Mapping[str, Tensor]) -> RolloutBatch:
    """`batch` with `signals` added (or replaced), moved to the batch's device."""
    kwargs = {name: getattr(batch, name) for name in batch.__dataclass_fields__}
    kwargs.update({k: v.to(batch.mask.device) for k, v in signals.items()})
    return RolloutBatch(**kwargs)

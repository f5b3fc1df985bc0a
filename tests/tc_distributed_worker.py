"""One rank of the 2-process check in test_distributed.py (run as a script, gloo on the CPU).

argv: FIXTURE OUT_DIR RANK WORLD. Reads the whole batch and each case's rows per rank from FIXTURE,
builds this rank's RolloutBatch (trimmed to its own longest response, so ranks differ in T) with a
`Shard`, runs the credit pipeline and the sharded core functions, and saves what it got.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tokencredit.batch import RolloutBatch
from tokencredit.credit.delta import discriminate
from tokencredit.credit.entropy import top_entropy_mask
from tokencredit.credit.ktae import key_token_values
from tokencredit.distributed import Shard, gather_rows
from tokencredit.errors import ConfigError
from tokencredit.recipes import token_credit

SIGNAL_NAMES = (
    "old_log_probs",
    "entropy",
    "hidden",
    "base_hidden",
    "base_log_probs",
    "neg_log_probs",
    "sum_sq_probs",
)


def local_batch(full: dict, rows: torch.Tensor, shard: Shard) -> RolloutBatch:
    mask = full["mask"][rows]
    t = int(mask.sum(1).max()) if rows.numel() else 0  # this rank's own padding length
    return RolloutBatch(
        token_ids=full["token_ids"][rows, :t],
        mask=mask[:, :t],
        group_ids=full["group_ids"][rows],
        scores=full["scores"][rows],
        baseline_scores=full["baseline_scores"][rows],
        values=full["values"][rows, :t],
        shard=shard,
        **{k: full[k][rows, :t] for k in SIGNAL_NAMES},
    )


def main() -> None:
    fixture, out_dir, rank, world = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    data = torch.load(fixture)
    full, recipes = data["batch"], data["recipes"]
    results = {}
    for case, splits in data["cases"].items():
        rows = splits[rank]
        shard = Shard(rows, full["mask"].shape[0])
        batch = local_batch(full, rows, shard)
        got = {}
        for name in recipes:
            tc = token_credit(name, batch, special_ids=data["special_ids"])
            got[name] = {"tok": tc.token_advantages, "seq": tc.seq_advantages, "loss_mask": tc.loss_mask}
        for ratio in (0.2, 0.5, 0.37):
            got[f"top-{ratio}"] = top_entropy_mask(batch.entropy, batch.mask, ratio, shard=shard)
        scale = (-torch.expm1(batch.old_log_probs)).clamp(0, 1)
        adv = data["advantages"][rows]
        for iters in (0, 2):
            got[f"delta-{iters}"] = discriminate(
                batch.hidden, scale, adv, batch.mask, refine_iters=iters, shard=shard
            ).coefficients
        got["delta-bf16"] = discriminate(
            batch.hidden.bfloat16(), scale, adv, batch.mask, shard=shard
        ).coefficients
        got["ktae-k"] = key_token_values(
            batch.token_ids, batch.mask, batch.scores > 0.5, batch.group_ids, shard=shard
        )
        results[case] = got
    # bad shards: rows outside the batch (refused at once), rows two ranks both claim (refused by the gather)
    errors = []
    for make in (
        lambda: Shard(torch.tensor([0, 99]), 10),
        lambda: gather_rows(torch.zeros(2), Shard(torch.arange(2), 4)),
    ):
        try:
            make()
        except ConfigError as err:
            errors.append(str(err))
    results["errors"] = errors
    torch.save(results, out_dir / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

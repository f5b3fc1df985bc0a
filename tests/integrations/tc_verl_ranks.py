"""One data-parallel rank of test_verl_reductions.py's 2-process check (run as a script, gloo on the CPU).

argv: FIXTURE OUT_DIR RANK WORLD. For each case of FIXTURE, this rank's rows become what a verl worker
holds after its forward steps (jagged hidden rows [r_i, H], jagged old log-prob rows [r_i], the sequence
advantages the driver sent, verl's padded response_mask), and the worker-side function of the actor
extension computes DelTA's coefficient rows with the statistics all-reduced over the group.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tokencredit.integrations.verl.actor import worker


def jagged(padded: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    rows = [padded[i, : int(n)] for i, n in enumerate(lens)]
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def main() -> None:
    fixture, out_dir, rank, world = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    data = torch.load(fixture)
    results = {}
    for case, spec in data["cases"].items():
        rows = spec["rows"][rank]
        lens = data["lens"][rows]
        width = int(data["response_mask"].shape[1])
        hidden = data["hidden"][rows].to(spec["dtype"])
        coef = worker.delta_coefficients(
            jagged(hidden, lens),
            jagged(data["old_log_probs"][rows], lens),
            data["seq_adv"][rows],
            spec["response_mask"][rows][:, :width],
            group=None,
            **data["params"],
        )
        results[case] = [row.clone() for row in coef.unbind()]
    torch.save(results, out_dir / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

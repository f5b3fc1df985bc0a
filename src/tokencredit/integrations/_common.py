"""What the verl and TRL plugins share besides the core's credit pipeline (`tokencredit.recipes`).

A plugin is configured with one name, read by `tokencredit.recipes.resolve` (recipes first,
then credit methods; ``recipe:`` / ``credit:`` prefixes choose), and computes Â with
`tokencredit.recipes.token_credit`, exactly as the trainer and the reports do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from packaging.version import Version
from torch import Tensor

from tokencredit.data.loaders import DataError, problem_from_row

# Ratio kernels the engines' own losses already implement (verl: loss_mode vanilla / gspo; TRL:
# importance_sampling_level="token" / "sequence"), so the plugins add only the trace kernels.
ENGINE_KERNELS = ("token", "gspo", "gspo-token")

# The verl releases the verl plugin and verl_local are tested with and accept (one range for both).
VERL_VERSIONS = ">=0.9,<0.10"


def check_supported(who: str, package: str, found: str, supported: str, tested: str, why: str) -> str:
    """`found` if A <= found < B for `supported` = ">=A,<B" (packaging's version order), else an
    ImportError saying that `who` supports `package` `supported` (tested with `tested`), and `why`."""
    lo, hi = (Version(part.lstrip("<>=")) for part in supported.split(","))
    if not lo <= Version(found) < hi:
        raise ImportError(
            f"{who} supports {package} {supported} (tested with {tested}); found {package} {found}. {why}"
        )
    return found


def slug(name: str) -> str:
    """An identifier-style name: 'dapo+ktae' -> 'dapo_ktae', 'entropy-80-20' -> 'entropy_80_20',
    'reinforce++' -> 'reinforce_pp' (so it does not read as plain REINFORCE)."""
    return re.sub(r"[^0-9A-Za-z]+", "_", name.replace("++", "_pp")).strip("_").lower()


def group_ids_from_labels(labels: Any) -> Tensor:
    """int64 [N] group ids from a sequence of labels (verl's uid strings): equal labels, equal ids."""
    _, inverse = np.unique(np.asarray(labels).astype(str), return_inverse=True)
    return torch.from_numpy(inverse.reshape(-1).astype(np.int64))


def problem_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    """A dataset row's "problem" text, gold "answer" and "id" (only when the row has one) for the saved rollouts,
    read with the data loader's field mapping (`tokencredit.data.loaders`); {} when the row has no problem text
    or no answer (explain shows the prompt instead; probe cannot pose such a group again)."""
    try:
        p = problem_from_row(dict(row), default_id="", where="dataset row")
    except DataError:
        return {}
    return {"problem": p.problem, "answer": p.answer, **({"id": p.id} if p.id else {})}

"""The actor extension's contract: its switch, the batch keys of its signals, the verl signatures it wraps."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["BATCH_KEYS", "SWITCH", "check_target", "enabled", "requested"]

SWITCH = "TOKENCREDIT_VERL_ACTOR_SIGNALS"
# Signal name (tokencredit.batch.SIGNALS) -> DataProto batch key / worker output key.
BATCH_KEYS: dict[str, str] = {
    "hidden": "tc_hidden",
    "base_hidden": "tc_base_hidden",
    "base_log_probs": "tc_base_log_probs",
    "neg_log_probs": "tc_neg_log_probs",
}
_REQUEST = "tc_signals"  # non-tensor field of the worker batch: comma-separated signal names
_NEG_IDS, _NEG_LENS = "tc_neg_prompt_ids", "tc_neg_prompt_lens"  # [bs, P'] right-padded, [bs]
_BASE = ("base_hidden", "base_log_probs")
# The verl methods wrapped here, with the parameters the wrappers rely on.
_SIGNATURES = {
    "forward_step": ("self", "micro_batch", "loss_function", "forward_only"),
    "_compute_old_log_prob": ("self", "batch"),
}


def enabled() -> bool:
    """True iff the switch `SWITCH` is set to 1 / true / yes / on in this process's environment."""
    return os.environ.get(SWITCH, "").strip().lower() in ("1", "true", "yes", "on")


def check_target(fn: Callable[..., Any], name: str) -> None:
    """Raise ImportError unless `fn` takes the parameters this module's wrapper of `name` passes."""
    params = tuple(inspect.signature(fn).parameters)
    if params != _SIGNATURES[name]:
        raise ImportError(
            f"tokencredit's verl actor extension ({SWITCH}) wraps verl's {name}{_SIGNATURES[name]}, but this verl "
            f"has {name}{params}; it supports verl 0.9.x only"
        )


def requested(needs: Iterable[str]) -> tuple[str, ...]:
    """The signals among `needs` that only the actor extension provides, in a fixed order."""
    needs = set(needs)
    return tuple(name for name in BATCH_KEYS if name in needs)

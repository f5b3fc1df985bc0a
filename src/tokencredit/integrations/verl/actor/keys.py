"""The actor extension's contract: its switch, the worker requests and the batch keys of what they return,
the verl signatures it wraps."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterable
from typing import Any

from tokencredit.integrations.verl.actor.reductions import REDUCTIONS, SEQ_ADV, reduction_for

__all__ = [
    "ADDED_KEYS",
    "BATCH_KEYS",
    "OUTPUT_KEYS",
    "SEQ_ADV",
    "SWITCH",
    "check_target",
    "enabled",
    "requested",
]

SWITCH = "TOKENCREDIT_VERL_ACTOR_SIGNALS"
# Signal name (tokencredit.batch.SIGNALS) -> DataProto batch key the estimators read it from. The workers
# return base_log_probs and neg_log_probs as they are; hidden and base_hidden never leave a worker (their
# reductions, REDUCTIONS, do), the keys only name them in a DataProto that carries them otherwise.
BATCH_KEYS: dict[str, str] = {
    "hidden": "tc_hidden",
    "base_hidden": "tc_base_hidden",
    "base_log_probs": "tc_base_log_probs",
    "neg_log_probs": "tc_neg_log_probs",
}
# Worker request -> worker output / DataProto batch key: jagged [r_i] float32 rows, padded by the driver.
OUTPUT_KEYS: dict[str, str] = {
    **{r.request: r.key for r in REDUCTIONS.values()},
    "base_log_probs": BATCH_KEYS["base_log_probs"],
    "neg_log_probs": BATCH_KEYS["neg_log_probs"],
}
# Every key the extension adds to the trainer's batch (dropped after the advantage step).
ADDED_KEYS: tuple[str, ...] = (*BATCH_KEYS.values(), *(r.key for r in REDUCTIONS.values()), SEQ_ADV)
_REQUEST = "tc_signals"  # non-tensor field of the worker batch: comma-separated requests (OUTPUT_KEYS)
_DELTA_PARAMS = "tc_delta_params"  # non-tensor field: DelTA's lam_min, lam_max, refine_iters (a dict)
_NEG_IDS, _NEG_LENS = "tc_neg_prompt_ids", "tc_neg_prompt_lens"  # [bs, P'] right-padded, [bs]
# worker-internal model_output key: DelTA's captured rows, popped in infer_batch
_HIDDEN_ROWS = "tc_hidden_rows"
_BASE = ("adapter_residual", "base_log_probs")  # requests that need the adapter-free forward
# The verl methods wrapped here, with the parameters the wrappers rely on.
_SIGNATURES = {
    "forward_step": ("self", "micro_batch", "loss_function", "forward_only"),
    "infer_batch": ("self", "data", "loss_function"),
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


def requested(method: str, needs: Iterable[str]) -> tuple[str, ...]:
    """What the workers must compute for credit method `method` whose batch needs the signals `needs`: the
    reduction of its hidden-state signals (`REDUCTIONS`), then the log-prob signals only the extension
    provides, in a fixed order (keys of `OUTPUT_KEYS`). ConfigError for hidden states without a reduction."""
    needs = set(needs)
    reduction = reduction_for(method, needs)
    out = [reduction.request] if reduction is not None else []
    out += [name for name in ("base_log_probs", "neg_log_probs") if name in needs]
    return tuple(out)

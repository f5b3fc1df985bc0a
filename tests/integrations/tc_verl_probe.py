"""Test probe for the verl end-to-end runs (test_verl_e2e.py): records what each tc_ estimator saw and returned,
and what each actor worker held and returned for DelTA.

Imported in every verl process of the run through ``VERL_USE_EXTERNAL_MODULES`` (after
tokencredit.integrations.verl.local, before the entry-point plugins).

- Driver: it wraps ``core_algos.get_adv_estimator_fn``, which tokencredit's compute_advantage hook calls
  at each step, so it sees the registered estimator whichever route registered it, and saves the
  DataProto fields the core needs plus the estimator's Â to ``$TC_VERL_PROBE_DIR/<estimator>-<pid>-<n>.pt``.
- Actor workers: it wraps ``tokencredit.integrations.verl.actor.worker.delta_coefficients`` (the rank's
  DelTA, called by the hooked ``infer_batch``) and saves the rank's hidden states, old log-probs, response
  mask, the sequence advantages it got and the coefficient rows it returned to
  ``$TC_VERL_PROBE_DIR/worker-rank<r>-<pid>-<n>.pt``.
"""

from __future__ import annotations

import functools
import itertools
import os
from pathlib import Path
from typing import Any

import torch
from verl.trainer.ppo import core_algos

from tokencredit.integrations.verl.actor import worker

OUT = Path(os.environ["TC_VERL_PROBE_DIR"])
KEYS = (
    "responses",
    "response_mask",
    "token_level_rewards",
    "old_log_probs",
    "tc_hidden",
    "tc_delta_coef",
    "tc_seq_adv",
    "tc_adapter_residual",
    "entropy",
    "tc_entropy",
)
_count = itertools.count()
_worker_count = itertools.count()


def _recording(name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def estimator(*args: Any, data: Any = None, **kwargs: Any) -> Any:
        adv, returns = fn(*args, data=data, **kwargs)
        if data is not None:
            record = {k: data.batch[k].detach().cpu().clone() for k in KEYS if k in data.batch.keys()}
            record["uid"] = [str(u) for u in data.non_tensor_batch["uid"]]
            record["advantages"] = adv.detach().cpu().clone()
            record["n"] = next(_count)  # call order within this process
            OUT.mkdir(parents=True, exist_ok=True)
            torch.save(record, OUT / f"{name}-{os.getpid()}-{record['n']}.pt")
        return adv, returns

    return estimator


_original = core_algos.get_adv_estimator_fn


def get_adv_estimator_fn(name: Any) -> Any:
    fn = _original(name)
    key = getattr(name, "value", name)
    return _recording(key, fn) if str(key).startswith("tc_") else fn


core_algos.get_adv_estimator_fn = get_adv_estimator_fn


def _padded(rows: torch.Tensor) -> torch.Tensor:
    lens = rows.offsets().diff()
    size = (len(lens), int(lens.max()) if len(lens) else 0, *rows.shape[2:])
    return torch.nested.to_padded_tensor(rows.detach().float().cpu(), 0.0, output_size=size)


_delta_coefficients = worker.delta_coefficients


@functools.wraps(_delta_coefficients)
def delta_coefficients(
    hidden: Any, old_log_probs: Any, seq_adv: Any, response_mask: Any, **kwargs: Any
) -> Any:
    coef = _delta_coefficients(hidden, old_log_probs, seq_adv, response_mask, **kwargs)
    record = {
        "rank": torch.distributed.get_rank() if torch.distributed.is_initialized() else 0,
        "world": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
        "lens": hidden.offsets().diff().cpu(),
        "hidden": _padded(hidden),
        "old_log_probs": _padded(old_log_probs),
        "seq_adv": seq_adv.detach().float().cpu().clone(),
        "response_mask": response_mask.detach().cpu().clone(),
        "coefficients": _padded(coef),
        "params": {k: v for k, v in kwargs.items() if k != "group"},
        "n": next(_worker_count),  # call order within this worker
    }
    OUT.mkdir(parents=True, exist_ok=True)
    torch.save(record, OUT / f"worker-rank{record['rank']}-{os.getpid()}-{record['n']}.pt")
    return coef


worker.delta_coefficients = delta_coefficients

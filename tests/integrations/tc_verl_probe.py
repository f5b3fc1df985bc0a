"""Test probe for the verl end-to-end runs (test_verl_e2e.py): records what each tc_ estimator saw and returned.

Imported in every verl process of the run through ``VERL_USE_EXTERNAL_MODULES`` (after
tokencredit.integrations.verl_local, before the entry-point plugins). It wraps
``core_algos.get_adv_estimator_fn``, which tokencredit's compute_advantage hook calls at each step,
so it sees the registered estimator whichever route registered it, and saves the DataProto fields
the core needs plus the estimator's Â to ``$TC_VERL_PROBE_DIR/<estimator>-<n>.pt``.
"""

from __future__ import annotations

import functools
import itertools
import os
from pathlib import Path
from typing import Any

import torch
from verl.trainer.ppo import core_algos

OUT = Path(os.environ["TC_VERL_PROBE_DIR"])
KEYS = (
    "responses",
    "response_mask",
    "token_level_rewards",
    "old_log_probs",
    "tc_hidden",
    "entropy",
    "tc_entropy",
)
_count = itertools.count()


def _recording(name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def estimator(*args: Any, data: Any = None, **kwargs: Any) -> Any:
        adv, returns = fn(*args, data=data, **kwargs)
        if data is not None:
            record = {k: data.batch[k].detach().cpu().clone() for k in KEYS if k in data.batch.keys()}
            record["uid"] = [str(u) for u in data.non_tensor_batch["uid"]]
            record["advantages"] = adv.detach().cpu().clone()
            OUT.mkdir(parents=True, exist_ok=True)
            torch.save(record, OUT / f"{name}-{os.getpid()}-{next(_count)}.pt")
        return adv, returns

    return estimator


_original = core_algos.get_adv_estimator_fn


def get_adv_estimator_fn(name: Any) -> Any:
    fn = _original(name)
    key = getattr(name, "value", name)
    return _recording(key, fn) if str(key).startswith("tc_") else fn


core_algos.get_adv_estimator_fn = get_adv_estimator_fn

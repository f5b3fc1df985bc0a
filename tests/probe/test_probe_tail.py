"""The probe on a toy-tail task: the batch carries the tail (`ProbeTruth.tail_mask`), the `tail-mask` column
is GRPO with zero credit there, and the oracle takes A* = 0 on the tail without sampling it."""

from __future__ import annotations

import json

import pytest
import torch

from tokencredit import cli
from tokencredit.columns import TAIL_MASK, resolve_methods
from tokencredit.errors import ConfigError
from tokencredit.probe.truth import _LABEL_CODE, ProbeTruth


def _truth(labels: list[list[str | None]]) -> ProbeTruth:
    codes = torch.tensor([[_LABEL_CODE[x] if x else -1 for x in row] for row in labels])
    n = codes.shape[0]
    return ProbeTruth(
        mask=codes >= 0,
        group_ids=torch.zeros(n, dtype=torch.long),
        correct=torch.ones(n, dtype=torch.bool),
        target=torch.full((n,), -1),
        labels=codes,
        kinds=["correct"] * n,
    )


def test_truth_tail_mask_is_the_tail_labelled_tokens_or_none():
    truth = _truth([["computed", "answer", "tail", "tail"], ["format", "tail", None, None]])
    assert truth.tail_mask is not None
    assert truth.tail_mask.tolist() == [[False, False, True, True], [False, True, False, False]]
    assert _truth([["computed", "answer", None]]).tail_mask is None  # no tail: no mask, as the trainer's


def test_tail_mask_column_is_grpo_with_zero_tail():
    (spec,) = resolve_methods([TAIL_MASK])
    assert spec.name == TAIL_MASK and spec.recipe.name == "grpo" and spec.recipe.zero_tail
    with pytest.raises(ConfigError, match="'tail-mask' is GRPO with zero credit"):
        resolve_methods(["tail-msk"])


def test_probe_on_toy_tail_masks_the_tail_and_the_oracle_skips_it(tmp_path):
    out = tmp_path / "tail.json"
    args = ["probe", "--model", "toy-tail-32", "--data", "toy-tail-32", "--methods", "grpo,tail-mask"]
    args += ["--groups", "3", "--group-size", "4", "--oracle", "2", "--grad-batches", "0", "--threads", "1"]
    assert cli.main([*args, "--out", str(out)]) == 0
    pt = json.loads(out.read_text())["points"][0]
    assert pt["methods"]["grpo"]["mass_tail"] > 0.1  # GRPO spreads credit over 32 tail letters
    assert pt["methods"]["tail-mask"]["mass_tail"] == 0.0
    sec = pt["oracle"]
    assert sec["status"] == "ok" and sec["checker"]["mass_tail"] == 0.0  # A* is exactly 0 on the tail
    # the tail's states are not sampled: far fewer states than the positions outside the skip
    cost = sec["cost"]
    assert 0 < cost["states"] < cost["positions"] - cost["skipped"]

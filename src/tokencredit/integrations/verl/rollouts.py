"""Saving, every N steps, a verl step's rollouts with the Â its actor trained on, in the saved-rollouts JSONL
(`tokencredit.rollout.records`) that ``tokencredit explain --jsonl`` and ``tokencredit probe --data`` read.

Switched on by two environment variables of the trainer process (where verl computes the advantages: the
driver's TaskRunner; a local Ray cluster inherits them, an existing one needs
``+ray_kwargs.ray_init.runtime_env.env_vars.NAME=...``):

    TOKENCREDIT_VERL_SAVE_ROLLOUTS=DIR          write DIR/step_NNNNNN.jsonl (an absolute path is safest:
                                                Ray may run the trainer in another directory)
    TOKENCREDIT_VERL_SAVE_ROLLOUTS_EVERY=N      every N training steps (default 10), N = verl's global step

The ``tc_`` estimator writes the file after computing Â (`save_rollouts`, driver only, the whole batch it
already holds: no extra transfer). Per group: the prompt (``prompts`` decoded with the trainer's tokenizer;
the v1 trainer's advantage batch lacks them, so they are fetched from its TransferQueue), and, where the
batch carries them (legacy trainer), the problem (``raw_prompt``'s last user message) and the gold answer
(``reward_model.ground_truth``). Per completion: text, token ids and tokens, score (the sum of
``token_level_rewards``), A, Â as returned to verl (S-trace: 0 outside its kept set), and the old policy's
entropy / log-probs when the estimator read them. Truncation is not recorded (verl's batch does not say it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor
from verl import DataProto

from tokencredit.atomic import atomic_write_text
from tokencredit.batch import RolloutBatch
from tokencredit.errors import ConfigError
from tokencredit.recipes import TokenCredit
from tokencredit.rollout import records

__all__ = [
    "DEFAULT_EVERY",
    "EVERY_ENV",
    "SAVE_ENV",
    "RolloutSaving",
    "prompt_ids",
    "save_rollouts",
    "saving_from_env",
]

SAVE_ENV = "TOKENCREDIT_VERL_SAVE_ROLLOUTS"
EVERY_ENV = "TOKENCREDIT_VERL_SAVE_ROLLOUTS_EVERY"
DEFAULT_EVERY = 10


@dataclass(frozen=True)
class RolloutSaving:
    """Where (folder) and how often (every `every` steps) rollouts are saved."""

    folder: Path
    every: int

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def path(self, step: int) -> Path:
        return self.folder / f"step_{step:06d}.jsonl"


def saving_from_env(environ: Mapping[str, str] | None = None) -> RolloutSaving | None:
    """The saving the environment asks for (module docstring), None when SAVE_ENV is unset or empty.
    A malformed value is a ConfigError naming the variable."""
    env = os.environ if environ is None else environ
    folder = env.get(SAVE_ENV, "").strip()
    every_text = env.get(EVERY_ENV, "").strip()
    if not folder:
        if every_text:
            raise ConfigError(
                f"{EVERY_ENV}={every_text} is set but {SAVE_ENV} (the folder to save rollouts in) is not"
            )
        return None
    every = DEFAULT_EVERY
    if every_text:
        try:
            every = int(every_text)
        except ValueError:
            every = 0
        if every < 1:
            raise ConfigError(f"{EVERY_ENV} must be a positive integer (training steps), got {every_text!r}")
    return RolloutSaving(Path(folder).expanduser(), every)


def prompt_ids(data: DataProto) -> list[list[int]] | None:
    """Each row's prompt token ids from the legacy trainer's batch (``prompts`` [bs, P], left-padded, with the
    first P columns of ``attention_mask``); None when the batch has no ``prompts``."""
    keys = set(data.batch.keys())
    if "prompts" not in keys:
        return None
    prompts = data.batch["prompts"]
    width = prompts.shape[1]
    mask = (
        data.batch["attention_mask"][:, :width].bool()
        if "attention_mask" in keys
        else prompts.new_ones(prompts.shape).bool()
    )
    return [row[m].tolist() for row, m in zip(prompts.cpu(), mask.cpu())]


def _group_fields(data: DataProto, i: int, prompt: str) -> dict[str, Any]:
    """A row's group fields: the prompt text, and the problem / answer the batch carries (module docstring)."""
    nt = data.non_tensor_batch
    raw = nt["raw_prompt"][i] if "raw_prompt" in nt else None
    row: dict[str, Any] = {
        "prompt": list(raw) if isinstance(raw, np.ndarray) else (raw if raw is not None else prompt)
    }
    if "reward_model" in nt:
        row["reward_model"] = nt["reward_model"][i]
    fields = records.problem_fields(row)
    if raw is None:
        fields.pop(
            "problem", None
        )  # the decoded prompt is templated text, not the problem (probe would template it again)
    return {"prompt": prompt, **fields}


def save_rollouts(
    saving: RolloutSaving,
    step: int,
    data: DataProto,
    batch: RolloutBatch,
    credit: TokenCredit,
    token_advantages: Tensor,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
) -> Path:
    """Write the batch's rollouts at `step` (module docstring): batch and credit as the estimator computed them,
    token_advantages [bs, T] the Â returned to verl, prompts [bs] each row's prompt token ids. Returns the file."""
    if len(prompts) != batch.num_rollouts:
        raise ConfigError(f"{SAVE_ENV}: {len(prompts)} prompts for a batch of {batch.num_rollouts} responses")
    ids, mask = batch.token_ids.cpu(), batch.mask.cpu()
    lengths = mask.sum(-1).tolist()
    texts = [tokenizer.decode(ids[i, :n].tolist(), skip_special_tokens=True) for i, n in enumerate(lengths)]
    completions = records.completion_records(
        ids,
        mask,
        batch.scores.cpu(),
        credit.seq_advantages.cpu(),
        token_advantages.cpu(),
        texts=texts,
        tokens=[tokenizer.convert_ids_to_tokens(ids[i, :n].tolist()) for i, n in enumerate(lengths)],
        signals={
            s: None if getattr(batch, s) is None else getattr(batch, s).cpu()
            for s in ("entropy", "old_log_probs")
        },
    )
    gids = batch.group_ids.cpu().tolist()
    fields: dict[int, dict[str, Any]] = {}
    for i, g in enumerate(gids):
        if g not in fields:
            text = tokenizer.decode(
                list(prompts[i]), skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
            fields[g] = _group_fields(data, i, text)
    lines = records.group_records(
        step=step,
        recipe=credit.recipe.name,
        credit=credit.recipe.credit,
        group_ids=gids,
        completions=completions,
        fields=fields,
    )
    saving.folder.mkdir(parents=True, exist_ok=True)
    out = saving.path(step)
    atomic_write_text(out, records.jsonl_text(lines))
    return out

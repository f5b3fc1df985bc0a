"""The Hugging Face side of the oracle: K continuations of a state (prompt + response prefix, token for
token) sampled with `tokencredit.rollout.generate_ids` and scored by the verifier, the policy's
log-probs for the delta rule, and the line-break step boundaries of VinePPO."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from tokencredit import rollout, signals
from tokencredit.errors import ConfigError
from tokencredit.oracle.values import SampledRewards, _check_mask
from tokencredit.rewards.custom import check_rewards

__all__ = ["ModelSampler", "RewardFn", "line_break_boundaries", "policy_log_probs"]

RewardFn = Callable[[Sequence[str], Sequence[Any]], Sequence[float]]
"""`reward_fn(texts, golds) -> rewards`: `tokencredit.rewards.Reward` or any callable."""


def line_break_boundaries(
    tokenizer: Any, response_ids: Tensor, mask: Tensor, delimiter: str = "\n"
) -> Tensor:
    """bool [N,T]: valid tokens whose decoded text contains `delimiter` (a step ends after them).

    Each distinct id is decoded on its own once; a delimiter split over several tokens is not seen.
    """
    if not delimiter:
        raise ValueError("line_break_boundaries: the delimiter must be a non-empty string")
    m = mask.bool()
    ids = response_ids.long()
    uniq = torch.unique(ids[m]).tolist()
    pieces = tokenizer.batch_decode([[i] for i in uniq], skip_special_tokens=True) if uniq else []
    hits = [i for i, piece in zip(uniq, pieces) if delimiter in piece]
    if not hits:
        return torch.zeros_like(m)
    return m & torch.isin(ids, torch.tensor(hits, dtype=torch.long, device=ids.device))


def policy_log_probs(model: Any, rollouts: Any, *, temperature: float, batch_size: int = 64) -> Tensor:
    """log pi(y_t | s_t) [N,T] float32 of the rollouts' response tokens at `temperature` (one no-grad
    pass, `tokencredit.signals`; 0 off the mask): the p of the delta rule."""
    seq = torch.cat([rollouts.prompt_ids, rollouts.response_ids], 1).long()
    att = torch.cat([rollouts.prompt_mask.long(), rollouts.response_mask.long()], 1)
    device = next(model.parameters()).device
    sig = signals.compute_signals(
        model,
        seq.to(device),
        att.to(device),
        int(rollouts.prompt_ids.shape[1]),
        rollouts.response_mask.bool().to(device),
        {"old_log_probs"},
        temperature=temperature,
        batch_size=batch_size,
    )
    return sig["old_log_probs"].cpu()


class ModelSampler:
    """`ContinuationSampler` for a Hugging Face causal LM and one batch of rollouts.

    `rollouts`: any object with prompt_ids [N,P] (left-padded) / prompt_mask, response_ids [N,T]
    (right-padded) / response_mask, e.g. `tokencredit.rollout.Rollouts` or the trainer's step
    rollouts. `golds[i]` is rollout i's reference answer, `reward_fn` the verifier. The state (i, c)
    is rollout i's prompt tokens plus its first c response tokens, token for token (never
    re-tokenised text).

    Sampling: the rollout's settings (temperature > 0, top_p, top_k; the budget left,
    max_new_tokens - c, per state), through `rollout.generate_ids` (so the K copies of a state
    share one prefill). Identical states (same prompt, prefix and gold) are sampled once. States
    are sorted by prefix length and sampled `batch_size` sequences per call (K copies of each state
    in one call; 64 suits a CPU, a GPU wants more); each call samples under its own seed drawn from
    `seed`, so the result is deterministic for a given seed and batch size. A call runs to the
    longest budget in it and each continuation is cut at its own state's budget. The completed
    response (prefix + continuation, special tokens skipped) is scored by `reward_fn`.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        rollouts: Any,
        golds: Sequence[Any],
        reward_fn: RewardFn,
        *,
        temperature: float,
        max_new_tokens: int,
        top_p: float = 1.0,
        top_k: int = 0,
        batch_size: int = 64,
        eos_token_id: int | Sequence[int] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        if not temperature > 0:
            raise ConfigError(
                f"the Monte-Carlo oracle needs a sampling temperature > 0, got {temperature} "
                "(a greedy policy has A* = 0 everywhere)"
            )
        if not 0 < top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {top_p}")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        self.model, self.tokenizer, self.reward_fn = model, tokenizer, reward_fn
        self.temperature, self.top_p, self.top_k = float(temperature), float(top_p), int(top_k)
        self.max_new_tokens, self.batch_size = int(max_new_tokens), int(batch_size)
        self.log = log or (lambda _msg: None)
        p_ids, p_mask = rollouts.prompt_ids.cpu().long(), rollouts.prompt_mask.cpu().bool()
        self.response_ids = rollouts.response_ids.cpu().long()
        self.mask = _check_mask(rollouts.response_mask.cpu(), "ModelSampler")
        n = self.response_ids.shape[0]
        if p_ids.shape[0] != n or len(golds) != n:
            raise ValueError(
                f"ModelSampler: {p_ids.shape[0]} prompts, {n} responses and {len(golds)} golds: one of each per rollout"
            )
        self.lengths = self.mask.sum(1)
        if bool((self.lengths > self.max_new_tokens).any()):
            i = int((self.lengths > self.max_new_tokens).nonzero()[0])
            raise ValueError(
                f"ModelSampler: rollout {i} has {int(self.lengths[i])} response tokens, more than "
                f"max_new_tokens={self.max_new_tokens} (pass the budget the rollouts were sampled with)"
            )
        self.prompts = [p_ids[i][p_mask[i]] for i in range(n)]
        self.golds = list(golds)
        self.eos_ids, self.pad_id = rollout.special_ids(model, tokenizer, eos_token_id)

    def _texts(self, rows: Sequence[int], cuts: Sequence[int], conts: Sequence[Tensor]) -> list[str]:
        seqs = [torch.cat([self.response_ids[r, :c], x]).tolist() for r, c, x in zip(rows, cuts, conts)]
        return self.tokenizer.batch_decode(seqs, skip_special_tokens=True)

    def _score(self, texts: list[str], golds: list[Any], who: str) -> Tensor:
        return torch.tensor(check_rewards(self.reward_fn(texts, golds), len(texts), who), dtype=torch.float64)

    def final_rewards(self) -> Tensor:
        """[N] float64: each rollout's own reward (its valid tokens decoded, scored by reward_fn)."""
        n = self.response_ids.shape[0]
        texts = self._texts(range(n), self.lengths.tolist(), [self.response_ids[i, :0] for i in range(n)])
        return self._score(texts, self.golds, "reward_fn (rollouts)")

    def _distinct_states(self, rows: Tensor, cuts: Tensor) -> tuple[list[tuple[int, int]], list[int]]:
        """(distinct states (row, cut), index of each requested state among them)."""
        key_of: dict[tuple[Any, ...], int] = {}
        uniq: list[tuple[int, int]] = []
        index: list[int] = []
        for r, c in zip(rows.tolist(), cuts.tolist()):
            if not 0 <= c < int(self.lengths[r]):
                raise ValueError(
                    f"ModelSampler: state after {c} tokens of rollout {r} (length {int(self.lengths[r])})"
                )
            key = (
                tuple(self.prompts[r].tolist()),
                tuple(self.response_ids[r, :c].tolist()),
                repr(self.golds[r]),
            )
            if key not in key_of:
                key_of[key] = len(uniq)
                uniq.append((r, c))
            index.append(key_of[key])
        return uniq, index

    def _continue(self, states: list[tuple[int, int]], k: int, seed: int) -> tuple[list[Tensor], int]:
        """K continuations of each state [(row, cut)] in one `generate_ids` call, each cut at its
        state's budget: (continuations, state-major; tokens generated within the budgets)."""
        prefixes = [torch.cat([self.prompts[r], self.response_ids[r, :c]]) for r, c in states]
        width = max(len(p) for p in prefixes)
        ids = torch.full((len(states), width), self.pad_id, dtype=torch.long)
        att = torch.zeros((len(states), width), dtype=torch.bool)
        for j, p in enumerate(prefixes):
            ids[j, width - len(p) :] = p
            att[j, width - len(p) :] = True
        budgets = torch.tensor([self.max_new_tokens - c for _, c in states]).repeat_interleave(k)
        _, new, valid, _ = rollout.generate_ids(
            self.model,
            ids,
            att,
            k,
            eos_ids=self.eos_ids,
            pad_id=self.pad_id,
            seed=seed,
            sampling=rollout.SamplingSettings(
                temperature=self.temperature,
                top_p=self.top_p,
                top_k=self.top_k,
                max_new_tokens=int(budgets.max()),
            ),
        )
        valid &= torch.arange(new.shape[1])[None, :] < budgets[:, None]
        return [new[j][valid[j]] for j in range(new.shape[0])], int(valid.sum())

    @torch.no_grad()
    def __call__(self, rows: Tensor, cuts: Tensor, k: int, seed: int) -> SampledRewards:
        uniq, index = self._distinct_states(rows, cuts)
        order = sorted(range(len(uniq)), key=lambda u: (uniq[u][1], len(self.prompts[uniq[u][0]]), u))
        per_call = max(1, self.batch_size // k)
        gen = torch.Generator().manual_seed(int(seed))
        texts: list[str] = [""] * (len(uniq) * k)
        n_tokens = 0
        was_training = bool(getattr(self.model, "training", False))
        self.model.eval()
        try:
            for start in range(0, len(order), per_call):
                chunk = order[start : start + per_call]
                call_seed = int(torch.randint(0, 2**62, (1,), generator=gen))
                conts, used = self._continue([uniq[u] for u in chunk], k, call_seed)
                n_tokens += used
                rows_k = [uniq[u][0] for u in chunk for _ in range(k)]
                cuts_k = [uniq[u][1] for u in chunk for _ in range(k)]
                chunk_texts = self._texts(rows_k, cuts_k, conts)
                for j, u in enumerate(chunk):
                    texts[u * k : (u + 1) * k] = chunk_texts[j * k : (j + 1) * k]
                self.log(f"oracle: {min(start + per_call, len(order))}/{len(order)} states sampled")
        finally:
            if was_training:
                self.model.train()
        golds = [self.golds[uniq[u][0]] for u in range(len(uniq)) for _ in range(k)]
        scores = self._score(texts, golds, "reward_fn (continuations)").reshape(len(uniq), k)
        return SampledRewards(
            rewards=scores[torch.tensor(index, dtype=torch.long)], states=len(uniq), generated_tokens=n_tokens
        )

"""`SamplingSettings`: how completions are sampled, the settings `tokencredit.rollout.generate` reads.

One frozen object travels where the sampling settings go (the trainer's rollout rounds, evaluation, the
probe, the Monte-Carlo oracle) instead of keyword lists and string-keyed dicts. The seed is not a
setting: callers derive one per call (per step and round, per evaluation chunk) and pass it beside.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SamplingSettings"]


@dataclass(frozen=True)
class SamplingSettings:
    """How completions are sampled (checked on construction; a ValueError names the bad field).

    Fields:
      temperature     softmax temperature; 0 decodes greedily (>= 0).
      top_p           nucleus sampling: the smallest set of tokens holding this much probability (in
                      (0, 1]; 1 = off). Ignored at temperature 0.
      top_k           sample among the k most likely tokens only (>= 0; 0 = off). Ignored at temperature 0.
      max_new_tokens  the generation limit: a completion without EOS after this many tokens is truncated (>= 1).
      batch_size      sequences per ``model.generate`` call (>= 1); None = all of a call's sequences at once.

    Every other processor of the model's own generation config (repetition penalty, min_p, ...) is
    off (`tokencredit.rollout.generation_config`). ``dataclasses.replace(s, temperature=0.0)`` gives
    the greedy variant of `s`.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")

    @property
    def greedy(self) -> bool:
        """Temperature 0: the most likely token at every step."""
        return self.temperature == 0

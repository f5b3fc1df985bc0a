"""`EvalSettings`: what `tokencredit.evaluation.evaluate` generates and scores (one typed object for the
trainer's periodic eval, ``tokencredit eval`` and the benchmarks)."""

from __future__ import annotations

from dataclasses import dataclass

from tokencredit.data.templates import check_template
from tokencredit.rollout import SamplingSettings

__all__ = ["DEFAULT_EVAL_SAMPLING", "EvalSettings"]

DEFAULT_EVAL_SAMPLING = SamplingSettings(
    temperature=0.6, top_p=0.95, top_k=0, max_new_tokens=1024, batch_size=64
)
"""The sampling of ``tokencredit eval``'s defaults (and of `EvalSettings()`)."""


@dataclass(frozen=True)
class EvalSettings:
    """How an evaluation samples and scores (checked on construction: ValueError naming the field, or
    ConfigError for an unknown template).

    Fields:
      samples   sampled answers per problem for avg@samples, pass@k and maj@k (k = 1, 2, 4, ... <= samples);
                0 = the greedy pass only (>= 0).
      sampling  how the samples are drawn (`SamplingSettings`: temperature, top_p, top_k, max_new_tokens,
                and batch_size: the cap on sequences per generate call, None = every prompt at once). The
                greedy pass uses the same settings at temperature 0; at temperature 0 the samples are the
                greedy answer repeated.
      template  the prompt template: a name (qwen-math, r1-zero, ...) or a string containing {problem}.
      seed      seeds the sampled pass (each chunk of prompts its own seed derived from it); None = unseeded.
      greedy    also run one temperature-0 answer per problem (the greedy_acc metric).
    """

    samples: int = 4
    sampling: SamplingSettings = DEFAULT_EVAL_SAMPLING
    template: str = "qwen-math"
    seed: int | None = 0
    greedy: bool = True

    def __post_init__(self) -> None:
        if self.samples < 0:
            raise ValueError(f"samples must be >= 0, got {self.samples}")
        if self.samples == 0 and not self.greedy:
            raise ValueError("nothing to evaluate: samples=0 and greedy=False")
        if not isinstance(self.sampling, SamplingSettings):
            raise ValueError(f"sampling must be a SamplingSettings, got {type(self.sampling).__name__}")
        check_template(self.template)

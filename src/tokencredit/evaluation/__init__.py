"""Math evaluation: metrics (pure functions), `evaluate` (shared with the trainer's periodic eval)
and `evaluate_benchmarks` (benchmarks x seeds, used by ``tokencredit eval``).

Metrics, per problem then averaged over problems:
  avg@n     mean accuracy over the n samples (a pass@1 estimate).
  pass@k    unbiased estimator 1 - C(n - c, k) / C(n, k) from n >= k samples with c correct
            (Chen et al. 2021), in the stable product form 1 - prod_{i=n-c+1}^{n} (1 - k / i).
  maj@k     majority vote over the extracted answers of the first k samples. Votes are grouped
            so that every answer the verifier accepts is one group (they all equal the gold, hence
            each other) and the other answers group by normalised string; samples without an
            extracted answer do not vote. Ties: the score is the expected accuracy of picking one
            of the tied groups uniformly at random (1 / #tied if the correct group is among them),
            so the metric does not depend on sample order. No votes at all scores 0.
  greedy    accuracy of the temperature-0 answer.
Lengths are response tokens (the EOS included); `truncated_rate` is the share of samples that hit
the token limit. `verify_timeouts` counts the answers the verifier could not judge within its
limit (they count as wrong in every metric, and are reported so that this is never silent).
Evaluation numbers move with the template, temperature, top-p and token limit, so the command
reports them with every table.

Modules: `metrics` (pure), `settings` (`EvalSettings`: what `evaluate` samples and scores), `run`
(`evaluate`), `suite` (the benchmarks by name, benchmarks x seeds, the table).
"""

from __future__ import annotations

from tokencredit.evaluation.metrics import (
    avg_at_k,
    greedy_accuracy,
    majority_vote,
    mean_maj_at_k,
    mean_pass_at_k,
    mean_response_length,
    pass_at_k,
    powers_of_two,
)
from tokencredit.evaluation.run import evaluate
from tokencredit.evaluation.settings import DEFAULT_EVAL_SAMPLING, EvalSettings
from tokencredit.evaluation.suite import BENCHMARKS, evaluate_benchmarks, load_benchmark, markdown_table

__all__ = [
    "BENCHMARKS",
    "DEFAULT_EVAL_SAMPLING",
    "EvalSettings",
    "avg_at_k",
    "evaluate",
    "evaluate_benchmarks",
    "greedy_accuracy",
    "load_benchmark",
    "majority_vote",
    "markdown_table",
    "mean_maj_at_k",
    "mean_pass_at_k",
    "mean_response_length",
    "pass_at_k",
    "powers_of_two",
]

"""`tokencredit probe`: does a credit method blame the token where a wrong solution went astray?

Papers on token credit argue that their method finds the "key" tokens; none measures it against
ground truth. On the embedded arithmetic task (`tokencredit.data.synthetic`) the truth is known,
and the probe samples groups on held-out problems, computes every method's credit on the *same*
rollouts, and scores it, without any training. With ``--oracle K`` a second ground truth is
scored on the same rollouts: each token's Monte-Carlo advantage A* (`tokencredit.oracle`), which
needs only a verifier and so also works on benchmark data (``--data math500``), where it is the
only truth. One module per concern:

    config    ProbeConfig: data, sampling and scoring settings, defaults from a probed run or toy model
    sample    held-out problems, groups of rollouts and their signals (no truth, no scores)
    truth     the first wrong token and each token's label, mapped from characters to tokens
    metrics   blame@k, ranks and |Â| mass shares of a credit tensor (ties in expectation), baselines' credit
    score     the numbers of one credit tensor, the chance baselines, every `--methods` column on a batch
    fidelity  A* of the rollouts of mixed groups and each credit's fidelity to it (Spearman, signs, blame)
    gradients the cosine of each credit's policy gradient with A*'s and GRPO's, per batch; the headroom index
              and its split-half noise ceiling (A* from each half of the K continuations)
    expected  the expected gradients from the dot products of different batches: the bias of each credit's
              update against exact credit's, free of batch and Monte-Carlo noise, and the signal share
    pipeline  sample -> truth -> score (-> oracle) for one model (`probe_model`) and each probed point
    points    which models: a model directory, the toy warm start, a run's final model or checkpoints
    render    the JSON payload and the Markdown tables

Credit is the *effective* credit of each method (`tokencredit.objectives.effective`): the per-token
gradient weight of the recipe's objective at ratio 1, which is Â itself for per-token kernels
and the on-policy credit of the sequence / trace kernels (GSPO, P-trace, S-trace; the traces
are our reconstruction of Mou et al. 2026, see `tokencredit.objectives.traces`). Methods that
read a LoRA adapter (ARCA, policy-divergence) are "n/a" on a model without one: a freshly
attached adapter (B = 0) would make them uniform, which says nothing about the method.
The command line is `tokencredit.commands.probe`.
"""

from tokencredit.columns import NA_LORA
from tokencredit.probe.config import (
    DEFAULT_GRAD_BATCHES,
    DEFAULT_KS,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_METHODS,
    ProbeConfig,
    default_data,
    default_max_new_tokens,
    parse_ks,
    probe_config,
)
from tokencredit.probe.fidelity import (
    ORACLE_Z,
    ProbeOracle,
    fidelity_baselines,
    oracle_cost,
    oracle_section,
    run_oracle,
    score_fidelity,
    split_halves,
)
from tokencredit.probe.gradients import (
    cosine,
    disattenuated,
    gradient_cosines,
    gradient_fidelity,
    group_batches,
    mean_and_stderr,
    noise_ceiling,
    policy_gradient,
    spearman_brown,
    trainable_parameters,
    with_gradient_columns,
)
from tokencredit.probe.metrics import (
    DEFAULT_RTOL,
    blame_hits,
    expected_hits,
    mass_shares,
    mean_of,
    mean_rank,
    random_credit,
    stderr_of,
    target_ranks,
    tie_counts,
    uniform_credit,
)
from tokencredit.probe.pipeline import REWARD_NAMES, probe_model, probe_points, verifier_summary
from tokencredit.probe.points import ProbePoint, default_output, parse_checkpoint, resolve_points
from tokencredit.probe.render import (
    evolution_table,
    expected_table,
    fidelity_table,
    gradient_line,
    markdown_report,
    point_table,
    probe_result,
    write_report,
)
from tokencredit.probe.sample import (
    data_problems,
    heldout_problems,
    probe_problems,
    sample_rollouts,
    scored,
    select_rollouts,
)
from tokencredit.probe.score import (
    method_credits,
    method_row,
    probe_batch,
    score_baselines,
    score_credit,
    score_methods,
)
from tokencredit.probe.truth import (
    LABELS,
    ProbeTruth,
    RolloutTruth,
    build_truth,
    char_to_token,
    checker_reward,
    mixed_rows,
    rollout_summary,
    rollout_truth,
    token_char_spans,
    token_labels,
)

__all__ = [
    "DEFAULT_GRAD_BATCHES",
    "DEFAULT_KS",
    "DEFAULT_MAX_NEW_TOKENS",
    "DEFAULT_METHODS",
    "DEFAULT_RTOL",
    "LABELS",
    "NA_LORA",
    "ORACLE_Z",
    "ProbeConfig",
    "ProbeOracle",
    "ProbePoint",
    "ProbeTruth",
    "REWARD_NAMES",
    "RolloutTruth",
    "blame_hits",
    "build_truth",
    "char_to_token",
    "checker_reward",
    "cosine",
    "data_problems",
    "default_data",
    "default_max_new_tokens",
    "default_output",
    "disattenuated",
    "evolution_table",
    "expected_table",
    "expected_hits",
    "fidelity_baselines",
    "fidelity_table",
    "gradient_cosines",
    "gradient_fidelity",
    "gradient_line",
    "group_batches",
    "heldout_problems",
    "markdown_report",
    "mass_shares",
    "mean_and_stderr",
    "mean_of",
    "mean_rank",
    "method_credits",
    "method_row",
    "mixed_rows",
    "noise_ceiling",
    "oracle_cost",
    "oracle_section",
    "parse_checkpoint",
    "parse_ks",
    "point_table",
    "policy_gradient",
    "probe_batch",
    "probe_config",
    "probe_model",
    "probe_points",
    "probe_problems",
    "probe_result",
    "random_credit",
    "resolve_points",
    "rollout_summary",
    "rollout_truth",
    "run_oracle",
    "sample_rollouts",
    "scored",
    "score_baselines",
    "score_credit",
    "score_fidelity",
    "score_methods",
    "select_rollouts",
    "spearman_brown",
    "split_halves",
    "stderr_of",
    "target_ranks",
    "tie_counts",
    "token_char_spans",
    "token_labels",
    "trainable_parameters",
    "uniform_credit",
    "verifier_summary",
    "with_gradient_columns",
    "write_report",
]

"""Ground-truth token credit: Monte-Carlo token advantages A*_t of a policy under a verifier.

For a policy pi, a reward r in [0, 1] and a sampled response y_1..y_L (EOS included), let
s_t = prompt + y_<t (so s_1 = the prompt and s_{L+1} the whole response) and V(s) the policy's
expected reward from s. The true advantage of response token t is

    A*_t = Q(s_t, y_t) - V(s_t) = V(s_{t+1}) - V(s_t),      V(s_{L+1}) = r(y),

the quantity every token-credit method tries to estimate. V(s_t) is estimated by sampling K
continuations of s_t with the rollout's own sampling settings (temperature, top_p, top_k, the
length budget left) and scoring the completed responses with the same reward function:
V^(s) = mean of the K rewards, its standard error the sample standard deviation (Bessel) / sqrt(K).
V(s_t) and V(s_{t+1}) come from independent samples, so

    se(A*_t) = sqrt(se(V^(s_t))^2 + se(V^(s_{t+1}))^2)                (se(V^(s_{L+1})) = 0).

Adjacent positions share one estimate (V^(s_{t+1}) enters A*_t and A*_{t+1}), so neighbouring
errors are negatively correlated; each position's own standard error is exact. A state whose K
rewards are all equal has standard error 0 (no spread observed); with K = 8 that happens often
near V = 0 or 1, so "|A*| > 2 se" should be read with K in mind.

The delta skip (with its bound). Write p = pi(y_t | s_t). Since
V(s_t) = p Q(s_t, y_t) + (1 - p) Qbar, with Qbar = E[Q(s_t, y) | y != y_t],

    |A*_t| = |Q(s_t, y_t) - V(s_t)| = (1 - p) |Q(s_t, y_t) - Qbar| <= (1 - p) (r_max - r_min),

so a position whose token had p >= 1 - delta gets A*_t = 0 (no sampling) with the recorded bound
`bound[i, t]` = (r_max - r_min)(1 - p) <= delta (r_max - r_min). p is exp(old log-prob) at the
sampling temperature (`tokencredit.signals`, logits / temperature). With top_p < 1 or top_k > 0
the sampler renormalises over a subset that contains y_t, which can only raise y_t's
probability, so the bound computed from the plain tempered p stays valid (conservative). Only
states adjacent to an unskipped position are sampled: V(s_t) and V(s_{t+1}) for every position t
with p < 1 - delta. `DEFAULT_DELTA` = 1e-3: on a batch of the toy warm start (128 rollouts) it
skips 90% of the tokens, and the skipped positions can hold at most 1.24% of the batch's |A*| mass
(their summed bound against a lower bound of the mass; benchmarks/bench_oracle.py, BENCHMARKS.md).

Step-level values (VinePPO; Kazemnejad et al., "VinePPO: Refining Credit Assignment in RL
Training of LLMs", ICML 2025, arXiv 2410.01679). VinePPO replaces PPO's value network by the same
Monte-Carlo estimate taken only at reasoning-step boundaries: the response is split into steps
(its MATH / GSM8K configs split on a line-break delimiter, the answer joined to the last step),
V is estimated at the prompt and after every step from K fresh continuations (K = 9 in the
paper's main configs), the last step's target is the reward (terminal value 0 plus the
outcome reward), and step j's advantage V(s_{j+1}) - V(s_j) is given to every token of the
step (EOS gets the last step's). Its code estimates values for at most the first 20 steps
(``max_step_for_value_estimation``); later states take the reward as their value.
`step_advantages` / `vine_credit` implement this with steps ending after every token whose text
contains a line break (so a final answer line is a step of its own, where VinePPO's MATH split
joins it to the last reasoning line); the delta skip is off by default there (VinePPO has none),
and when on it uses the step-level bound 1 - prod_t p_t over the step's tokens (same argument,
the step as one action).

Modules: `values` (result types and the pure estimation functions on tensors: `skip_positions`,
`value_states`, `mc_value`, `half_means`, `advantages_from_values`, `step_ids_from_boundaries`,
`step_advantages_from_values`), `drivers` (`token_advantages`, `step_advantages` over any
`ContinuationSampler`; the tests drive them with a hand-made policy whose A* is known in closed
form), `sampler` (the Hugging Face `ModelSampler`), `credit` (the one-call entry points
`oracle_credit` / `vine_credit` / `mc_signals`, the trainer's), and `agreement`, a method's
credit against A* (`fidelity`: Spearman correlation pooled and per response, sign agreement and
share of |Â| on the significant tokens; `oracle_targets`: the most negative A* per response, the
target of blame@k).
"""

from tokencredit.oracle.agreement import average_ranks, fidelity, fidelity_stderr, oracle_targets, spearman
from tokencredit.oracle.credit import MCSettings, mc_signals, oracle_credit, vine_credit
from tokencredit.oracle.drivers import step_advantages, token_advantages
from tokencredit.oracle.sampler import ModelSampler, RewardFn, line_break_boundaries, policy_log_probs
from tokencredit.oracle.values import (
    DEFAULT_DELTA,
    DEFAULT_K,
    VINE_K,
    VINE_MAX_STEPS,
    ContinuationSampler,
    OracleCost,
    OracleCredit,
    SampledRewards,
    advantages_from_values,
    half_means,
    mc_value,
    skip_positions,
    step_advantages_from_values,
    step_ids_from_boundaries,
    value_states,
)

__all__ = [
    "DEFAULT_DELTA",
    "DEFAULT_K",
    "VINE_K",
    "VINE_MAX_STEPS",
    "ContinuationSampler",
    "MCSettings",
    "ModelSampler",
    "OracleCost",
    "OracleCredit",
    "RewardFn",
    "SampledRewards",
    "advantages_from_values",
    "average_ranks",
    "fidelity",
    "fidelity_stderr",
    "half_means",
    "line_break_boundaries",
    "mc_signals",
    "mc_value",
    "oracle_credit",
    "oracle_targets",
    "policy_log_probs",
    "skip_positions",
    "spearman",
    "step_advantages",
    "step_advantages_from_values",
    "step_ids_from_boundaries",
    "token_advantages",
    "value_states",
    "vine_credit",
]

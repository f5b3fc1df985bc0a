"""Rewards for math RLVR: a sandboxed math-verify verifier, reasoning-gym's checkers in the same kind of
worker processes, answer extraction, DAPO overlong shaping, a format reward, and user reward
functions (``module:function``)."""

from tokencredit.rewards.custom import (
    AutoVerifier,
    Reward,
    RewardError,
    check_rewards,
    is_builtin_reward,
    load_reward_function,
    resolve_reward_function,
)
from tokencredit.rewards.extract import (
    extract_answer,
    last_answer_statement,
    last_boxed,
    normalize_answer,
    strip_bold,
)
from tokencredit.rewards.reasoning_gym import GymAnswer, ReasoningGymVerifier
from tokencredit.rewards.shaping import FORMAT_STYLES, format_reward, overlong_penalty
from tokencredit.rewards.verifier import (
    MathVerifier,
    Verification,
    default_verifier,
    math_reward,
    normalize_golds,
)

__all__ = [
    "AutoVerifier",
    "FORMAT_STYLES",
    "GymAnswer",
    "MathVerifier",
    "ReasoningGymVerifier",
    "Reward",
    "RewardError",
    "Verification",
    "check_rewards",
    "default_verifier",
    "extract_answer",
    "format_reward",
    "is_builtin_reward",
    "last_answer_statement",
    "last_boxed",
    "load_reward_function",
    "math_reward",
    "normalize_answer",
    "normalize_golds",
    "overlong_penalty",
    "resolve_reward_function",
    "strip_bold",
]

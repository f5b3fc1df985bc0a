"""Rewards for math RLVR: a sandboxed math-verify verifier, answer extraction, DAPO overlong
shaping, a format reward, and user reward functions (``module:function``)."""

from tokencredit.rewards.custom import Reward, RewardError, check_rewards, load_reward_function
from tokencredit.rewards.extract import extract_answer, last_boxed, normalize_answer, strip_bold
from tokencredit.rewards.shaping import FORMAT_STYLES, format_reward, overlong_penalty
from tokencredit.rewards.verifier import (
    MathVerifier,
    Verification,
    default_verifier,
    math_reward,
    normalize_golds,
)

__all__ = [
    "FORMAT_STYLES",
    "MathVerifier",
    "Reward",
    "RewardError",
    "Verification",
    "check_rewards",
    "default_verifier",
    "extract_answer",
    "format_reward",
    "last_boxed",
    "load_reward_function",
    "math_reward",
    "normalize_answer",
    "normalize_golds",
    "overlong_penalty",
    "strip_bold",
]

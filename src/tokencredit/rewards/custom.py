"""Reward functions by name: the built-in math verifier or a user function given as ``module:function``.

A user reward function has the signature ``fn(completions: list[str], golds: list, **kwargs) ->
list[float]`` (one finite number per completion). Its output is checked: a wrong length, a
non-number or a NaN/inf is an error naming the function and the completion, never a silent 0.
`Reward.verify` also says which completions the math verifier could not judge in time (always
none for a user function).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from typing import Any

from tokencredit.errors import ConfigError
from tokencredit.rewards.shaping import FORMAT_STYLES, format_reward
from tokencredit.rewards.verifier import Gold, MathVerifier, Verification

RewardCallable = Callable[..., Sequence[float]]


class RewardError(ValueError):
    """A reward function returned something other than one finite number per completion; the
    message names the function and the rollout (completion index)."""


def load_reward_function(path: str) -> RewardCallable:
    """Import ``package.module:function`` (dots after the colon walk attributes)."""
    if not isinstance(path, str) or ":" not in path:
        raise ConfigError(f"reward function must be given as 'module:function', got {path!r}")
    mod_name, _, attr = path.partition(":")
    if not mod_name or not attr:
        raise ConfigError(f"reward function must be given as 'module:function', got {path!r}")
    try:
        obj: Any = importlib.import_module(mod_name)
    except ImportError as e:
        raise ConfigError(f"reward function {path!r}: cannot import module {mod_name!r} ({e})") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"reward function {path!r}: {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"reward function {path!r} is not callable")
    return obj


def check_rewards(values: Any, n: int, who: str) -> list[float]:
    """Validate a reward function's output: n finite real numbers (else RewardError naming the rollout)."""
    try:
        vals = list(values)
    except TypeError:
        raise RewardError(
            f"reward function {who} returned {type(values).__name__}, expected a list of {n} floats"
        ) from None
    if len(vals) != n:
        raise RewardError(f"reward function {who} returned {len(vals)} values for {n} completions")
    out = []
    for i, v in enumerate(vals):
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise RewardError(
                f"reward function {who} returned {v!r} for completion {i} (rollout {i}), expected a number"
            ) from None
        if not math.isfinite(f):
            raise RewardError(
                f"reward function {who} returned {f} for completion {i} (rollout {i}); rewards must be finite"
            )
        out.append(f)
    return out


class Reward:
    """A reward: ``reward(completions, golds) -> list[float]``; `close()` releases its workers.

    `spec` is "math" (math-verify, 1/0) or ``module:function``; `format_weight` * the format
    reward of `format_style` is added (0 by default). `timeout` and `retry_timeouts` are the math
    verifier's per-answer limit and whether a timed-out answer is judged once more with a longer one.
    """

    def __init__(
        self,
        spec: str = "math",
        *,
        timeout: float = 5.0,
        allow_last_number: bool = False,
        format_weight: float = 0.0,
        format_style: str = "boxed",
        num_workers: int | None = None,
        verifier: MathVerifier | None = None,
        retry_timeouts: bool = False,
    ):
        if format_style not in FORMAT_STYLES:
            raise ConfigError(f"format_style must be one of {FORMAT_STYLES}, got {format_style!r}")
        if not math.isfinite(format_weight):
            raise ConfigError(f"format_weight must be finite, got {format_weight}")
        self.spec = spec
        self.format_weight = float(format_weight)
        self.format_style = format_style
        self.verifier: MathVerifier | None = None
        self._fn: RewardCallable | None = None
        self._owns_verifier = False
        if spec == "math":
            if verifier is None:
                verifier = MathVerifier(
                    timeout, num_workers=num_workers, allow_last_number=allow_last_number, retry_timeouts=retry_timeouts
                )
                self._owns_verifier = True
            self.verifier = verifier
        else:
            self._fn = load_reward_function(spec)

    def verify(self, completions: Sequence[str], golds: Sequence[Gold], **kwargs: Any) -> Verification:
        """The rewards and which completions timed out in the math verifier (scored 0 for that reason)."""
        n = len(completions)
        if self.verifier is not None:
            result = self.verifier.verify(completions, golds)
            scores, timed_out = result.scores, result.timed_out
        else:
            assert self._fn is not None
            scores = check_rewards(self._fn(list(completions), list(golds), **kwargs), n, self.spec)
            timed_out = [False] * n
        if self.format_weight:
            fmt = format_reward(completions, self.format_style)
            scores = [s + self.format_weight * f for s, f in zip(scores, fmt)]
        return Verification(scores, timed_out)

    def __call__(self, completions: Sequence[str], golds: Sequence[Gold], **kwargs: Any) -> list[float]:
        return self.verify(completions, golds, **kwargs).scores

    def start(self) -> None:
        """Start the math verifier's workers in the background (they warm up while other work runs)."""
        if self.verifier is not None:
            self.verifier.start(wait=False)

    def close(self) -> None:
        if self._owns_verifier and self.verifier is not None:
            self.verifier.close()

    def __enter__(self) -> Reward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Reward functions by name: the built-in math verifier, reasoning-gym's checkers, the two chosen per
problem, or a user function given as ``module:function``.

Names (`Reward(spec)`, the trainer's ``reward.function``):
  "math"            math-verify on the extracted answer (`MathVerifier`), 1 / 0;
  "reasoning-gym"   each reasoning-gym problem's own checker, ``score_answer`` (`ReasoningGymVerifier`),
                    1 for full marks else 0; options as a query: ``reasoning-gym?partial_credit=true``
                    (the checker's score in [0, 1] as the reward), ``?last_number=true`` (read the last
                    number when a completion states no answer);
  "auto"            per problem: reasoning-gym problems by their checker, all others by math-verify
                    (the trainer's default; `resolve_reward_function` names the one that applies
                    when the data are all of one kind);
  "module:function" a user function.

A user reward function has the signature ``fn(completions: list[str], golds: list, **kwargs) ->
list[float]`` (one finite number per completion). Its output is checked: a wrong length, a
non-number or a NaN/inf is an error naming the function and the completion, never a silent 0.
`Reward.check` calls it once at set-up, on one training problem, so that such an error stops a run
before its first evaluation instead of after it. `Reward.verify` also says which completions the math
verifier could not judge in time (always none for a user function).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from typing import Any

from tokencredit.errors import ConfigError, closest
from tokencredit.rewards.reasoning_gym import ReasoningGymVerifier, check_installed, is_gym_gold
from tokencredit.rewards.shaping import FORMAT_STYLES, format_reward
from tokencredit.rewards.verifier import Gold, MathVerifier, Verification

GYM_PREFIX = "reasoning-gym"  # the reward name, and the data prefix "reasoning-gym:"
GYM_OPTIONS = ("partial_credit", "last_number")

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


def _short(value: Any, limit: int = 80) -> str:
    """repr(value) with its type, cut to about `limit` characters (for an error message)."""
    text = repr(value)
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{text} ({type(value).__name__})"


def check_rewards(values: Any, n: int, who: str) -> list[float]:
    """Validate a reward function's output: n finite real numbers (else RewardError naming the rollout)."""
    try:
        vals = list(values)
    except TypeError:
        raise RewardError(f"reward function {who} returned {_short(values)}, expected a list of {n} floats") from None
    if len(vals) != n:
        raise RewardError(
            f"reward function {who} returned {len(vals)} values for {n} completions: {_short(values)}"
        )
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


def parse_query(query: str, where: str) -> dict[str, str]:
    """``"a=1&b=x"`` -> ``{"a": "1", "b": "x"}`` (ConfigError naming `where` for a malformed or repeated item)."""
    out: dict[str, str] = {}
    for item in (x for x in query.split("&") if x.strip()):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ConfigError(f"{where}: expected key=value, got {item!r}")
        if key in out:
            raise ConfigError(f"{where}: {key!r} is given twice")
        out[key] = value.strip()
    return out


def parse_bool(value: str, where: str) -> bool:
    low = value.strip().lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"{where}: expected true/false, got {value!r}")


def _gym_options(spec: str) -> dict[str, bool]:
    """The options of a reward name ``reasoning-gym[?partial_credit=true&last_number=true]``."""
    _, _, query = spec.partition("?")
    opts = parse_query(query, f"reward {spec!r}")
    for key in opts:
        if key not in GYM_OPTIONS:
            raise ConfigError(f"reward {spec!r}: unknown option {key!r}; valid: {', '.join(GYM_OPTIONS)}" + closest(key, GYM_OPTIONS))
    return {key: parse_bool(value, f"reward {spec!r}: {key}") for key, value in opts.items()}


def is_gym_reward(spec: str) -> bool:
    return spec == GYM_PREFIX or spec.startswith(GYM_PREFIX + "?")


def is_builtin_reward(spec: str) -> bool:
    """Whether `spec` names a built-in reward ("math", "auto", "reasoning-gym[?options]"), not a user function."""
    return spec in ("math", "auto") or is_gym_reward(spec)


def resolve_reward_function(spec: str, data_specs: Sequence[str]) -> str:
    """The reward a run records for ``reward.function = spec`` over its data (``data.train``,
    ``data.eval``; comma-separated parts): "auto" becomes "reasoning-gym" when every part is
    reasoning-gym data, "math" when none is, and stays "auto" (each problem its own checker) when
    they are mixed. Any other name is returned as given."""
    if spec != "auto":
        return spec
    parts = [p.strip() for d in data_specs for p in str(d).split(",") if p.strip()]
    gym = [p.startswith(GYM_PREFIX + ":") for p in parts]
    if gym and all(gym):
        return GYM_PREFIX
    return "math" if not any(gym) else "auto"


class AutoVerifier:
    """Each problem judged by its own checker: reasoning-gym problems (`GymAnswer` golds) by
    `ReasoningGymVerifier`, all others by `MathVerifier`; the verifier API of both."""

    def __init__(self, math: MathVerifier, gym: ReasoningGymVerifier):
        self.math, self.gym = math, gym

    def extract(self, completion: str) -> str | None:
        return self.math.extract(completion)

    def verify(self, completions: Sequence[str], golds: Sequence[Gold], **kwargs: Any) -> Verification:
        if len(completions) != len(golds):
            raise ValueError(f"got {len(completions)} completions but {len(golds)} gold answers")
        scores, timed_out = [0.0] * len(golds), [False] * len(golds)
        for verifier, idx in ((self.gym, [i for i, g in enumerate(golds) if is_gym_gold(g)]),
                              (self.math, [i for i, g in enumerate(golds) if not is_gym_gold(g)])):  # fmt: skip
            if idx:
                v = verifier.verify([completions[i] for i in idx], [golds[i] for i in idx], **kwargs)
                for i, s, t in zip(idx, v.scores, v.timed_out):
                    scores[i], timed_out[i] = s, t
        return Verification(scores, timed_out)

    def score(self, completions: Sequence[str], golds: Sequence[Gold], **kwargs: Any) -> list[float]:
        return self.verify(completions, golds, **kwargs).scores

    @property
    def stats(self) -> dict[str, int]:
        out = dict(self.math.stats)
        for k, v in self.gym.stats.items():
            out[k] = out.get(k, 0) + v
        return out

    def start(self, wait: bool = True) -> AutoVerifier:
        self.math.start(wait=wait)  # the reasoning-gym workers start with the first such problem
        return self

    def close(self) -> None:
        self.math.close()
        self.gym.close()


class Reward:
    """A reward: ``reward(completions, golds) -> list[float]``; `close()` releases its workers.

    `spec` is "math" (math-verify, 1/0), "reasoning-gym[?options]", "auto" or ``module:function``
    (module docstring); `format_weight` * the format reward of `format_style` is added (0 by
    default). `timeout` and `retry_timeouts` are the verifier's per-answer limit and whether a
    timed-out answer is judged once more with a longer one. `verifier` (a `MathVerifier`) is used
    instead of a new one for "math", and for the math side of "auto".
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
        self.verifier: MathVerifier | ReasoningGymVerifier | AutoVerifier | None = None
        self._fn: RewardCallable | None = None
        self._owned: list[Any] = []
        if is_gym_reward(spec):
            opts = _gym_options(spec)
            check_installed()
            gym = ReasoningGymVerifier(
                timeout, num_workers=num_workers, retry_timeouts=retry_timeouts,
                allow_last_number=opts.get("last_number", allow_last_number), partial_credit=opts.get("partial_credit", False),
            )  # fmt: skip
            self.verifier = gym
            self._owned.append(gym)
        elif spec in ("math", "auto"):
            if verifier is None:
                verifier = MathVerifier(
                    timeout, num_workers=num_workers, allow_last_number=allow_last_number, retry_timeouts=retry_timeouts
                )
                self._owned.append(verifier)
            self.verifier = verifier
            if spec == "auto":
                gym = ReasoningGymVerifier(
                    timeout, num_workers=num_workers, allow_last_number=allow_last_number, retry_timeouts=retry_timeouts
                )
                self._owned.append(gym)
                self.verifier = AutoVerifier(verifier, gym)
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

    def check(self, problem: Any) -> None:
        """Call a user function once, as training will, on two completions of `problem` (an empty one
        and one that boxes the reference answer): a ConfigError naming the function and what it
        returned or raised when that is not two finite numbers. Built-in rewards are not called (their
        output is this package's own). Meant for set-up, before any model loads or evaluation runs."""
        if self._fn is None:
            return
        gold = problem.answer
        completions = ["", f"The answer is \\boxed{{{gold[0] if isinstance(gold, list) and gold else gold}}}."]
        where = (
            f"reward.function = {self.spec!r} failed its start-up check (called on {len(completions)} completions "
            f"of training problem {getattr(problem, 'id', '?')!r})"
        )
        try:
            values = self._fn(list(completions), [gold] * len(completions))
        except Exception as e:  # noqa: BLE001 - any error of user code, reported with its type
            raise ConfigError(f"{where}: it raised {type(e).__name__}: {e}") from e
        try:
            check_rewards(values, len(completions), self.spec)
        except RewardError as e:
            raise ConfigError(f"{where}: {e}; it must return one finite number per completion") from None

    def start(self) -> None:
        """Start the verifier's workers in the background (they warm up while other work runs)."""
        if self.verifier is not None:
            self.verifier.start(wait=False)

    def close(self) -> None:
        for v in self._owned:
            v.close()

    def __enter__(self) -> Reward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
list[float]`` (one real number per completion), or TRL's, ``fn(prompts, completions, completion_ids,
**columns)`` with every argument by keyword (the problem's fields as columns, and TRL's
``trainer_state``, ``log_extra``, ``log_metric``): `contract` "auto" reads which from the signature in
the worker (`tokencredit.rewards._custom_worker.detect_contract`), "trl" / "tokencredit" choose it.
It follows the built-in verifier's rules
(`UserRewardFunction`): it runs in a worker process of the verifiers' `WorkerPool`
(`_custom_worker.py`, imported once per worker with this process's ``sys.path``), called once per
`Reward.verify` with every completion of the call, under the verifier's time limit: ``timeout``
seconds per completion, so ``timeout`` x the number of completions for the call. A call that runs
past it is stopped (its worker killed and replaced), retried once with `RETRY_FACTOR` x the limit when
``retry_timeouts`` is on, and otherwise scores 0 for each of its completions, which count as timed
out (`Verification.timed_out`, the trainer's ``verify_timeouts``), as an answer the math verifier
could not judge in time does.

Its output is checked (`check_rewards`): a sequence (list, tuple, 1-d array or tensor) of exactly one
real number per completion, each finite and within float32's range (the trainer keeps rewards in
float32). Refused, with one line naming the function, the completion and the value, never a silent
0: a wrong length, a dict (whose keys would be read as the values), a generator, None, a string
(even "1.0"), a bool (True is not a reward of 1.0; return ``float(x)``), NaN / inf, and a finite
value beyond 3.4e38. An exception of the function (``SystemExit`` and ``KeyboardInterrupt``
included: they are the worker's, they cannot end the trainer) and a worker that exits during a call
(``os._exit``, a crash) are errors naming the function too. `Reward.verify` raises these as
`RewardError` (the trainer stops with "training stopped: step N: ..."); `Reward.check` calls the
function once at set-up, on one training problem, and raises them as ConfigError, so that a wrong
contract stops a run before its first evaluation instead of after it (a check that times out is not
an error: the run counts its timeouts).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokencredit.errors import ConfigError, closest
from tokencredit.rewards._custom_worker import (
    CONTRACTS,
    ENV_CONTRACT,
    ENV_FUNCTION,
    ENV_SYS_PATH,
    find_function,
    pack,
    reward_values,
)
from tokencredit.rewards.pool import WorkerPool, WorkerStartError
from tokencredit.rewards.reasoning_gym import ReasoningGymVerifier, check_installed, is_gym_gold
from tokencredit.rewards.shaping import FORMAT_STYLES, format_reward
from tokencredit.rewards.verifier import Gold, MathVerifier, PooledVerifier, Verification

GYM_PREFIX = "reasoning-gym"  # the reward name, and the data prefix "reasoning-gym:"
GYM_OPTIONS = ("partial_credit", "last_number")

RewardCallable = Callable[..., Sequence[float]]


class RewardError(ValueError):
    """A reward function returned something other than one real number per completion, raised, or ended
    its worker process; the message names the function and the rollout (completion index) or the call.
    `kind` says which: "returned", "raised" or "exited"; `detail` is what the function did, worded to
    follow "it" ("raised ValueError: ... (at FILE:LINE in FUNC)")."""

    def __init__(self, message: str, *, kind: str = "returned", detail: str = "") -> None:
        super().__init__(message)
        self.kind, self.detail = kind, detail


def load_reward_function(path: str) -> RewardCallable:
    """Import ``package.module:function`` in this process (dots after the colon walk attributes); a
    ConfigError when it cannot be (a module that fails to import, even by exiting, included). `Reward`
    does not call this: its worker processes import the function (`UserRewardFunction`)."""
    try:
        return find_function(path)
    except LookupError as e:
        raise ConfigError(str(e)) from None


def check_contract(contract: str) -> str:
    """`contract` when it is one of `CONTRACTS` ("auto", "tokencredit", "trl"); else a ConfigError naming
    ``reward.contract`` and the closest valid value."""
    if contract not in CONTRACTS:
        raise ConfigError(
            f"reward.contract must be one of {', '.join(CONTRACTS)}, got {contract!r}{closest(str(contract), CONTRACTS)}"
        )
    return contract


def problem_columns(problems: Sequence[Any]) -> dict[str, list[Any]]:
    """Each field of the problem records (a dataclass such as `tokencredit.data.Problem`, or a mapping) ->
    its value per record, in order: the dataset columns TRL's contract passes. Fields all records share."""
    rows = [
        {f.name: getattr(p, f.name) for f in dataclasses.fields(p)}
        if dataclasses.is_dataclass(p)
        else dict(p)
        for p in problems
    ]
    if not rows:
        return {}
    names = [k for k in rows[0] if all(k in r for r in rows[1:])]
    return {k: [r[k] for r in rows] for k in names}


def _check_spec(path: str) -> None:
    """ConfigError unless `path` has the form ``module:function`` (nothing is imported)."""
    mod_name, colon, attr = path.partition(":") if isinstance(path, str) else ("", "", "")
    if not colon or not mod_name or not attr:
        raise ConfigError(f"reward function must be given as 'module:function', got {path!r}")


def check_rewards(values: Any, n: int, who: str) -> list[float]:
    """Validate a reward function's output: a sequence of n real numbers, each finite and within float32's
    range (else RewardError naming `who`, the rollout and the value). What is refused and why:
    `tokencredit.rewards._custom_worker.reward_values`, the same check a user function's worker applies."""
    try:
        return reward_values(values, n, who)
    except ValueError as e:
        raise RewardError(str(e)) from None


class _Exited:
    """The pool's result for a call whose worker process exited during it (`code`: its exit code)."""

    __slots__ = ("code",)

    def __init__(self, code: int | None) -> None:
        self.code = code


def _exit_text(code: int | None) -> str:
    if code is None:
        return "it did not report how"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _sys_path() -> list[str]:
    """This process's ``sys.path`` for a worker: absolute, so that the worker finds the same modules
    ('' is the current directory)."""
    return [os.path.abspath(os.fspath(p)) for p in sys.path if isinstance(p, str | os.PathLike)]


_CUSTOM_WORKER = str(Path(__file__).with_name("_custom_worker.py"))


class UserRewardFunction(PooledVerifier):
    """A user's ``module:function`` reward under the built-in verifier's rules: called in a worker
    process of a `WorkerPool` (`_custom_worker.py`: the function imported once per worker, with this
    process's ``sys.path`` as it was when this object was made), ``timeout`` seconds per completion of
    a call (``timeout`` x len(completions) for the call), a timed-out call retried once with
    `RETRY_FACTOR` x the limit when `retry_timeouts` is on, else scored 0 per completion and marked
    timed out. `verify` gives the `Verification`; a bad return value, an exception or an exit of the
    worker is a `RewardError` naming the function (module docstring); a function that cannot be
    loaded in the worker is a ConfigError. One worker by default (`num_workers`): a call holds one.
    The arguments reach the worker pickled (the same objects as in this process); the values come
    back as floats. `stats`: "verified" and "retried" count calls, "timeouts" completions. `contract`
    ("auto", "tokencredit", "trl": module docstring) is how the worker calls the function; `called_as`
    is the contract the last finished call used (None before one).
    """

    def __init__(
        self,
        spec: str,
        timeout: float = 5.0,
        *,
        retry_timeouts: bool = False,
        num_workers: int | None = None,
        contract: str = "auto",
    ) -> None:
        _check_spec(spec)
        self.contract = check_contract(contract)
        self.called_as: str | None = None
        env = {ENV_FUNCTION: spec, ENV_SYS_PATH: json.dumps(_sys_path()), ENV_CONTRACT: contract}
        pool = WorkerPool(
            num_workers or 1,
            max_memory_mb=None,
            script=_CUSTOM_WORKER,
            label=f"reward function {spec}",
            package=None,
            env=env,
            crash_result=_Exited,
            quiet=False,
        )
        super().__init__(timeout, retry_timeouts, pool)
        self.spec = spec

    def verify(
        self,
        completions: Sequence[str],
        golds: Sequence[Any],
        *,
        context: Mapping[str, Any] | None = None,
        _retry: bool = True,
        **kwargs: Any,
    ) -> Verification:
        """The function's values on `completions`, or 0 for each and all timed out when the call did not
        finish in time (after the retry when `retry_timeouts` is on; `_retry=False`: no retry, the
        start-up check's rule). `kwargs` are passed to the function; `context` is what TRL's contract
        reads besides (`tokencredit.rewards._custom_worker.trl_arguments`)."""
        n = len(completions)
        if len(golds) != n:
            raise ValueError(f"got {n} completions but {len(golds)} gold answers")
        if n == 0:
            return Verification([], [])
        try:
            job = {"args": pack(list(completions), list(golds), dict(kwargs), context)}
        except Exception as e:  # noqa: BLE001 - an argument pickle cannot carry
            raise RewardError(
                f"reward function {self.spec}: its arguments cannot be sent to its worker process ({type(e).__name__}: {e})"
            ) from None
        limit = self.timeout * n
        with self._lock:
            try:
                result = (self._run([job], limit) if _retry else self._pool.run([job], limit))[0]
            except WorkerStartError as e:
                raise ConfigError(e.detail or str(e)) from None
            if not _retry:
                self.stats["verified"] += 1  # `_run` counts the others
            if result is None:
                self.stats["timeouts"] += n
                return Verification([0.0] * n, [True] * n)
        if isinstance(result, dict) and result.get("contract") in CONTRACTS:
            self.called_as = result["contract"]
        call = f"when called on {n} completion{'s' if n > 1 else ''} (rollout{'s 0-' + str(n - 1) if n > 1 else ' 0'})"
        if isinstance(result, _Exited):
            detail = f"ended its worker process ({_exit_text(result.code)})"
            raise RewardError(
                f"reward function {self.spec} {detail} {call}; a reward must return its values, not exit",
                kind="exited",
                detail=detail,
            )
        error = result.get("error") if isinstance(result, dict) else None
        if error is not None:
            if error.get("kind") == "raised":
                detail = str(error.get("message"))
                raise RewardError(
                    f"reward function {self.spec} {detail} {call}", kind="raised", detail=detail
                )
            raise RewardError(str(error.get("message")))
        values = result.get("values") if isinstance(result, dict) else None
        if not isinstance(values, list) or len(values) != n:  # the worker checked them: never expected
            raise RewardError(f"reward function {self.spec}: its worker answered {result!r:.200}")
        return Verification([float(v) for v in values], [False] * n)

    def score(self, completions: Sequence[str], golds: Sequence[Any], **kwargs: Any) -> list[float]:
        return self.verify(completions, golds, **kwargs).scores

    def start(self, wait: bool = True) -> UserRewardFunction:
        try:
            super().start(wait=wait)
        except WorkerStartError as e:
            raise ConfigError(e.detail or str(e)) from None
        return self


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
            raise ConfigError(
                f"reward {spec!r}: unknown option {key!r}; valid: {', '.join(GYM_OPTIONS)}"
                + closest(key, GYM_OPTIONS)
            )
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
        for verifier, idx in (
            (self.gym, [i for i, g in enumerate(golds) if is_gym_gold(g)]),
            (self.math, [i for i, g in enumerate(golds) if not is_gym_gold(g)]),
        ):
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
    instead of a new one for "math", and for the math side of "auto". `contract` is how a
    ``module:function`` is called ("auto": from its signature; "trl"; "tokencredit"; module docstring),
    `max_steps` the ``trainer_state.max_steps`` TRL's contract receives.
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
        contract: str = "auto",
        max_steps: int | None = None,
    ):
        check_contract(contract)
        if contract != "auto" and is_builtin_reward(spec):
            raise ConfigError(
                f"reward.contract = {contract!r} applies to a module:function reward, not to the built-in {spec!r}; "
                "leave it 'auto'"
            )
        if format_style not in FORMAT_STYLES:
            raise ConfigError(f"format_style must be one of {FORMAT_STYLES}, got {format_style!r}")
        if not math.isfinite(format_weight):
            raise ConfigError(f"format_weight must be finite, got {format_weight}")
        self.spec = spec
        self.format_weight = float(format_weight)
        self.format_style = format_style
        self.max_steps = max_steps
        self.verifier: MathVerifier | ReasoningGymVerifier | AutoVerifier | None = None
        self.user: UserRewardFunction | None = None  # a module:function reward (`verifier` stays None)
        self._owned: list[Any] = []
        if is_gym_reward(spec):
            opts = _gym_options(spec)
            check_installed()
            gym = ReasoningGymVerifier(
                timeout,
                num_workers=num_workers,
                retry_timeouts=retry_timeouts,
                allow_last_number=opts.get("last_number", allow_last_number),
                partial_credit=opts.get("partial_credit", False),
            )
            self.verifier = gym
            self._owned.append(gym)
        elif spec in ("math", "auto"):
            if verifier is None:
                verifier = MathVerifier(
                    timeout,
                    num_workers=num_workers,
                    allow_last_number=allow_last_number,
                    retry_timeouts=retry_timeouts,
                )
                self._owned.append(verifier)
            self.verifier = verifier
            if spec == "auto":
                gym = ReasoningGymVerifier(
                    timeout,
                    num_workers=num_workers,
                    allow_last_number=allow_last_number,
                    retry_timeouts=retry_timeouts,
                )
                self._owned.append(gym)
                self.verifier = AutoVerifier(verifier, gym)
        else:
            self.user = UserRewardFunction(
                spec, timeout, retry_timeouts=retry_timeouts, num_workers=num_workers, contract=contract
            )
            self._owned.append(self.user)
            self.user.start(wait=False)  # the worker imports the function while the caller sets up

    def verify(
        self,
        completions: Sequence[str],
        golds: Sequence[Gold],
        *,
        prompts: Sequence[Any] | None = None,
        completion_ids: Sequence[Sequence[int]] | None = None,
        problems: Sequence[Any] | None = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> Verification:
        """The rewards and which completions timed out (scored 0 for that reason): in the verifier, or
        in a call of a user function that ran past its limit. `kwargs` go to a user function; so do, under
        TRL's contract, each completion's `prompts` (as the model saw them), `completion_ids`, the fields of
        its problem record (`problems`, `problem_columns`) and the training `step` (``trainer_state``)."""
        if self.verifier is not None:
            result = self.verifier.verify(completions, golds)
        else:
            assert self.user is not None
            context = {
                "prompts": None if prompts is None else list(prompts),
                "completion_ids": None
                if completion_ids is None
                else [list(map(int, c)) for c in completion_ids],
                "columns": None if problems is None else problem_columns(problems),
                "step": step,
                "max_steps": self.max_steps,
            }
            result = self.user.verify(completions, golds, context=context, **kwargs)
        scores, timed_out = result.scores, result.timed_out
        if self.format_weight:
            fmt = format_reward(completions, self.format_style)
            scores = [s + self.format_weight * f for s, f in zip(scores, fmt)]
        return Verification(scores, timed_out)

    def __call__(self, completions: Sequence[str], golds: Sequence[Gold], **kwargs: Any) -> list[float]:
        return self.verify(completions, golds, **kwargs).scores

    def check(self, problem: Any) -> None:
        """Call a user function once, as training will (in its worker, under its time limit, without the
        retry), on two completions of `problem` (an empty one and one that boxes the reference answer):
        a ConfigError naming the function and what it returned, raised or did (an exit) when that is not
        two real numbers, or when it cannot be loaded. A call that times out passes (training counts its
        timeouts). Built-in rewards are not called (their output is this package's own). Meant for
        set-up, before any model loads or evaluation runs."""
        if self.user is None:
            return
        gold = problem.answer
        completions = [
            "",
            f"The answer is \\boxed{{{gold[0] if isinstance(gold, list) and gold else gold}}}.",
        ]
        where = (
            f"reward.function = {self.spec!r} failed its start-up check (called on {len(completions)} completions "
            f"of training problem {getattr(problem, 'id', '?')!r})"
        )
        # no tokenizer is loaded yet: the problem text stands for the prompt, and the ids are empty
        context = {
            "prompts": [getattr(problem, "problem", None)] * len(completions),
            "completion_ids": [[] for _ in completions],
            "columns": problem_columns([problem] * len(completions)),
            "step": 0,
            "max_steps": self.max_steps,
        }
        try:
            self.user.verify(completions, [gold] * len(completions), context=context, _retry=False)
        except RewardError as e:
            if e.kind == "returned":
                raise ConfigError(
                    f"{where}: {e}; it must return one finite real number per completion"
                ) from None
            hint = "; a reward must return its values, not exit" if e.kind == "exited" else ""
            raise ConfigError(f"{where}: it {e.detail}{hint}") from None

    def start(self) -> None:
        """Start the verifier's workers in the background (they warm up while other work runs)."""
        if self.verifier is not None:
            self.verifier.start(wait=False)
        elif self.user is not None:
            self.user.start(wait=False)

    def close(self) -> None:
        for v in self._owned:
            v.close()

    def __enter__(self) -> Reward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

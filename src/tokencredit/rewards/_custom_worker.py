"""User reward worker process: runs a ``module:function`` reward (``reward.function``) for
`tokencredit.rewards.custom.Reward`, started as ``python _custom_worker.py`` through the same
`WorkerPool` as the math verifier (a fresh interpreter: the standard library, the pipe set-up of
`_worker.py` and whatever the user's module imports).

The worker imports the function once, at start-up, with the parent's ``sys.path`` (so a module found
through ``PYTHONPATH``, a ``sys.path`` entry added at run time or the current directory is found
here too), and calls it once per job. The parent enforces the time limit by killing a worker that
does not answer in time (the call is then timed out: scored 0 and counted, as a math answer is).
Anything the function raises, ``SystemExit`` and ``KeyboardInterrupt`` included, and anything it
returns other than one real number per completion, is reported to the parent as an error (one line
naming the function, the completion and the value); the parent stops with it. A function that ends
the process (``os._exit``, a crash) is seen by the parent as a worker that exited during a job.

Two call contracts (`CONTRACTS`; ``TOKENCREDIT_REWARD_CONTRACT``, "auto" by default, which reads the
function's signature once at load, `detect_contract`):
  "tokencredit"  ``fn(completions, golds, **kwargs)``;
  "trl"          TRL's: ``fn(prompts=, completions=, completion_ids=, **columns, trainer_state=,
                 log_extra=, log_metric=)``, every argument by keyword (`trl_arguments`).
A function whose signature cannot take the contract's arguments is reported before it is called, with
the other contract named.

Environment: ``TOKENCREDIT_REWARD_FUNCTION`` (``module:function``), ``TOKENCREDIT_REWARD_SYS_PATH``
(the parent's ``sys.path``, a JSON list), ``TOKENCREDIT_REWARD_CONTRACT``.

Protocol, one JSON object per line:
  worker -> parent once ready:  {"ready": true, "self_check": true, "warmup_s": float}
                                or {"ready": true, "self_check": false, "error": str} (cannot load)
  parent -> worker:             {"id": int, "args": str}  (base64 of the pickle of
                                 (completions, golds, kwargs, context): the objects the function is
                                 called with; context: what TRL's contract reads, `trl_arguments`)
  worker -> parent:             {"id": int, "ok": {"values": [float, ...], "contract": str}}
                                or {"id": int, "ok": {"error": {"kind": "raised" | "returned", "message": str},
                                                      "contract": str}}

The worker's standard input is the protocol's, kept private: the function reads an empty stdin
(``input()`` raises EOFError), and what it prints goes to stderr (the terminal).

The validation of the returned values (`reward_values`) lives here, in the standard library only,
and is also what `tokencredit.rewards.check_rewards` applies in the trainer's process.
"""

from __future__ import annotations

import base64
import importlib
import inspect
import json
import math
import os
import pickle
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

ENV_FUNCTION = "TOKENCREDIT_REWARD_FUNCTION"
ENV_SYS_PATH = "TOKENCREDIT_REWARD_SYS_PATH"
ENV_CONTRACT = "TOKENCREDIT_REWARD_CONTRACT"
CONTRACTS = ("auto", "tokencredit", "trl")
# Keywords only TRL's GRPOTrainer passes: a function that names one is written for TRL.
TRL_KEYWORDS = ("prompts", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments")
# TRL's own arguments: a dataset column of the same name does not replace them.
_TRL_RESERVED = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")
SIGNATURES = {
    "tokencredit": "f(completions, golds, **kwargs)",
    "trl": "f(prompts, completions, completion_ids, **columns)",
}
# The trainer keeps rewards in float32: a larger magnitude would become inf there.
FLOAT32_MAX = 3.4028234663852886e38


def short(value: Any, limit: int = 80) -> str:
    """repr(value) with its type, cut to about `limit` characters (for an error message)."""
    try:
        text = repr(value)
    except Exception as e:  # noqa: BLE001 - a user object whose repr fails
        text = f"<repr failed: {type(e).__name__}>"
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{text} ({type(value).__name__})"


def find_function(path: str) -> Callable[..., Any]:
    """Import ``package.module:function`` (dots after the colon walk attributes). Raises LookupError
    with a message naming `path` when it is malformed, cannot be imported (any exception of the
    import, SystemExit included), has no such attribute or is not callable."""
    if not isinstance(path, str) or ":" not in path:
        raise LookupError(f"reward function must be given as 'module:function', got {path!r}")
    mod_name, _, attr = path.partition(":")
    if not mod_name or not attr:
        raise LookupError(f"reward function must be given as 'module:function', got {path!r}")
    try:
        obj: Any = importlib.import_module(mod_name)
    except ImportError as e:
        raise LookupError(f"reward function {path!r}: cannot import module {mod_name!r} ({e})") from e
    except (Exception, SystemExit) as e:  # an error of the module itself (a SyntaxError, an exit at import)
        raise LookupError(
            f"reward function {path!r}: cannot import module {mod_name!r} ({type(e).__name__}: {e})"
        ) from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise LookupError(f"reward function {path!r}: {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise LookupError(f"reward function {path!r} is not callable")
    return obj


def _is_bool(v: Any) -> bool:
    # bool, numpy.bool_, and a 0-d bool array or tensor
    return (
        isinstance(v, bool) or type(v).__name__ in ("bool_", "bool") or "bool" in str(getattr(v, "dtype", ""))
    )


def _real(v: Any) -> float | None:
    """`v` as a float when it is one real number: an int or float (numpy's and other numbers.Real
    types included, a 0-d array or tensor too); None otherwise. A bool, a string (even "1.0"), a
    complex number and a one-element list or array are not real numbers here."""
    if _is_bool(v) or isinstance(v, str | bytes | bytearray | complex):
        return None
    if "complex" in str(getattr(v, "dtype", "")) or getattr(v, "ndim", 0) != 0:
        return None
    if not callable(getattr(type(v), "__float__", None)):
        return None
    try:
        return float(v)
    except OverflowError:
        raise  # an int beyond any float: too large, said as such
    except Exception:  # noqa: BLE001 - a user object whose __float__ fails is not a number
        return None


def reward_values(values: Any, n: int, who: str) -> list[float]:
    """`values` as n floats when it is a sequence (list, tuple, 1-d array or tensor) of n real numbers,
    each finite and within float32's range; else ValueError naming `who` (the function), the completion
    and the value.

    Refused: a dict (its keys would be read as the rewards), a set, a string, a generator or iterator
    (no length), None; a bool (True is not a reward of 1.0: write ``float(x)``), a numeric string
    ("1.0"), NaN / inf, and a finite float beyond float32's largest value (3.4e38), the precision the
    trainer keeps rewards in, where it would become inf."""
    container_ok = (
        not isinstance(values, str | bytes | bytearray | Mapping)
        and hasattr(values, "__len__")
        and hasattr(values, "__getitem__")
    )
    try:
        vals = list(values) if container_ok else None
        length_ok = vals is not None and len(values) == len(vals)
    except Exception:  # noqa: BLE001 - len() of a 0-d array, a user type's failing __iter__
        vals, length_ok = None, False
    if vals is None or not length_ok:
        hint = " (a dict's keys would be read as the rewards)" if isinstance(values, Mapping) else ""
        raise ValueError(
            f"reward function {who} returned {short(values)}, expected a list of {n} floats{hint}"
        )
    if len(vals) != n:
        raise ValueError(
            f"reward function {who} returned {len(vals)} values for {n} completions: {short(values)}"
        )
    out = []
    for i, v in enumerate(vals):
        where = f"for completion {i} (rollout {i})"
        too_large = (
            f"reward function {who} returned {short(v, 40)} {where}: beyond {FLOAT32_MAX:.6g}, the largest float32, "
            "the precision the trainer keeps rewards in (it would become inf there)"
        )
        try:
            f = _real(v)
        except OverflowError:
            raise ValueError(too_large) from None
        if f is None:
            hint = ""
            if _is_bool(v):
                hint = "; a bool is not a reward: return float(x)"
            elif isinstance(v, str | bytes):
                hint = "; a string is not a number, even a numeric one: return float(x)"
            raise ValueError(
                f"reward function {who} returned {short(v)} {where}, expected a real number (int or float){hint}"
            )
        if not math.isfinite(f):
            raise ValueError(f"reward function {who} returned {f} {where}; rewards must be finite")
        if abs(f) > FLOAT32_MAX:
            raise ValueError(too_large)
        out.append(f)
    return out


def detect_contract(fn: Callable[..., Any]) -> str:
    """The contract ("trl" or "tokencredit") of `fn`, from its signature: TRL's when it names a keyword only TRL passes
    (`TRL_KEYWORDS`) or cannot take the gold answers as a second positional argument (``f(completions,
    **kwargs)``); ours otherwise, and when the signature cannot be read. A function that names neither,
    ``f(completions, solution, **kwargs)``, is called as ours (``solution`` gets the gold answers)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or C callable without a readable signature
        return "tokencredit"
    if any(p.name in TRL_KEYWORDS for p in params):
        return "trl"
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return "tokencredit"
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    return "tokencredit" if len(positional) >= 2 else "trl"


def _discard(*args: Any, **kwargs: Any) -> None:
    """TRL's ``log_extra`` / ``log_metric`` here: the trainer's metrics have fixed columns, so what a
    function logs through them is dropped (the call itself must not fail)."""


def trl_arguments(
    completions: list[str], golds: list[Any], kwargs: dict[str, Any], context: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The keywords of a TRL-contract call. `context` (from the caller; None or missing keys when it has
    none): "prompts" (each completion's prompt as the model saw it), "completion_ids" (its token ids),
    "columns" (each problem field -> one value per completion; without them, ``answer`` = `golds`),
    "step" and "max_steps" (`trainer_state`'s ``global_step`` and ``max_steps``). A prompt or ids the
    caller does not have are None. `kwargs` (the caller's own keywords) come after the columns."""
    context = context or {}
    n = len(completions)
    columns = context.get("columns") or {"answer": list(golds)}
    out: dict[str, Any] = {k: list(v) for k, v in columns.items() if k not in _TRL_RESERVED}
    out.update(kwargs)
    out.update(
        prompts=list(context.get("prompts") or [None] * n),
        completions=list(completions),
        completion_ids=list(context.get("completion_ids") or [None] * n),
        trainer_state=SimpleNamespace(
            global_step=int(context.get("step") or 0), max_steps=int(context.get("max_steps") or 0)
        ),
        log_extra=_discard,
        log_metric=_discard,
    )
    return out


def pack(
    completions: list[str],
    golds: list[Any],
    kwargs: dict[str, Any],
    context: Mapping[str, Any] | None = None,
) -> str:
    """The job's arguments as the worker unpacks them (`unpack`)."""
    return base64.b64encode(
        pickle.dumps((completions, golds, kwargs, dict(context or {})), protocol=pickle.HIGHEST_PROTOCOL)
    ).decode("ascii")


def unpack(args: str) -> tuple[list[str], list[Any], dict[str, Any], dict[str, Any]]:
    return pickle.loads(base64.b64decode(args))


def _where(tb: Any) -> str:
    """' (at FILE:LINE in FUNC)' for the innermost frame of a traceback outside this file."""
    frames = [f for f in traceback.extract_tb(tb) if os.path.abspath(f.filename) != os.path.abspath(__file__)]
    if not frames:
        return ""
    f = frames[-1]
    return f" (at {os.path.basename(f.filename)}:{f.lineno} in {f.name})"


def _raised(e: BaseException) -> str:
    """'raised TYPE: MESSAGE (at FILE:LINE in FUNC)', one line."""
    if isinstance(e, SystemExit):
        what = f"raised SystemExit({e.code!r}) (sys.exit or exit() in a reward; it cannot end training)"
    else:
        text = " ".join(str(e).split())
        text = text if len(text) <= 200 else text[:197] + "..."
        what = f"raised {type(e).__name__}" + (f": {text}" if text else "")
    return what + _where(e.__traceback__)


def _unbindable(
    fn: Callable[..., Any], contract: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> str | None:
    """Why `fn`'s signature cannot take the contract's arguments, as a detail that follows "it"; None
    when it can (or its signature cannot be read)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        other = "tokencredit" if contract == "trl" else "trl"
        given = ", ".join(["completions", "golds"][: len(args)] + sorted(kwargs))
        return (
            f"cannot take the arguments of the {contract} contract, {SIGNATURES[contract]} (given: {given}): {e}; "
            f"set reward.contract = {other!r} for {SIGNATURES[other]}"
        )
    return None


def call(fn: Callable[..., Any], who: str, args: str, contract: str = "tokencredit") -> dict[str, Any]:
    """One job: the function called on the unpacked arguments by `contract` ("tokencredit" or "trl"),
    its values checked (`reward_values`)."""
    try:
        completions, golds, kwargs, context = unpack(args)
    except Exception as e:  # noqa: BLE001 - an argument whose class this process cannot import
        what = f"could not receive its arguments in its worker process ({type(e).__name__}: {e})"
        return {"error": {"kind": "raised", "message": what}}
    positional: tuple[Any, ...]
    if contract == "trl":
        positional, keywords = (), trl_arguments(completions, golds, kwargs, context)
    else:
        positional, keywords = (completions, golds), kwargs
    if (why := _unbindable(fn, contract, positional, keywords)) is not None:
        return {"error": {"kind": "raised", "message": why}}
    try:
        out = fn(*positional, **keywords)
    except BaseException as e:  # noqa: BLE001 - SystemExit / KeyboardInterrupt of user code too: reported
        return {"error": {"kind": "raised", "message": _raised(e)}}
    try:
        return {"values": reward_values(out, len(completions), who)}
    except ValueError as e:
        return {"error": {"kind": "returned", "message": str(e)}}
    except BaseException as e:  # noqa: BLE001 - a user type's __len__ / __iter__ / __float__ exiting
        return {"error": {"kind": "raised", "message": f"returned {short(out)}, whose reading {_raised(e)}"}}


def main() -> int:
    from _worker import open_protocol  # the sibling script: this file runs as ``python _custom_worker.py``

    proto = open_protocol()
    # the protocol's input kept private: the function sees an empty stdin
    requests = os.fdopen(os.dup(sys.stdin.fileno()), "r", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, sys.stdin.fileno())
    os.close(devnull)

    spec = os.environ.get(ENV_FUNCTION, "")
    contract = os.environ.get(ENV_CONTRACT) or "auto"
    sys.path[:] = json.loads(os.environ.get(ENV_SYS_PATH, "null")) or sys.path
    t0 = time.perf_counter()
    ready: dict[str, Any] = {"ready": True, "self_check": True}
    fn: Callable[..., Any] | None = None
    try:
        fn = find_function(spec)
    except LookupError as e:
        ready.update(self_check=False, error=str(e))
    except BaseException as e:  # noqa: BLE001 - anything else the import did (a KeyboardInterrupt)
        ready.update(self_check=False, error=f"reward function {spec!r}: loading it {_raised(e)}")
    ready["warmup_s"] = round(time.perf_counter() - t0, 4)
    proto.write(json.dumps(ready) + "\n")
    if fn is None:
        return 1
    if contract not in ("tokencredit", "trl"):
        contract = detect_contract(fn)
    for line in requests:
        if not line.strip():
            continue
        req = json.loads(line)
        result = {**call(fn, spec, req["args"], contract), "contract": contract}
        proto.write(json.dumps({"id": req["id"], "ok": result}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

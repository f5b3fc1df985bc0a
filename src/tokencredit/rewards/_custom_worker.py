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

Environment: ``TOKENCREDIT_REWARD_FUNCTION`` (``module:function``), ``TOKENCREDIT_REWARD_SYS_PATH``
(the parent's ``sys.path``, a JSON list).

Protocol, one JSON object per line:
  worker -> parent once ready:  {"ready": true, "self_check": true, "warmup_s": float}
                                or {"ready": true, "self_check": false, "error": str} (cannot load)
  parent -> worker:             {"id": int, "args": str}  (base64 of the pickle of
                                 (completions, golds, kwargs): the objects the function is called with)
  worker -> parent:             {"id": int, "ok": {"values": [float, ...]}}
                                or {"id": int, "ok": {"error": {"kind": "raised" | "returned", "message": str}}}

The worker's standard input is the protocol's, kept private: the function reads an empty stdin
(``input()`` raises EOFError), and what it prints goes to stderr (the terminal).

The validation of the returned values (`reward_values`) lives here, in the standard library only,
and is also what `tokencredit.rewards.check_rewards` applies in the trainer's process.
"""

from __future__ import annotations

import base64
import importlib
import json
import math
import os
import pickle
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

ENV_FUNCTION = "TOKENCREDIT_REWARD_FUNCTION"
ENV_SYS_PATH = "TOKENCREDIT_REWARD_SYS_PATH"
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


def pack(completions: list[str], golds: list[Any], kwargs: dict[str, Any]) -> str:
    """The job's arguments as the worker unpacks them (`unpack`)."""
    return base64.b64encode(
        pickle.dumps((completions, golds, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    ).decode("ascii")


def unpack(args: str) -> tuple[list[str], list[Any], dict[str, Any]]:
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


def call(fn: Callable[..., Any], who: str, args: str) -> dict[str, Any]:
    """One job: the function called on the unpacked arguments, its values checked (`reward_values`)."""
    try:
        completions, golds, kwargs = unpack(args)
    except Exception as e:  # noqa: BLE001 - an argument whose class this process cannot import
        what = f"could not receive its arguments in its worker process ({type(e).__name__}: {e})"
        return {"error": {"kind": "raised", "message": what}}
    try:
        out = fn(completions, golds, **kwargs)
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
    for line in requests:
        if not line.strip():
            continue
        req = json.loads(line)
        proto.write(json.dumps({"id": req["id"], "ok": call(fn, spec, req["args"])}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

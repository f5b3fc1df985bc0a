"""Verifier worker process, started by `tokencredit.rewards.verifier.MathVerifier` as
``python _worker.py`` (a fresh interpreter: it imports only the standard library and math-verify,
never torch or the rest of tokencredit, so a replacement starts in about a second).

Protocol, one JSON object per line:
  worker -> parent once ready:  {"ready": true, "self_check": bool, "warmup_s": float[, "failed": str]}
  parent -> worker:             {"id": int, "gold": [str, ...], "pred": str}
  worker -> parent:             {"id": int, "ok": bool}
End of stdin ends the worker. The parent enforces the wall-clock limit per answer by killing a
worker that does not answer in time, which is why math-verify's own signal-based timeouts are
off (they only work in the main thread of the main interpreter).

Before it reports ready, the worker judges `SELF_CHECK`: symbolic, tuple, set, interval and radical
comparisons whose first use pays lazy imports and parser set-up (about 1.7 s cold, a few times more
on a loaded machine). Without it, the first timed answers of a fresh worker carried that cost
inside their limit and a right answer could time out. A wrong verdict there means an unsupported
math-verify version, and the parent stops with an error.

SIGINT and SIGTERM are ignored: a Ctrl-C in the terminal reaches the whole process group, and the
trainer finishes its current step (which may still need verdicts) before it closes the workers by
closing their stdin.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time

# (gold, answer) pairs that must verify; one of each kind of comparison the cold path is slow for.
SELF_CHECK = (
    ("x^2+2x+1", "(x+1)^2"),
    ("\\left(1, \\frac{\\pi}{4}\\right)", "(1,\\pi/4)"),
    ("\\{1,2\\}", "\\{2,1\\}"),
    ("[-1,2)", "[-1, 2)"),
    ("\\frac{\\sqrt{2}}{2}", "0.5\\sqrt{2}"),
    ("\\frac{1}{2}", "0.5"),
)


def _limit_memory() -> None:
    # A pathological answer (a power tower) can try to build a gigantic integer; a MemoryError
    # inside this process is a wrong answer, not an out-of-memory machine.
    limit_mb = int(os.environ.get("TOKENCREDIT_VERIFIER_MAX_MB", "0") or 0)
    if limit_mb <= 0:
        return
    try:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        soft = limit_mb << 20
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    except (ImportError, ValueError, OSError):
        pass


def _self_check(judge) -> dict:
    """The ready message: every `SELF_CHECK` pair judged (the warm-up), and how long that took."""
    t0 = time.perf_counter()
    ready: dict = {"ready": True, "self_check": True}
    for gold, pred in SELF_CHECK:
        try:
            ok = judge([gold], pred)
        except Exception as e:  # noqa: BLE001 - reported to the parent, which stops with it
            ok, pred = False, f"{pred} ({type(e).__name__}: {e})"
        if not ok:
            ready.update(self_check=False, failed=f"{gold} vs {pred}")
            break
    ready["warmup_s"] = round(time.perf_counter() - t0, 4)
    return ready


def open_protocol():
    """The worker's side of the pipe, set up as every worker script needs it (also `_rg_worker.py`):
    the protocol channel kept private (anything a library prints goes to stderr instead), the memory
    limit, logging off, SIGINT / SIGTERM ignored (see the module docstring)."""
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1, encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    _limit_memory()
    logging.disable(logging.CRITICAL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return proto


def main() -> int:
    proto = open_protocol()

    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    # The expression extractor only admits digits, operators and brackets before sympy's
    # parse_expr sees them; LaTeX goes through latex2sympy's ANTLR parser. Neither runs the text
    # as Python.
    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]

    def parsed(text: str) -> list:
        return parse("\\boxed{" + text + "}", extraction_config=config, parsing_timeout=None)

    gold_cache: dict[str, list] = {}

    def judge(golds: list[str], pred: str) -> bool:
        target = parsed(pred)
        if not target:
            return False
        for g in golds:
            gp = gold_cache.get(g)
            if gp is None:
                gp = parsed(g)
                if len(gold_cache) > 10_000:
                    gold_cache.clear()
                gold_cache[g] = gp
            if gp and verify(gp, target, timeout_seconds=None):
                return True
        return False

    proto.write(json.dumps(_self_check(judge)) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            ok = bool(judge(list(req["gold"]), str(req["pred"])))
        except Exception:  # noqa: BLE001 - any failure on untrusted text is a wrong answer
            ok = False
        proto.write(json.dumps({"id": req["id"], "ok": ok}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""reasoning-gym checker worker process, started by
`tokencredit.rewards.reasoning_gym.ReasoningGymVerifier` as ``python _rg_worker.py`` through the same
`WorkerPool` as the math verifier (a fresh interpreter: the standard library, reasoning-gym and the
pipe set-up of `_worker.py`, never torch or the rest of tokencredit).

Protocol, one JSON object per line:
  worker -> parent once ready:  {"ready": true, "self_check": bool, "warmup_s": float[, "failed": str]}
  parent -> worker:             {"id": int, "dataset": str, "config": {...}, "index": int,
                                 "question_sha256": str, "answer": str}
  worker -> parent:             {"id": int, "ok": float[, "error": str]}

The worker rebuilds the entry the problem came from, ``reasoning_gym.create_dataset(dataset,
**config)[index]`` (datasets are cached; the generators are seeded, so this is the entry the parent
generated, and the SHA-256 of its question is checked to be sure), and answers with the dataset's own
checker, ``dataset.score_answer(answer=answer, entry=entry)``: a float in [0, 1]. Any exception in
the checker on the (untrusted) answer is a score of 0. A configuration that cannot be built or an
entry whose question differs is reported as an "error" (a bug or a changed package, never the
answer's fault), and the parent stops with it. The parent enforces the wall-clock limit per answer
by killing a worker that does not answer in time.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from collections import OrderedDict

from _worker import open_protocol  # the sibling script: this file runs as ``python _rg_worker.py``

# This directory holds a module named reasoning_gym.py too: off the path, so that ``import
# reasoning_gym`` finds the package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

MAX_DATASETS = 64  # dataset objects kept (one per distinct configuration)


def question_sha256(question: str) -> str:
    return hashlib.sha256(question.encode("utf-8")).hexdigest()


def main() -> int:
    proto = open_protocol()
    t0 = time.perf_counter()
    import reasoning_gym

    datasets: OrderedDict[str, object] = OrderedDict()

    def dataset(name: str, config: dict):
        key = json.dumps([name, config], sort_keys=True)
        ds = datasets.get(key)
        if ds is None:
            ds = reasoning_gym.create_dataset(name, **config)
            datasets[key] = ds
            while len(datasets) > MAX_DATASETS:
                datasets.popitem(last=False)
        return ds

    def judge(req: dict) -> dict:
        try:
            ds = dataset(str(req["dataset"]), dict(req["config"]))
            entry = ds[int(req["index"])]
        except Exception as e:  # noqa: BLE001 - reported to the parent, which stops with it
            return {
                "ok": 0.0,
                "error": f"cannot rebuild {req.get('dataset')!r} entry {req.get('index')}: {type(e).__name__}: {e}",
            }
        if question_sha256(entry["question"]) != req.get("question_sha256"):
            return {
                "ok": 0.0,
                "error": f"{req['dataset']!r} entry {req['index']} differs from the problem it was generated as",
            }
        try:
            score = float(ds.score_answer(answer=req.get("answer"), entry=entry))
        except Exception:  # noqa: BLE001 - any failure on untrusted text is a wrong answer
            score = 0.0
        return {"ok": score if math.isfinite(score) else 0.0}

    ready: dict = {"ready": True, "self_check": True}
    try:  # the warm-up: build a dataset and score its own answer (full marks) and a wrong one
        ds = dataset("chain_sum", {"seed": 0, "size": 1})
        entry = ds[0]
        good, bad = (
            ds.score_answer(answer=entry["answer"], entry=entry),
            ds.score_answer(answer="x", entry=entry),
        )
        if good != 1.0 or bad >= 1.0:
            ready.update(self_check=False, failed=f"chain_sum {entry['answer']!r} vs 'x'")
    except Exception as e:  # noqa: BLE001 - reported to the parent, which stops with it
        ready.update(self_check=False, failed=f"chain_sum ({type(e).__name__}: {e})")
    ready["warmup_s"] = round(time.perf_counter() - t0, 4)
    proto.write(json.dumps(ready) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        proto.write(json.dumps({"id": req["id"], **judge(req)}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

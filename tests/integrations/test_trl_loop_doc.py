"""docs/integrations.md, "The whole loop on a CPU": the shell block is read out of the page and run as written
(TRL trains the toy model on toy data with token credit, saves rollouts, explain renders them), so the page
and what runs cannot drift apart."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.extras  # needs tokencredit[trl]: skipped without it, run by `pytest -m extras`
pytest.importorskip("trl", reason="TRL is not installed (extra tokencredit[trl])")
pd = pytest.importorskip("pandas", reason="TRL's completions table needs pandas")

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "integrations.md"
HEADING = "### The whole loop on a CPU"


def doc_block() -> str:
    """The first ```bash block under HEADING (before the next heading)."""
    text = DOC.read_text(encoding="utf-8")
    assert HEADING in text, f"{DOC} has no section {HEADING!r}"
    section = re.split(r"\n#{1,3} ", text.split(HEADING, 1)[1], maxsplit=1)[0]
    found = re.search(r"```bash\n(.*?)```", section, re.S)
    assert found, f"no bash block under {HEADING!r} in {DOC}"
    return found.group(1)


def test_the_block_is_the_documented_loop():
    block = doc_block()
    for needed in ("--data toy", "--save-rollouts", "--save-every", "tokencredit explain --jsonl"):
        assert needed in block


@pytest.mark.slow
def test_the_whole_trl_loop_runs_as_documented(tmp_path):
    block = doc_block()
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # the block names examples/ relative to the repo
    env = {
        **os.environ,
        "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p),
        "TOKENIZERS_PARALLELISM": "false",
    }
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", block],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"the block failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    run = tmp_path / "runs" / "trl-toy"
    saved = sorted(p.name for p in (run / "rollouts").iterdir())
    assert saved == ["step_000001.jsonl", "step_000002.jsonl"]
    page = (run / "credit.html").read_text(encoding="utf-8")
    assert "ktae" in page and "uniform" in page
    # TRL printed its log lines with the credit metrics
    assert "'credit/gini'" in done.stdout + done.stderr

    # TRL's completions table of step 2 shows the Â the loss received: each completion's mean Â equals the
    # mean of the token advantages saved for that step (the same generation batch), not TRL's scalar.
    table = pd.read_parquet(run / "completions" / "completions_00002.parquet")
    lines = [json.loads(x) for x in (run / "rollouts" / "step_000002.jsonl").read_text().splitlines()]
    saved_means = [
        sum(c["token_advantages"]) / len(c["token_advantages"]) for line in lines for c in line["completions"]
    ]
    saved_a = [c["advantage"] for line in lines for c in line["completions"]]
    assert len(table) == len(saved_means) == 8
    # KTAE spread the credit unevenly somewhere, so the mean of Â and TRL's scalar tell apart
    assert any(abs(m - a) > 1e-4 for m, a in zip(saved_means, saved_a))
    assert sorted(table["advantage"]) == pytest.approx(sorted(saved_means), abs=1e-5)
    assert sorted(table["sequence_advantage"]) == pytest.approx(sorted(saved_a), abs=1e-5)
    assert all(
        lo - 1e-6 <= m <= hi + 1e-6
        for lo, m, hi in zip(table["token_advantage_min"], table["advantage"], table["token_advantage_max"])
    )
    spread = [
        max(c["token_advantages"]) - min(c["token_advantages"]) for line in lines for c in line["completions"]
    ]
    assert sorted(table["token_advantage_max"] - table["token_advantage_min"]) == pytest.approx(
        sorted(spread), abs=1e-5
    )
    assert all(math.isfinite(v) for v in table["advantage"])

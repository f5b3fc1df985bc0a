"""CI's two passes share no test: the first records the tests that passed, the second deselects them.

tests/conftest.py: TOKENCREDIT_TEST_RECORD=FILE writes the node ids of the tests that passed (from the
controlling process under pytest-xdist), TOKENCREDIT_TEST_PASSED=FILE deselects those ids. Checked with a
nested pytest that loads tests/conftest.py as a plugin, over a passing, a failing and a skipped test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SAMPLE = """
import pytest


def test_ok():
    pass


def test_bad():
    assert False


@pytest.mark.skip(reason="not here")
def test_skipped():
    pass
"""


def _pytest(where: Path, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    # the outer run's own settings (an xdist worker's id, CI's record files) must not reach the inner one
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TOKENCREDIT_TEST_"))}
    clean["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # seconds of unrelated plugins' imports; xdist by name
    clean["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), clean.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "conftest",
            "--rootdir",
            str(where),
            *args,
        ],
        cwd=where,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_second_pass_runs_only_what_the_first_did_not_pass(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    record = tmp_path / "passed.txt"
    # -n 2: the workers run the tests and the controller writes the file
    first = _pytest(
        tmp_path, ["-p", "xdist.plugin", "-n", "2", "test_sample.py"], TOKENCREDIT_TEST_RECORD=str(record)
    )
    assert "1 failed, 1 passed, 1 skipped" in first.stdout, first.stdout[-3000:] + first.stderr[-3000:]
    assert record.read_text().splitlines() == ["test_sample.py::test_ok"]

    second = _pytest(tmp_path, ["test_sample.py"], TOKENCREDIT_TEST_PASSED=str(record))
    assert "1 failed, 1 skipped, 1 deselected" in second.stdout, second.stdout[-3000:]

    record.write_text("test_sample.py::test_ok\ntest_sample.py::test_bad\ntest_sample.py::test_skipped\n")
    none_left = _pytest(tmp_path, ["test_sample.py"], TOKENCREDIT_TEST_PASSED=str(record))
    assert none_left.returncode == 5 and "3 deselected" in none_left.stdout, none_left.stdout[-3000:]

    unset = _pytest(tmp_path, ["test_sample.py"])  # neither variable: nothing written, nothing deselected
    assert "1 failed, 1 passed, 1 skipped" in unset.stdout and "deselected" not in unset.stdout

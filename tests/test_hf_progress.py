"""The Hugging Face libraries' progress bars are off in tokencredit's commands unless
TOKENCREDIT_PROGRESS_BARS=1 asks for them (issue 31)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tokencredit import hf_progress
from tokencredit.errors import ConfigError

# a command that imports no transformers itself, then transformers as the next command would
PROBE = (
    "from tokencredit import cli; cli.main(['recipes', 'grpo']); "
    "from transformers.utils import logging; print('bars on:', logging.is_progress_bar_enabled())"
)


@pytest.mark.parametrize(
    ("value", "on"), [("", False), ("0", False), ("off", False), ("1", True), (" Yes ", True)]
)
def test_the_switch_reads(value, on, monkeypatch):
    monkeypatch.setenv(hf_progress.ENV, value)
    assert hf_progress.requested() is on


def test_a_bad_switch_value_is_an_error(monkeypatch):
    monkeypatch.setenv(hf_progress.ENV, "maybe")
    with pytest.raises(ConfigError, match="TOKENCREDIT_PROGRESS_BARS='maybe': expected 1"):
        hf_progress.requested()


def test_quiet_by_default_keeps_what_the_user_set(monkeypatch):
    monkeypatch.delenv(hf_progress.ENV, raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    monkeypatch.delenv("HF_DATASETS_DISABLE_PROGRESS_BARS", raising=False)
    hf_progress.quiet_by_default()
    assert (
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"
        and os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] == "1"
    )
    monkeypatch.delenv("HF_DATASETS_DISABLE_PROGRESS_BARS")
    monkeypatch.setenv(hf_progress.ENV, "1")
    hf_progress.quiet_by_default()
    assert "HF_DATASETS_DISABLE_PROGRESS_BARS" not in os.environ


@pytest.mark.parametrize(("value", "on"), [(None, False), ("1", True)])
def test_a_command_turns_transformers_bars_off_unless_asked(value, on):
    env = {k: v for k, v in os.environ.items() if k not in (hf_progress.ENV, *hf_progress.HF_SWITCHES)}
    if value is not None:
        env[hf_progress.ENV] = value
    r = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"bars on: {on}" in r.stdout

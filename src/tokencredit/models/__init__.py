"""Loading models: the embedded toy models or a local Hugging Face causal LM, on a device, in a dtype,
with a LoRA adapter; restoring checkpoint parameters; a tokenizer's special ids.

`load_model("toy")` / `load_model("toy-hard")` load the shipped warm starts (`tokencredit.models.toy`,
built by `tokencredit.models.warm_start`); `load_model(path)` any local Hugging Face causal LM,
never downloading anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tokencredit.errors import ConfigError
from tokencredit.models.toy import (
    CHAT_TEMPLATE,
    EOS_TOKEN,
    IM_START,
    PAD_TOKEN,
    REBUILD_COMMAND,
    SPECIAL_TOKENS,
    TOY_ASSET_DIR,
    TOY_HARD_ASSET_DIR,
    TOY_HARD_CONFIG,
    TOY_MODEL_CONFIG,
    TOY_VARIANTS,
    ToyVariant,
    WarmStartConfig,
    build_toy_model,
    build_toy_tokenizer,
    toy_task,
    toy_variant,
    toy_vocabulary,
)
from tokencredit.models.warm_start import build_toy, toy_accuracy, warm_start

__all__ = [
    "CHAT_TEMPLATE", "EOS_TOKEN", "IM_START", "PAD_TOKEN", "REBUILD_COMMAND", "SPECIAL_TOKENS", "TOY_ASSET_DIR",
    "TOY_HARD_ASSET_DIR", "TOY_HARD_CONFIG", "TOY_MODEL_CONFIG", "TOY_VARIANTS", "ToyVariant", "WarmStartConfig",
    "add_lora", "build_toy", "build_toy_model", "build_toy_tokenizer", "load_model", "load_tokenizer",
    "model_path", "resolve_device",
    "resolve_dtype", "restore_parameters", "special_token_ids", "toy_accuracy", "toy_task", "toy_variant",
    "toy_vocabulary", "warm_start",
]  # fmt: skip

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A torch dtype from its name ("float32", "bfloat16", "float16") or itself."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}: use one of {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def resolve_device(name: str, what: str = "device") -> torch.device:
    """"auto" -> the first CUDA device if there is one, else the CPU; otherwise `name`, checked to exist
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


def model_path(name_or_path: str) -> Path:
    """The directory of "toy" / "toy-hard" (checked to be installed) or of a local model, checked to exist."""
    if name_or_path in TOY_VARIANTS:
        variant = TOY_VARIANTS[name_or_path]
        path = variant.asset_dir
        missing = [f for f in ("config.json", "model.safetensors", "tokenizer.json") if not (path / f).is_file()]
        if missing:
            raise ConfigError(
                f"the {variant.name} model is not installed ({', '.join(missing)} missing in {path}); "
                f"rebuild it with `{variant.rebuild_command}`"
            )
        return path
    path = Path(name_or_path).expanduser()
    if not path.exists():
        raise ConfigError(
            f"model path {name_or_path!r} does not exist (give 'toy', 'toy-hard' or a local directory with a "
            "Hugging Face causal LM; models are never downloaded)"
        )
    if not path.is_dir():
        raise ConfigError(f"model path {name_or_path!r} is not a directory")
    return path


def load_tokenizer(name_or_path: str | Path) -> Any:
    """The tokenizer of a model (as `load_model` returns it): EOS required, pad = EOS when unset, left padding."""
    path = model_path(str(name_or_path))
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tokenizer.eos_token is None or tokenizer.eos_token_id is None:
        raise ConfigError(f"the tokenizer in {path} has no EOS token: generation could never stop")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_model(
    name_or_path: str, *, dtype: torch.dtype | str = torch.float32, device: str | torch.device = "cpu"
) -> tuple[Any, Any]:
    """(model, tokenizer) in eval mode on `device`.

    "toy" (or "toy-hard") loads a shipped warm start; anything else is a local directory holding a Hugging Face
    causal LM and its tokenizer (loaded with ``local_files_only=True``: nothing is downloaded).
    The tokenizer must define an EOS token; a missing pad token is set to EOS, and padding is on the
    left (decoder-only generation).
    """
    tokenizer = load_tokenizer(name_or_path)
    path = model_path(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=resolve_dtype(dtype))
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
    ids |= {i for i in (getattr(tokenizer, "eos_token_id", None), getattr(tokenizer, "pad_token_id", None)) if i is not None}
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
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=present, task_type="CAUSAL_LM")
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

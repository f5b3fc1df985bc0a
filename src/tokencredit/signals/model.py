"""The model parts the signals pass reads (decoder, LM head, softcap), LoRA adapters, eval mode."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from torch import Tensor, nn

from tokencredit.errors import ConfigError

_LORA_ERROR = "ARCA / policy-divergence need a LoRA adapter (set lora.rank > 0)"


def _unwrap(model: nn.Module) -> nn.Module:
    """The transformers model under a peft wrapper (LoRA layers are injected into it in place)."""
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    if not isinstance(base, nn.Module):  # (narrows the duck-typed call's result)
        raise TypeError(
            f"{type(model).__name__}.get_base_model() returned {type(base).__name__}, not a module"
        )
    return base


def _model_parts(model: nn.Module) -> tuple[nn.Module, nn.Module, float | None]:
    """(decoder returning the post-norm last hidden state, LM head module, logit softcap or None)."""
    core = _unwrap(model)
    get_decoder = getattr(core, "get_decoder", None)
    get_head = getattr(core, "get_output_embeddings", None)
    decoder = get_decoder() if callable(get_decoder) else None
    head = get_head() if callable(get_head) else None
    if not isinstance(decoder, nn.Module) or not isinstance(head, nn.Module) or decoder is core:
        raise ConfigError(
            f"tokencredit.signals needs a transformers causal LM with get_decoder() and get_output_embeddings() "
            f"(got {type(core).__name__})"
        )
    cfg = getattr(core, "config", None)
    if cfg is not None and callable(getattr(cfg, "get_text_config", None)):
        cfg = cfg.get_text_config()
    for attr in ("logits_scaling", "logit_scale", "output_multiplier"):
        value = getattr(cfg, attr, None)
        if value is not None and value != 1:
            raise ConfigError(
                f"{type(core).__name__} rescales its logits by config.{attr}={value}; tokencredit.signals forms logits "
                "as lm_head(final hidden state) (+ final_logit_softcapping) and does not support this model"
            )
    cap = getattr(cfg, "final_logit_softcapping", None)
    return decoder, head, (float(cap) if cap else None)


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """[N, L] int64 position ids cumsum(mask) - 1, 0 on padding (what `generate` uses for left padding)."""
    mask = attention_mask.long()
    return (mask.cumsum(-1) - 1).clamp_(min=0).masked_fill_(mask == 0, 0)


def has_lora_adapter(model: nn.Module) -> bool:
    """True iff `model` holds a peft LoRA layer whose active adapter has rank > 0."""
    if "peft" not in sys.modules:  # no LoRA layer can exist before peft is imported; spare its import
        return False
    from peft.tuners.lora import LoraLayer

    for module in model.modules():
        if isinstance(module, LoraLayer):
            ranks = getattr(module, "r", {})
            if any(ranks.get(name, 0) > 0 for name in module.active_adapters):
                return True
    return False


@contextmanager
def _adapter_disabled(model: nn.Module) -> Iterator[None]:
    """Run with every adapter switched off, then restore each layer's previous state."""
    disable = getattr(model, "disable_adapter", None)
    if callable(disable):  # peft.PeftModel: its own context also covers modules_to_save
        context = disable()
        if not isinstance(context, AbstractContextManager):  # (narrows the duck-typed call's result)
            raise TypeError(f"{type(model).__name__}.disable_adapter() returned no context manager")
        with context:
            yield
        return
    # LoRA injected without a PeftModel wrapper (e.g. transformers' load_adapter): toggle the layers.
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    saved = [m.disable_adapters for m in layers]
    try:
        for m in layers:
            m.enable_adapters(False)
        yield
    finally:
        for m, was_disabled in zip(layers, saved):
            m.enable_adapters(not was_disabled)


@contextmanager
def eval_mode(*models: nn.Module | None) -> Iterator[None]:
    """Eval mode (no dropout) inside; every submodule's own train/eval flag restored after."""
    saved = [(m, m.training) for model in models if model is not None for m in model.modules()]
    try:
        for model in models:
            if model is not None:
                model.eval()
        yield
    finally:
        for m, flag in saved:
            m.training = flag

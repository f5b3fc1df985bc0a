"""`compute_signals`: every per-token signal a recipe needs, in the fewest no-grad forwards."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypedDict

import torch
from torch import Tensor, nn

from tokencredit.batch import MC_SIGNALS, REDUCED_SIGNALS, SIGNALS
from tokencredit.errors import ConfigError, closest
from tokencredit.signals.forward import _asked, _check_ids, _check_layout, _forward_stats
from tokencredit.signals.head import DEFAULT_CHUNK_SIZE, cat_rows
from tokencredit.signals.model import (
    _LORA_ERROR,
    _adapter_disabled,
    _model_parts,
    eval_mode,
    has_lora_adapter,
    position_ids_from_mask,
)

_POLICY_SIGNALS = ("old_log_probs", "entropy", "hidden", "sum_sq_probs")
_BASE_SIGNALS = ("base_hidden", "base_log_probs")


class _PassSettings(TypedDict):
    """The keyword arguments every `_pass` of one `compute_signals` call shares."""

    temperature: float
    chunk_size: int
    batch_size: int


def _pass(
    model: nn.Module,
    sequences: Tensor,
    attention_mask: Tensor,
    prompt_len: int,
    response_mask: Tensor,
    *,
    want_log_p: bool,
    want_entropy: bool,
    want_hidden: bool,
    want_sum_sq: bool = False,
    temperature: float,
    chunk_size: int,
    batch_size: int,
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """One forward per micro-batch of `batch_size` rows; results concatenated over rows."""
    decoder, head, softcap = _model_parts(model)
    _check_ids(model, sequences, "sequences")
    position_ids = position_ids_from_mask(attention_mask)
    parts: list[tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]] = []
    for start in range(0, sequences.shape[0], batch_size):
        rows = slice(start, start + batch_size)
        parts.append(
            _forward_stats(
                decoder,
                head,
                softcap,
                sequences[rows],
                attention_mask[rows],
                position_ids[rows],
                prompt_len,
                response_mask[rows],
                want_log_p=want_log_p,
                want_entropy=want_entropy,
                want_hidden=want_hidden,
                want_sum_sq=want_sum_sq,
                temperature=temperature,
                chunk_size=chunk_size,
            )
        )
    lp, ent, hid, sq = (cat_rows([p[k] for p in parts]) for k in range(4))
    return lp, ent, hid, sq


def _check_needs(needs: Iterable[str]) -> set[str]:
    needs = set(needs)
    for name in sorted(needs):
        if name not in SIGNALS:
            raise ConfigError(f"unknown signal {name!r}{closest(name, SIGNALS)}; known: {', '.join(SIGNALS)}")
        if name in MC_SIGNALS:
            raise ConfigError(
                f"signal {name!r} comes from sampling continuations (tokencredit.oracle.mc_signals), not a forward pass"
            )
        if name in REDUCED_SIGNALS:
            raise ConfigError(
                f"signal {name!r} is a reduction of hidden states that an engine computes where they live (verl's "
                "workers); here the credit method reads the hidden states themselves"
            )
    return needs


def compute_signals(
    model: nn.Module,
    sequences: Tensor,
    attention_mask: Tensor,
    prompt_len: int,
    response_mask: Tensor,
    needs: Iterable[str],
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    batch_size: int | None = None,
    ref_model: nn.Module | None = None,
    neg_sequences: Tensor | None = None,
    neg_attention_mask: Tensor | None = None,
    neg_prompt_len: int | None = None,
) -> dict[str, Tensor]:
    """The per-token signals `needs` (names from tokencredit.batch.SIGNALS), detached float32, 0 where masked:
    {name: [N,T]} (hidden / base_hidden [N,T,H], the LM-head input, hidden[:, t] predicting token t).

    The passes (module docstring of tokencredit.signals): old policy; LoRA adapter disabled (also the
    reference when `ref_model` is None); `ref_model`; GCPO's negative prompt (`neg_sequences` [N, P'+T],
    `neg_prompt_len` = P'), each one forward per micro-batch of `batch_size` rows, all in eval mode.
    ConfigError for an unknown name or base_* / ref_log_probs without an adapter or reference;
    ValueError for inconsistent shapes or negative-prompt inputs.
    """
    needs = _check_needs(needs)
    t = _check_layout(sequences, attention_mask, prompt_len, response_mask)
    batch_size = _check_batch_size(sequences.shape[0] if batch_size is None else batch_size)
    response_mask = response_mask.bool()
    ref_from_base = "ref_log_probs" in needs and ref_model is None
    base_needed = bool(needs & set(_BASE_SIGNALS)) or ref_from_base
    _check_base(model, needs, base_needed)
    neg = (
        _check_negative(
            sequences, prompt_len, response_mask, t, neg_sequences, neg_attention_mask, neg_prompt_len
        )
        if "neg_log_probs" in needs
        else None
    )
    kw = _PassSettings(temperature=temperature, chunk_size=chunk_size, batch_size=batch_size)
    args = (sequences, attention_mask, prompt_len, response_mask)
    # None: a statistic a pass was not asked for (dropped below with the signals not in `needs`)
    out: dict[str, Tensor | None] = {}
    with torch.no_grad(), eval_mode(model, ref_model):
        if needs & set(_POLICY_SIGNALS):
            lp, ent, hid, sq = _pass(
                model,
                *args,
                want_log_p="old_log_probs" in needs,
                want_entropy="entropy" in needs,
                want_hidden="hidden" in needs,
                want_sum_sq="sum_sq_probs" in needs,
                **kw,
            )
            out.update(old_log_probs=lp, entropy=ent, hidden=hid, sum_sq_probs=sq)
        if base_needed:
            with _adapter_disabled(model):
                lp, _, hid, _ = _pass(
                    model,
                    *args,
                    want_log_p="base_log_probs" in needs or ref_from_base,
                    want_entropy=False,
                    want_hidden="base_hidden" in needs,
                    **kw,
                )
            out.update(base_log_probs=lp, base_hidden=hid)
            if ref_from_base:
                out["ref_log_probs"] = _asked(lp, "base_log_probs").clone()
        if "ref_log_probs" in needs and ref_model is not None:
            out["ref_log_probs"] = _pass(
                ref_model, *args, want_log_p=True, want_entropy=False, want_hidden=False, **kw
            )[0]
        if neg is not None:
            out["neg_log_probs"] = _pass(
                model, *neg, response_mask, want_log_p=True, want_entropy=False, want_hidden=False, **kw
            )[0]
    return {name: value.detach() for name, value in out.items() if name in needs and value is not None}


def _check_batch_size(batch_size: int) -> int:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return batch_size


def _check_base(model: nn.Module, needs: set[str], base_needed: bool) -> None:
    """The adapter-disabled pass needs a LoRA adapter to disable (the base is the reference under LoRA)."""
    if base_needed and not has_lora_adapter(model):
        if needs & set(_BASE_SIGNALS):
            raise ConfigError(_LORA_ERROR)
        raise ConfigError(
            "ref_log_probs needs ref_model= (or a LoRA adapter, whose disabled base serves as the reference)"
        )


def _check_negative(
    sequences: Tensor,
    prompt_len: int,
    response_mask: Tensor,
    t: int,
    neg_sequences: Tensor | None,
    neg_attention_mask: Tensor | None,
    neg_prompt_len: int | None,
) -> tuple[Tensor, Tensor, int]:
    """GCPO's negative-prompt inputs: present, the same N rows and T response columns, the same response tokens.

    Returns them, no longer optional: (neg_sequences [N, P'+T], neg_attention_mask [N, P'+T], P')."""
    if neg_sequences is None or neg_attention_mask is None or neg_prompt_len is None:
        raise ValueError(
            "neg_log_probs needs neg_sequences, neg_attention_mask and neg_prompt_len (GCPO's negative prompt)"
        )
    n = sequences.shape[0]
    if (
        neg_sequences.dim() != 2
        or neg_sequences.shape[0] != n
        or not isinstance(neg_prompt_len, int)
        or neg_sequences.shape[1] - neg_prompt_len != t
    ):
        raise ValueError(
            f"neg_sequences: expected {n} rows with the same {t} response columns after neg_prompt_len, "
            f"got shape {tuple(neg_sequences.shape)} with neg_prompt_len {neg_prompt_len!r}"
        )
    _check_layout(neg_sequences, neg_attention_mask, neg_prompt_len, response_mask, what="neg_sequences")
    differs = (neg_sequences[:, neg_prompt_len:] != sequences[:, prompt_len:]) & response_mask
    if bool(differs.any()):
        i, j = (int(x) for x in differs.nonzero()[0])
        raise ValueError(f"neg_sequences: response token {j} of rollout {i} differs from sequences'")
    return neg_sequences, neg_attention_mask, neg_prompt_len


def negative_prompt_inputs(
    tokenizer: Any,
    prompts: Sequence[str],
    response_ids: Tensor,
    response_mask: Tensor,
    add_special_tokens: bool | None = None,
) -> dict[str, Any]:
    """`compute_signals`'s GCPO inputs: each negative prompt (already rendered as text) followed by
    the same response tokens, [N, P' + T].

    The prompts are left-padded and tokenised as the engine tokenised the real prompts: by default
    as `tokencredit.rollout.generate` does (special tokens added unless every text already starts
    with the BOS token); an engine that never adds them (TRL) passes add_special_tokens=False.
    """
    bos = getattr(tokenizer, "bos_token", None)
    add_special = (
        not (bos and all(p.startswith(bos) for p in prompts))
        if add_special_tokens is None
        else add_special_tokens
    )
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        enc = tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=add_special)
    finally:
        tokenizer.padding_side = side
    device = response_ids.device
    return {
        "neg_sequences": torch.cat([enc["input_ids"].to(device), response_ids], dim=1),
        "neg_attention_mask": torch.cat([enc["attention_mask"].to(device), response_mask.long()], dim=1),
        "neg_prompt_len": int(enc["input_ids"].shape[1]),
    }

"""The value model: the policy architecture's decoder (its backbone, without the LM head) and a scalar head.

V_t, the value of the state s_t = (prompt, y_<t) before response token t, is read from the decoder's final
hidden state at the column of the token before y_t (the last prompt token for t = 0): the same column whose
LM-head output gives log pi(y_t), and the columns verl's critic keeps (``values[:, -T - 1 : -1]``). The
EOS token is the last valid response token: V at its position values the state before EOS is emitted;
the hidden state of the EOS token itself is never read (the state after it is terminal, V = 0 in GAE).

The head is Linear(H, 1) with zero weight and bias, so a fresh critic predicts the same value for every
state (0, or the middle of its bounds) and its first targets, not a random projection, shape it. With
bounds [lo, hi] (BPCO's value predictions bounded to the reward range) the head's output x becomes
V = lo + (hi - lo) sigmoid(x); with one bound only, V is clamped to it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tokencredit.errors import ConfigError
from tokencredit.signals.forward import _check_layout
from tokencredit.signals.model import _model_parts, position_ids_from_mask
from tokencredit.signals.prefix import decoder_hidden

__all__ = ["ValueModel"]


class ValueModel(nn.Module):
    """V [N,T] from (prompt, response) sequences: `decoder` (a causal LM's backbone) + `head` Linear(H, 1)."""

    def __init__(
        self, causal_lm: nn.Module, value_min: float = -math.inf, value_max: float = math.inf
    ) -> None:
        super().__init__()
        if not value_min < value_max:
            raise ConfigError(
                f"value bounds must satisfy value_min < value_max, got [{value_min}, {value_max}]"
            )
        self.decoder = _model_parts(causal_lm)[0]  # the LM head is dropped (its weights stay with the policy)
        cfg = getattr(causal_lm, "config", None)
        if cfg is not None and callable(getattr(cfg, "get_text_config", None)):
            cfg = cfg.get_text_config()
        hidden = int(getattr(cfg, "hidden_size", 0) or 0)
        if hidden <= 0:
            raise ConfigError(
                f"{type(causal_lm).__name__}: no config.hidden_size to size the value head with"
            )
        dtype = next(self.decoder.parameters()).dtype
        self.head = nn.Linear(hidden, 1, dtype=dtype)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.value_min, self.value_max = float(value_min), float(value_max)

    def bound(self, x: Tensor) -> Tensor:
        """The head's output -> V within [value_min, value_max] (module docstring)."""
        lo, hi = self.value_min, self.value_max
        if math.isfinite(lo) and math.isfinite(hi):
            return lo + (hi - lo) * torch.sigmoid(x)
        return x.clamp(lo, hi)

    def forward(
        self, sequences: Tensor, attention_mask: Tensor, prompt_len: int, response_mask: Tensor
    ) -> Tensor:
        """V [N,T] float32, 0 off `response_mask`; differentiable under grad. sequences / attention_mask
        [N, P+T] (prompts left-padded to `prompt_len` columns), response_mask [N,T] bool."""
        t = _check_layout(sequences, attention_mask, prompt_len, response_mask)
        mask = response_mask.bool()
        valid_cols = mask.any(0).nonzero()
        t_keep = int(valid_cols[-1]) + 1 if valid_cols.numel() else 1
        attended = attention_mask[:, :prompt_len].ne(0).any(0).nonzero()
        lead = min(int(attended[0]) if attended.numel() else prompt_len - 1, prompt_len - 1)
        # [N, t_keep, H]: column P-1+t, the state before response token t (columns after the last valid
        # token cannot change earlier ones under causal attention, so they are not run)
        h = decoder_hidden(
            self.decoder,
            sequences,
            attention_mask,
            position_ids_from_mask(attention_mask),
            prompt_len,
            lead,
            prompt_len - 1 + t_keep,
        )
        x = self.head(h.to(self.head.weight.dtype)).squeeze(-1).float()
        v = self.bound(x)
        out = torch.zeros(mask.shape[0], t, dtype=torch.float32, device=v.device)
        out[:, :t_keep] = torch.where(mask[:, :t_keep], v, torch.zeros((), device=v.device))
        return out

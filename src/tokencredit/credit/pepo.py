"""PEPO: proximal entropy policy optimisation (Kim & Kwak 2026, arXiv 2609.39402, NeurIPS 2026).

Token importance is the entropy of a token *relative to its neighbours*, not to the batch (Eq. 6):

    e_{i,t} = exp(H_{i,t}) / sum_{k in W(t)} exp(H_{i,k}),   W(t) = {k : |k - t| <= W / 2},

a softmax over a window of the response's own entropies centred on t (temperature 1, W = 101 in the
paper), with reflect padding where the window crosses the response's first or last token (App. C.2:
the entropies are mirrored across the boundary, the boundary token itself not repeated). The
proximal entropies are renormalised to sum to the response's length and multiply A (Eq. 7):

    c_{i,t} = T_i e_{i,t} / sum_k e_{i,k},   Â_{i,t} = c_{i,t} A_i   on positive rollouts,

while failed rollouts keep the uniform A_i (Sec. 4: "we apply proximal-entropy weighting only to
positive-reward rollouts"). The objective is GRPO's token-mean clip with eps_high 0.28 (Eq. 8).

Exact in the paper: Eq. 6 and 7, W = 101, temperature 1 (a parameter: App. F.3 sweeps 0.5 / 1 / 2),
reflect padding, positive rollouts only (`positive_only=False`: Table 12's all-rollout ablation). Ours:
- "positive" is A_i > 0. With a binary reward and a group baseline it is the paper's r_i = 1 apart
  from all-correct groups, where A_i = 0 and Â = 0 either way;
- a response shorter than the half window cannot be mirrored once; the reflection is repeated
  (period 2 (T_i - 1), numpy's "reflect" padding), and T_i = 1 gives c = 1;
- an even W covers the W + 1 positions of the paper's set W(t).

`tokencredit.credit.entropy.proximal_entropy` computes Eq. 6 (vectorised: the window sums are one
`unfold` view over the reflect-padded rows; no loop over tokens). It reads each response's own valid
tokens only, so c of a row never depends on its padding or on other rows: a sharded batch needs no
collective. The same proximal frame ranks the 80/20 rule's kept set with
``credit_params={"frame": "proximal"}`` (`entropy-80-20`; the paper's Table 3).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tokencredit.batch import RolloutBatch
from tokencredit.credit.entropy import DEFAULT_WINDOW, check_temperature, check_window, proximal_entropy
from tokencredit.credit.registry import register
from tokencredit.errors import ConfigError

__all__ = ["DEFAULT_WINDOW", "pepo", "proximal_entropy", "proximal_weights"]


def proximal_weights(
    entropy: Tensor, mask: Tensor, window: int = DEFAULT_WINDOW, temperature: float = 1.0
) -> Tensor:
    """c [N,T] float64 (Eq. 7): proximal entropy rescaled to sum to T_i (mean 1) over each row's valid tokens.

    Equal entropies give c = 1; T_i = 1 gives c = 1; a row without valid tokens and padding are 0.
    """
    e = proximal_entropy(entropy, mask, window, temperature)
    valid = mask.bool()
    total = e.sum(-1, keepdim=True)
    count = valid.sum(-1, keepdim=True).to(e.dtype)
    # every non-empty row has total > 0: the token of largest entropy has e >= 1 / (2 floor(W/2) + 1)
    return torch.where(valid, e * count / total.clamp(min=torch.finfo(e.dtype).tiny), torch.zeros_like(e))


@register(
    "pepo",
    needs=("entropy",),
    paper="Kim & Kwak 2026, PEPO: Proximal Entropy Policy Optimization, NeurIPS (arXiv 2609.39402)",
    reconstruction="'positive rollout' read as A > 0; responses shorter than W / 2 repeat the reflection",
)
def pepo(
    batch: RolloutBatch,
    advantages: Tensor,
    window: int = DEFAULT_WINDOW,
    temperature: float = 1.0,
    positive_only: bool = True,
) -> Tensor:
    """Â = c A on positive rollouts, c = proximal-entropy weights (mean 1 per response); A elsewhere.

    window: W (101); temperature: the softmax's tau (1; App. F.3); positive_only=False weights every
    rollout (the paper's ablation, Table 12: "continuous weighting on all rollouts")."""
    if not isinstance(positive_only, bool):
        raise ConfigError(f"pepo: positive_only must be true or false, got {positive_only!r}")
    check_window(window, "pepo")
    check_temperature(temperature, "pepo")
    entropy = batch.signal("entropy", "credit method 'pepo'")
    c = proximal_weights(entropy, batch.mask, window, temperature)
    a = advantages.double()[:, None]
    weighted = (advantages > 0)[:, None] if positive_only else torch.ones_like(batch.mask)
    return torch.where(weighted, c * a, a.expand_as(c)).float()

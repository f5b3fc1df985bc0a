"""Reduced signals: a batch carrying ARCA's `adapter_residual` or DelTA's `delta_coefficients` (computed where the
hidden states live, e.g. verl's workers) gets the same Â from `credit.compute` as the hidden states give, and needs
no hidden state."""

from __future__ import annotations

import pytest
import torch

from tokencredit import advantages, credit
from tokencredit.batch import REDUCED_SIGNALS, RolloutBatch
from tokencredit.credit.arca import residual_norm
from tokencredit.credit.delta import delta_coefficients
from tokencredit.errors import ConfigError
from tokencredit.signals import compute_signals


def full_batch(seed: int = 0) -> RolloutBatch:
    gen = torch.Generator().manual_seed(seed)
    n, t, h = 8, 7, 5
    mask = torch.arange(t)[None] < torch.randint(1, t + 1, (n,), generator=gen)[:, None]
    hidden = torch.randn(n, t, h, generator=gen)
    return RolloutBatch(
        token_ids=torch.randint(0, 9, (n, t), generator=gen),
        mask=mask,
        group_ids=torch.arange(n) // 4,
        scores=torch.tensor([1.0, 0, 0, 1, 0, 1, 1, 1]),
        old_log_probs=-torch.rand(n, t, generator=gen) * 3,
        hidden=hidden,
        base_hidden=hidden + 0.2 * torch.randn(n, t, h, generator=gen),
    )


def _reduced(batch: RolloutBatch, **signals: torch.Tensor) -> RolloutBatch:
    """The batch as an engine hands it over: the reduced signal, no hidden state."""
    return RolloutBatch(batch.token_ids, batch.mask, batch.group_ids, batch.scores, **signals)


@pytest.mark.parametrize("params", [{}, {"sharpening": 2.0, "form": "sum"}])
def test_arca_from_adapter_residual_equals_arca_from_hidden_states(params) -> None:
    batch = full_batch()
    adv = advantages.grpo(batch.scores, batch.group_ids)
    alpha = residual_norm(batch.hidden, batch.base_hidden, batch.mask)
    want = credit.compute("arca", batch, adv, **params)
    got = credit.compute("arca", _reduced(batch, adapter_residual=alpha), adv, **params)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("params", [{}, {"lam_min": 0.5, "lam_max": 1.5, "refine_iters": 3}])
def test_delta_from_coefficients_equals_delta_from_hidden_states(params) -> None:
    batch = full_batch(1)
    adv = advantages.grpo(batch.scores, batch.group_ids)
    coef = delta_coefficients(batch, adv, **params)
    want = credit.compute("delta", batch, adv, **params)
    got = credit.compute("delta", _reduced(batch, delta_coefficients=coef), adv, **params)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not torch.allclose(want, adv[:, None] * batch.mask)  # not uniform credit


def test_without_either_input_the_error_names_the_hidden_states() -> None:
    batch = full_batch()
    bare = RolloutBatch(batch.token_ids, batch.mask, batch.group_ids, batch.scores)
    adv = advantages.grpo(batch.scores, batch.group_ids)
    for name, missing in (("arca", "base_hidden, hidden"), ("delta", "hidden, old_log_probs")):
        with pytest.raises(ValueError, match=missing):
            credit.compute(name, bare, adv)


@pytest.mark.parametrize("name", REDUCED_SIGNALS)
def test_the_signals_pass_refuses_a_reduced_signal(name: str) -> None:
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError, match="where they live"):
        compute_signals(
            model, torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 3), 1, torch.ones(1, 2), [name]
        )

"""The per-batch headroom index is not a bound on the expected headroom (docs/findings.md#why-no-bias-to-fix-only-noise).

Two credits' batch gradients g1 = s1 + n, g2 = s2 + rho n + sqrt(1 - rho^2) m whose expected directions are
60 degrees apart (cos(s1, s2) = 0.5: expected headroom 0.5), with noise 9x the signal's squared norm: the
per-batch index 1 - cos(g1, g2) follows the noise correlation rho, while the probe's cross-batch estimate
(`expected.cross_batch_cosine`) recovers the expected headroom whatever rho is."""

import math

import pytest
import torch

from tokencredit.probe.expected import cross_batch_cosine


def _batches(rho: float, n_batches: int = 400, dim: int = 2000, noise: float = 3.0, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    s1 = torch.randn(dim, generator=gen, dtype=torch.float64)
    s1 /= s1.norm()
    u = torch.randn(dim, generator=gen, dtype=torch.float64)
    u -= (u @ s1) * s1
    u /= u.norm()
    s2 = 0.5 * s1 + math.sqrt(0.75) * u
    n = torch.randn(n_batches, dim, generator=gen, dtype=torch.float64) * noise / math.sqrt(dim)
    m = torch.randn(n_batches, dim, generator=gen, dtype=torch.float64) * noise / math.sqrt(dim)
    return s1 + n, s2 + rho * n + math.sqrt(1 - rho**2) * m


@pytest.mark.parametrize(("rho", "index"), [(0.9, 0.14), (0.5, 0.50), (0.0, 0.95)])
def test_per_batch_index_follows_the_noise_correlation_not_the_expected_headroom(rho, index):
    g1, g2 = _batches(rho)
    per_batch = 1 - torch.nn.functional.cosine_similarity(g1, g2, dim=1).mean().item()
    assert per_batch == pytest.approx(index, abs=0.03)
    expected = cross_batch_cosine((g1 @ g1.T).tolist(), (g2 @ g2.T).tolist(), (g1 @ g2.T).tolist())
    assert expected is not None
    assert 1 - expected == pytest.approx(0.5, abs=0.06)

"""The value model reads V_t at the right column: the state before response token t (docs/spec/ppo.md).

Part of the diagnosis of the toy critic's low explained variance (docs/experiments/critic.md): a value read one
column late would see y_t (and fit better than it should), one column early would miss y_{t-1}; left padding or
train / eval mode must not change V."""

from __future__ import annotations

import torch

from conftest import tiny_qwen3
from tokencredit.critic import ValueModel

P, T = 5, 6


def _model() -> ValueModel:
    vm = ValueModel(tiny_qwen3(32))
    torch.manual_seed(1)
    torch.nn.init.normal_(vm.head.weight)  # a non-zero head, so V varies with the hidden state
    return vm.eval()


def _inputs(pad: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(3, 32, (2, P + T), generator=g)
    seq = torch.cat([torch.zeros(2, pad, dtype=torch.long), seq], 1)
    attn = torch.cat([torch.zeros(2, pad, dtype=torch.long), torch.ones(2, P + T, dtype=torch.long)], 1)
    return seq, attn, torch.ones(2, T, dtype=torch.bool)


def test_v_t_sees_the_tokens_before_y_t_and_not_y_t():
    vm = _model()
    seq, attn, mask = _inputs()
    v = vm(seq, attn, P, mask).detach()
    for t in range(T):
        changed = seq.clone()
        changed[:, P + t] = (changed[:, P + t] - 3 + 1) % 29 + 3  # another token at y_t
        diff = (vm(changed, attn, P, mask).detach() - v).abs().amax(0)
        assert diff[: t + 1].max() == 0, t  # V_0..V_t are states before y_t
        if t + 1 < T:
            assert diff[t + 1] > 1e-6, t  # V_{t+1} is the state after it
    last_prompt = seq.clone()
    last_prompt[:, P - 1] = (last_prompt[:, P - 1] - 3 + 1) % 29 + 3
    v0 = vm(last_prompt, attn, P, mask).detach()[:, 0]
    assert (v0 - v[:, 0]).abs().min() > 1e-6  # V_0 reads the last prompt token


def test_left_padding_and_train_mode_leave_v_unchanged():
    vm = _model()
    seq, attn, mask = _inputs()
    v = vm(seq, attn, P, mask).detach()
    seq_p, attn_p, _ = _inputs(pad=3)
    torch.testing.assert_close(vm(seq_p, attn_p, P + 3, mask).detach(), v, rtol=0, atol=1e-5)
    vm.train()  # the critic trains in train mode and predicts V_old in eval mode: without dropout they agree
    torch.testing.assert_close(vm(seq, attn, P, mask).detach(), v, rtol=0, atol=0)

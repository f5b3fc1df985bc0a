"""The tail mask (tokencredit.credit.tail): exact credit, zero, on a task's reward-irrelevant tail."""

from __future__ import annotations

import pytest
import torch

from tokencredit import objectives
from tokencredit.batch import BatchValidationError, RolloutBatch
from tokencredit.credit.tail import tail_metrics, zero_tail
from tokencredit.data.synthetic import ArithmeticTask, label_chars
from tokencredit.data.token_labels import tail_token_mask
from tokencredit.errors import ConfigError
from tokencredit.models import build_toy_tokenizer
from tokencredit.recipes import resolve, token_credit


def _batch(tail: bool = True) -> RolloutBatch:
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0]])
    tail_mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0], [0, 1, 1, 1, 0, 0]])
    return RolloutBatch(
        token_ids=torch.arange(24).reshape(4, 6),
        mask=mask.bool(),
        group_ids=torch.tensor([0, 0, 1, 1]),
        scores=torch.tensor([1.0, 0.0, 0.0, 1.0]),
        old_log_probs=-torch.rand(4, 6),
        entropy=torch.rand(4, 6),
        tail_mask=tail_mask.bool() if tail else None,
    )


def test_zero_tail_hand_vectors() -> None:
    adv = torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.5, 0.0]])
    tail = torch.tensor([[False, True, True], [True, False, False]])
    out = zero_tail(adv, tail)
    torch.testing.assert_close(out, torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.5, 0.0]]))
    assert out.dtype == adv.dtype and adv[0, 1] == -2.0  # a new tensor, the input untouched
    with pytest.raises(ValueError, match="tail_mask has shape"):
        zero_tail(adv, tail[:, :2])


def test_grpo_with_the_tail_mask_is_zero_exactly_on_the_tail_and_grpo_elsewhere() -> None:
    batch = _batch()
    grpo = token_credit(resolve("grpo"), batch)
    masked = token_credit(resolve("grpo", {"zero_tail": True}), batch)
    tail = batch.tail_mask
    assert tail is not None and bool(tail.any())
    assert (masked.token_advantages[tail] == 0).all()
    assert (grpo.token_advantages[tail] != 0).any()  # the tail had credit to remove
    assert torch.equal(masked.token_advantages[~tail], grpo.token_advantages[~tail])
    # the same loss tokens: the tail still counts in the token-mean's denominator
    assert torch.equal(masked.loss_mask, grpo.loss_mask) and torch.equal(masked.mask, grpo.mask)
    assert int(masked.loss_mask.sum()) == int(batch.mask.sum())


def test_the_loss_gradient_on_the_tail_is_exactly_zero_and_unchanged_elsewhere() -> None:
    batch = _batch()
    grads = {}
    for name, over in (("grpo", {}), ("mask", {"zero_tail": True})):
        tc = token_credit(resolve("grpo", over), batch)
        old = batch.old_log_probs
        assert old is not None
        logp = (
            old + 0.05 * torch.randn(old.shape, generator=torch.Generator().manual_seed(1))
        ).requires_grad_()
        loss, _ = objectives.policy_loss(logp, old, tc.token_advantages, tc.loss_mask, tc.objective)
        loss.backward()
        assert logp.grad is not None
        grads[name] = logp.grad
    tail = batch.tail_mask
    assert tail is not None
    assert (grads["mask"][tail] == 0).all() and (grads["grpo"][tail] != 0).any()
    # same denominator: every other token's gradient is GRPO's, value for value
    torch.testing.assert_close(grads["mask"][~tail], grads["grpo"][~tail], rtol=0, atol=0)


def test_zero_tail_needs_a_tail_mask_and_a_per_token_objective() -> None:
    with pytest.raises(ConfigError, match="no tail mask"):
        token_credit(resolve("grpo", {"zero_tail": True}), _batch(tail=False))
    with pytest.raises(ConfigError, match="zero_tail must be true or false"):
        resolve("grpo", {"zero_tail": "yes"})
    with pytest.raises(ConfigError, match="per-token objective"):
        resolve("gspo", {"zero_tail": True})
    assert resolve("grpo").zero_tail is False  # off unless asked for


def test_the_batch_checks_the_tail_mask() -> None:
    b = _batch()
    with pytest.raises(BatchValidationError, match="tail_mask: expected shape"):
        RolloutBatch(b.token_ids, b.mask, b.group_ids, b.scores, tail_mask=torch.ones(4, 5, dtype=torch.bool))
    # never on a padding token
    full = RolloutBatch(b.token_ids, b.mask, b.group_ids, b.scores, tail_mask=torch.ones(4, 6))
    assert full.tail_mask is not None and torch.equal(full.tail_mask, b.mask)
    assert torch.equal(b.select(torch.tensor([1, 3])).tail_mask, b.tail_mask[[1, 3]])  # type: ignore[index]


def test_tail_token_mask_from_the_task_labels() -> None:
    tok = build_toy_tokenizer()
    task = ArithmeticTask(tail=5)
    p = task.sample(1)[0]
    texts = [p.solution, p.solution.split("\n")[0], p.solution + "\n7"]
    rows = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
    width = max(map(len, rows)) + 2
    ids = torch.full((3, width), tok.pad_token_id)
    mask = torch.zeros(3, width, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = True
    tail = tail_token_mask(tok, ids, mask, [p, p, p], label_chars)
    n_sol = len(p.solution)
    # row 0: the line break and the 5 letters, the last characters before EOS
    assert tail[0].nonzero().flatten().tolist() == list(range(n_sol - 6, n_sol))
    assert not tail[1].any()  # no answer line, no tail
    assert tail[2, : n_sol + 1].tolist() == tail[0, : n_sol + 1].tolist() and not tail[2, n_sol:].any()
    with pytest.raises(ValueError, match="2 problems for 3 rollouts"):
        tail_token_mask(tok, ids, mask, [p, p], label_chars)


class _PairTokenizer:
    """Two characters per token (a stand-in for a multi-character tokenizer)."""

    def __init__(self, text: str):
        self.pieces = [text[i : i + 2] for i in range(0, len(text), 2)]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.pieces[i] for i in ids)

    def batch_decode(self, rows: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(r) for r in rows]


def test_a_token_that_straddles_the_tail_is_not_masked() -> None:
    task = ArithmeticTask(tail=4)
    p = task.sample(1)[0]
    text = p.solution  # "...}.\ncccc": the line break is at an odd or even offset
    tok = _PairTokenizer(text)
    n = len(tok.pieces)
    tail = tail_token_mask(tok, torch.arange(n)[None], torch.ones(1, n, dtype=torch.bool), [p], label_chars)
    start = text.index("\n" + "c" * 4)
    want = [i for i in range(n) if 2 * i >= start]
    assert tail[0].nonzero().flatten().tolist() == want


def test_tail_metrics() -> None:
    b = _batch()
    assert b.tail_mask is not None and b.entropy is not None
    m = tail_metrics(b.tail_mask, b.entropy, b.mask)
    assert m["tail/tokens"] == pytest.approx(9 / 4)
    assert m["tail/entropy"] == pytest.approx(float(b.entropy[b.tail_mask].double().mean()))
    none = tail_metrics(torch.zeros_like(b.mask), b.entropy, b.mask)
    assert none == {"tail/tokens": 0.0}
    assert "tail/entropy" not in tail_metrics(b.tail_mask, None, b.mask)

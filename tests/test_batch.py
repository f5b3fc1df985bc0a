import pytest
import torch

from tokencredit.batch import BatchValidationError, RolloutBatch


def make(**kw):
    base = dict(
        token_ids=torch.tensor([[1, 2, 3], [4, 0, 0]]),
        mask=torch.tensor([[1, 1, 1], [1, 0, 0]]),
        group_ids=torch.tensor([0, 0]),
        scores=torch.tensor([1.0, 0.0]),
    )
    base.update(kw)
    return RolloutBatch(**base)


def test_valid_batch_converts_dtypes():
    b = make(token_ids=torch.tensor([[1, 2, 3], [4, 0, 0]], dtype=torch.int32), scores=torch.tensor([1, 0]))
    assert (
        b.mask.dtype == torch.bool and b.token_ids.dtype == torch.int64 and b.scores.dtype.is_floating_point
    )
    assert b.lengths.tolist() == [3, 1] and b.correct().tolist() == [True, False]
    assert b.num_rollouts == 2 and b.max_len == 3


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("mask", torch.ones(2, 4), r"RolloutBatch.mask: expected shape \(2, 3\), got shape \(2, 4\)"),
        ("group_ids", torch.zeros(3, dtype=torch.long), r"group_ids: expected shape \(2,\)"),
        ("group_ids", torch.zeros(2), "group_ids: expected an integer dtype"),
        ("token_ids", torch.zeros(2, 3), "token_ids: expected an integer dtype"),
        ("token_ids", torch.zeros(6, dtype=torch.long), r"token_ids: expected shape \[N, T\]"),
        ("scores", torch.zeros(2, 1), r"scores: expected shape \(2,\)"),
        ("old_log_probs", torch.zeros(2, 2), r"old_log_probs: expected shape \(2, 3\)"),
        ("hidden", torch.zeros(2, 3), r"hidden: expected shape \(2, 3, H\)"),
        ("entropy", torch.zeros(2, 3, dtype=torch.long), "entropy: expected a floating dtype"),
        ("mask", torch.tensor([[2, 1, 1], [1, 0, 0]]), "mask: values must be 0/1"),
    ],
)
def test_validation_names_field_and_shapes(field, value, match):
    with pytest.raises(BatchValidationError, match=match):
        make(**{field: value})


def test_nonfinite_score_names_rollout():
    with pytest.raises(BatchValidationError, match="rollout 1"):
        make(scores=torch.tensor([0.0, float("nan")]))


def test_nonfinite_signal_on_valid_token_names_position_but_padding_is_ignored():
    lp = torch.tensor([[0.0, -1.0, -2.0], [-1.0, float("nan"), float("nan")]])
    make(old_log_probs=lp)  # NaN only on padding: fine
    lp[0, 2] = float("inf")
    with pytest.raises(BatchValidationError, match="rollout 0, token 2"):
        make(old_log_probs=lp)


def test_require_and_select():
    b = make(entropy=torch.rand(2, 3))
    b.require(["entropy"], "x")
    with pytest.raises(BatchValidationError, match="hidden"):
        b.require(["hidden"], "credit method 'delta'")
    s = b.select(torch.tensor([1]))
    assert s.num_rollouts == 1 and s.entropy.shape == (1, 3)
    assert b.available_signals() == {"entropy"}


def test_signal_returns_the_tensor_or_names_the_reader_and_the_signal():
    entropy = torch.rand(2, 3)
    b = make(entropy=entropy)
    assert b.signal("entropy", "credit method 'x'") is b.entropy
    with pytest.raises(
        BatchValidationError, match=r"credit method 'delta' needs the per-token signal\(s\) hidden"
    ):
        b.signal("hidden", "credit method 'delta'")
    with pytest.raises(BatchValidationError, match="unknown per-token signal 'entropyy'"):
        b.signal("entropyy", "credit method 'x'")

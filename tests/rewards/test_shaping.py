import pytest
import torch

from tokencredit.rewards import format_reward, overlong_penalty


def test_overlong_penalty_values():
    # max_len 10, buffer 4: free up to 6, linear to -1 at 10, -1 beyond.
    out = overlong_penalty(torch.tensor([0, 6, 7, 8, 10, 11, 20]), max_len=10, cache_len=4)
    assert out.dtype == torch.float32
    assert out.tolist() == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0]
    assert overlong_penalty([3, 4], max_len=4, cache_len=4).tolist() == [-0.75, -1.0]


def test_overlong_penalty_errors():
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty([1], max_len=4, cache_len=5)
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty([1], max_len=4, cache_len=0)
    with pytest.raises(ValueError, match="rollout 1 has -2"):
        overlong_penalty([1, -2], max_len=4, cache_len=2)
    with pytest.raises(ValueError, match="integer"):
        overlong_penalty(torch.tensor([1.5]), max_len=4, cache_len=2)
    with pytest.raises(ValueError, match="1-D"):
        overlong_penalty(torch.ones(2, 2, dtype=torch.long), max_len=4, cache_len=2)


def test_format_reward():
    comps = [
        "so \\boxed{3}",
        "so \\boxed{3",
        "3",
        "reasoning </think> <answer>3</answer>",
        "<think>a</think><answer>3</answer> more",
    ]
    assert format_reward(comps, "boxed") == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert format_reward(comps, "think-answer") == [0.0, 0.0, 0.0, 1.0, 0.0]
    assert format_reward(["<think>x</think>\n<answer> 4 </answer>\n"], "think-answer") == [1.0]
    with pytest.raises(ValueError, match="format style"):
        format_reward(["x"], "xml")

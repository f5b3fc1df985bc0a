"""The embedded toy model's task as a verl dataset and reward function (CPU dry runs and CI).

`write_parquet` writes toy arithmetic problems (`tokencredit.models.toy_task`, the task the toy model
was warm-started on) as verl RL parquet files, prompted exactly as the toy model was trained: the
"qwen-math" system prompt and the problem as chat messages, which verl renders with the model's chat
template. `compute_score` is the reward verl calls per response
(``reward.custom_reward_function.path=<this file>``, ``name=compute_score``): 1.0 iff the last
``\\boxed{}`` holds the gold integer (`tokencredit.data.synthetic.extract_answer`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokencredit.data.synthetic import extract_answer
from tokencredit.data.templates import QWEN_MATH_SYSTEM
from tokencredit.models import toy_task

__all__ = ["DATA_SOURCE", "compute_score", "rows", "write_parquet"]

DATA_SOURCE = "tokencredit/toy_arithmetic"


def rows(n: int, split: str = "train", seed: int = 0) -> list[dict[str, Any]]:
    """`n` verl dataset rows of the toy task (prompt messages, gold answer in reward_model.ground_truth)."""
    out = []
    for i, p in enumerate(toy_task(seed=seed).sample(n, split=split)):
        answer = str(p.answer[0] if isinstance(p.answer, list) else p.answer)
        out.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [
                    {"role": "system", "content": QWEN_MATH_SYSTEM},
                    {"role": "user", "content": p.problem},
                ],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": i},
            }
        )
    return out


def write_parquet(out_dir: str | Path, n_train: int = 64, n_val: int = 8, seed: int = 0) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` (held-out problems) to `out_dir`; returns their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "train.parquet", out / "val.parquet"
    pq.write_table(pa.Table.from_pylist(rows(n_train, "train", seed)), paths[0])
    pq.write_table(pa.Table.from_pylist(rows(n_val, "heldout", seed)), paths[1])
    return paths


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **_: Any
) -> float:
    """verl custom reward: 1.0 iff the last ``\\boxed{}`` of the response is the gold integer."""
    got = extract_answer(solution_str)
    return float(got is not None and got == int(ground_truth))

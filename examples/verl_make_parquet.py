"""Write tokencredit's shipped GSM8K / MATH-500 problems as verl RL parquet files (no download).

    python examples/verl_make_parquet.py --out ~/data/tokencredit
    # -> gsm8k_train.parquet (8792 problems), math500.parquet (500 problems)

verl's RL dataset reads one row per prompt: `prompt` (chat messages; verl applies the model's chat
template), `data_source`, `ability`, `reward_model` {style, ground_truth} and `extra_info`. The
messages follow tokencredit's "qwen-math" template (system prompt asking for a \\boxed{} answer).
All acceptable gold answers go to extra_info["answers"], which examples/verl_math_reward.py reads.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tokencredit.data.math_benchmarks import NAMES, load
from tokencredit.data.templates import QWEN_MATH_SYSTEM


def rows(name: str, limit: int | None = None) -> list[dict]:
    out = []
    for i, p in enumerate(load(name, limit=limit)):
        answers = [p.answer] if isinstance(p.answer, str) else list(p.answer)
        out.append(
            {
                "data_source": f"tokencredit/{name}",
                "prompt": [
                    {"role": "system", "content": QWEN_MATH_SYSTEM},
                    {"role": "user", "content": p.problem},
                ],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answers[0]},
                "extra_info": {"split": name, "index": i, "id": p.id, "answers": answers},
            }
        )
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="~/data/tokencredit", help="output folder")
    ap.add_argument("--benchmarks", nargs="+", default=["gsm8k_train", "math500"], choices=NAMES)
    ap.add_argument("--limit", type=int, default=None, help="first N problems of each benchmark")
    args = ap.parse_args(argv)
    out = Path(args.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    for name in args.benchmarks:
        table = pa.Table.from_pylist(rows(name, args.limit))
        pq.write_table(table, out / f"{name}.parquet")
        print(f"{out / f'{name}.parquet'}: {table.num_rows} rows")


if __name__ == "__main__":
    main()

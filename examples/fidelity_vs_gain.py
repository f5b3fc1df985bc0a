"""Do gains follow credit fidelity? The rank correlation between each recipe's credit fidelity on a warm
start (`tokencredit probe --oracle K` JSON) and its gain over GRPO (`tokencredit compare` JSON).

    python examples/fidelity_vs_gain.py runs/shootout/compare.json probe_warm.json

A recipe is scored by the probe column of its credit: DAPO and GSPO by uniform credit (the probe's
`grpo` / `gspo` columns), the KTAE recipes by `ktae`, the others by their own name. Several compare
JSONs (e.g. a shoot-out and a separate run of the Monte-Carlo recipes) can be merged with
`tokencredit compare --collect DIR1/runs DIR2/runs --out DIR` first.
"""

from __future__ import annotations

import json
import sys

from scipy.stats import spearmanr

COLUMN = {
    "grpo": "grpo",
    "dapo": "grpo",
    "gspo": "gspo",
    "grpo+ktae": "ktae",
    "dapo+ktae": "ktae",
    "delta": "delta",
    "ptrace": "ptrace",
    "strace": "strace",
    "entropy-80-20": "entropy-80-20",
    "gcpo": "gcpo",
    "vineppo": "vineppo",
    "grpo-lambda": "grpo-lambda",
    "entropy-advantage": "entropy-advantage",
    "advantage-reweighting": "advantage-reweighting",
}
# Not scored: `oracle`, whose credit is A* itself (its fidelity would be A*'s agreement with an independent
# estimate of A*, which the probe does not compute), and recipes without a probe column.


def main(compare_json: str, probe_json: str) -> None:
    recipes = json.load(open(compare_json))["recipes"]
    fidelity = json.load(open(probe_json))["points"][0]["oracle"]["methods"]
    rows = []
    for r in recipes:
        col = COLUMN.get(r["label"])
        if col in fidelity:
            f = fidelity[col]
            rows.append(
                (
                    r["label"],
                    f["spearman"] or 0.0,
                    f["oracle_blame@1"],
                    r["final_accuracy"]["mean"],
                    r["accuracy_auc"]["mean"],
                )
            )
    base = next(x for x in rows if x[0] == "grpo")
    print(
        "| recipe | warm-start ρ pooled | warm-start blame@1 vs A* | final acc. | Δ final | acc. AUC | Δ AUC |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, rho, b1, final, auc in rows:
        print(
            f"| {name} | {rho:.3f} | {100 * b1:.1f}% | {final:.3f} | {final - base[3]:+.3f} | {auc:.3f} | {auc - base[4]:+.3f} |"
        )
    for i, what in ((1, "ρ pooled"), (2, "blame@1 vs A*")):
        for j, gain in ((3, "final accuracy"), (4, "accuracy AUC")):
            res = spearmanr([x[i] for x in rows], [x[j] for x in rows])
            print(
                f"Spearman({what}, {gain}) over {len(rows)} recipes: {res.statistic:+.2f} (p = {res.pvalue:.2f})"
            )


if __name__ == "__main__":
    main(*sys.argv[1:3])

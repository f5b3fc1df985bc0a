"""Recipes: one choice of group baseline, credit method and objective, with hyperparameters.

Recipes are data (the `RECIPES` table), not code paths: the trainer and the plugins read a
`Recipe` and call the registered pieces it names. `tokencredit recipes` prints the table.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tokencredit.errors import ConfigError, closest


@dataclass(frozen=True)
class Recipe:
    name: str
    paper: str
    advantage: str = "grpo"  # tokencredit.advantages.ESTIMATORS
    advantage_params: dict[str, Any] = field(default_factory=dict)
    credit: str = "uniform"  # tokencredit.credit.CREDIT_METHODS
    credit_params: dict[str, Any] = field(default_factory=dict)
    kernel: str = "token"  # "reinforce" or tokencredit.objectives.KERNELS
    kernel_params: dict[str, Any] = field(default_factory=dict)
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None
    loss_agg_mode: str = "token-mean"
    norm_constant: float | None = None  # seq-mean-token-sum-norm; None = max_new_tokens
    kl_coef: float = 0.0
    kl_type: str = "k3"
    dynamic_sampling: bool = False  # DAPO: drop groups whose rewards are all equal, resample
    overlong_buffer: int = 0  # DAPO overlong shaping buffer L_cache in tokens (0 = off)
    mask_truncated: bool = False  # DAPO: truncated completions get no loss
    notes: str = ""

    def with_overrides(self, **changes: Any) -> Recipe:
        unknown = [k for k in changes if k not in self.__dataclass_fields__]
        if unknown:
            raise ConfigError(
                f"recipe has no field {unknown[0]!r}{closest(unknown[0], self.__dataclass_fields__)}"
            )
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_DAPO = dict(
    eps_low=0.2, eps_high=0.28, dual_clip=10.0, loss_agg_mode="token-mean",
    dynamic_sampling=True, overlong_buffer=16, mask_truncated=False,
)  # fmt: skip
_SALIENCE = dict(
    advantage_params={"eps": 1e-8}, kernel="reinforce", loss_agg_mode="seq-mean-token-mean",
)  # fmt: skip

_TABLE: list[Recipe] = [
    Recipe("grpo", "Shao et al. 2024, DeepSeekMath (arXiv 2402.03300)", loss_agg_mode="seq-mean-token-mean",
           notes="z-score group baseline, PPO-clip 0.2, per-response mean; KL off (set kl_coef=0.04 for the paper's)"),
    Recipe("dr-grpo", "Liu et al. 2025, Dr.GRPO (arXiv 2503.20783)", advantage="dr-grpo",
           loss_agg_mode="seq-mean-token-sum-norm", notes="mean-only baseline, token sum / max length"),
    Recipe("rloo", "Ahmadian et al. 2024, RLOO (arXiv 2402.14740)", advantage="rloo",
           notes="leave-one-out baseline, PPO-clip 0.2, token-mean"),
    Recipe("dapo", "Yu et al. 2025, DAPO (arXiv 2503.14476)", **_DAPO,
           notes="clip-higher 0.2/0.28, dual clip 10, token-mean, dynamic sampling, overlong shaping"),
    Recipe("gspo", "Zheng et al. 2025, GSPO (arXiv 2507.18071)", kernel="gspo", eps_low=3e-4, eps_high=4e-4,
           loss_agg_mode="seq-mean-token-mean", notes="sequence ratio exp(mean log-ratio), clip 3e-4/4e-4"),
    Recipe("entropy-80-20", "Wang et al. 2025, 80/20 rule (arXiv 2506.01939)", credit="entropy-80-20",
           credit_params={"keep_ratio": 0.2, "scope": "batch"}, **_DAPO,
           notes="DAPO loss on the top-20% entropy tokens only; normaliser = all valid tokens"),
    Recipe("grpo+ktae", "Sun et al. 2025, KTAE, NeurIPS (arXiv 2505.16826)", credit="ktae", kl_coef=0.001,
           notes="Â = A + key-token value k(id); clip 0.2, KL 0.001, token-mean"),
    Recipe("dapo+ktae", "Sun et al. 2025, KTAE, NeurIPS (arXiv 2505.16826)", credit="ktae", **_DAPO,
           notes="DAPO with KTAE's additive key-token values"),
    Recipe("delta", "Zhang, Wu, Lin 2026, DelTA (arXiv 2605.21467)", credit="delta",
           credit_params={"lam_min": 0.8, "lam_max": 1.2, "refine_iters": 1},
           eps_low=0.2, eps_high=0.28, dual_clip=10.0,
           notes="Â = A * centroid-discriminator coefficients (mean 1); DAPO clip, no dynamic sampling"),
    Recipe("ptrace", "Mou et al. 2026, P-trace (arXiv 2605.05965); kernel is a reconstruction", kernel="ptrace",
           kernel_params={"lam": 0.95}, eps_low=0.2, eps_high=0.28,
           notes="normalised eligibility-trace importance weights (reconstruction from the abstract)"),
    Recipe("strace", "Mou et al. 2026, S-trace (arXiv 2605.05965); kernel is a reconstruction", kernel="strace",
           kernel_params={"lam": 0.95, "keep_ratio": 0.2, "scope": "batch", "decay": "kept"},
           eps_low=0.2, eps_high=0.28,
           notes="P-trace over the top-20% entropy tokens only (reconstruction from the abstract)"),
    Recipe("arca", "Lafuente-Mercado 2026, ARCA (arXiv 2606.00257)", credit="arca",
           credit_params={"sharpening": 1.0}, **_SALIENCE,
           notes="LoRA only: weights from the adapter's hidden-state residual; REINFORCE (the paper's runs: sharpening 2)"),
    Recipe("surprisal", "salience baseline in ARCA (arXiv 2606.00257)", credit="surprisal",
           credit_params={"sharpening": 1.0}, **_SALIENCE, notes="weights proportional to -log pi(y_t); REINFORCE"),
    Recipe("entropy-reduction", "salience baseline in ARCA (arXiv 2606.00257)", credit="entropy-reduction",
           credit_params={"sharpening": 1.0}, **_SALIENCE, notes="weights from entropy drops H_t - H_t+1; REINFORCE"),
    Recipe("policy-divergence", "salience baseline in ARCA (arXiv 2606.00257)", credit="policy-divergence",
           credit_params={"sharpening": 1.0}, **_SALIENCE,
           notes="LoRA only: weights |log pi - log pi_base|; REINFORCE"),
    Recipe("gcpo", "Li et al. 2026, GCPO (arXiv 2605.29198)", credit="gcpo", eps_low=0.2, eps_high=0.28,
           notes="rank-power token weights from a negative-prompt forward; Â = A * w"),
]

RECIPES: dict[str, Recipe] = {r.name: r for r in _TABLE}


def get_recipe(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise ConfigError(f"unknown recipe {name!r}{closest(name, RECIPES)}; known: {', '.join(RECIPES)}") from None


def recipe_needs(recipe: Recipe) -> frozenset[str]:
    """The per-token signals the recipe's credit method and ratio kernel need."""
    from tokencredit import credit, objectives

    needs = set(credit.get(recipe.credit).needs)
    if recipe.kernel != "reinforce":
        needs |= objectives.get_kernel(recipe.kernel).needs
    if recipe.kl_coef:
        needs.add("ref_log_probs")
    if recipe.kernel != "reinforce":
        needs.add("old_log_probs")
    return frozenset(needs)


def requires_lora(recipe: Recipe) -> bool:
    from tokencredit import credit

    return credit.get(recipe.credit).requires_lora


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verbose", "-v", action="store_true", help="also show every hyperparameter")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="tokencredit recipes", show_lines=False)
    for col in ("recipe", "advantage", "credit", "objective", "paper"):
        table.add_column(col, overflow="fold", no_wrap=col in ("recipe", "credit"))
    for r in RECIPES.values():
        obj = f"{r.kernel}, clip {r.eps_low:g}/{r.eps_high:g}, {r.loss_agg_mode}" if r.kernel != "reinforce" else (
            f"REINFORCE, {r.loss_agg_mode}"
        )
        if r.kl_coef:
            obj += f", KL {r.kl_coef:g}"
        table.add_row(r.name, r.advantage, r.credit, obj, r.paper)
        if args.verbose:
            table.add_row("", "", "", str({k: v for k, v in r.to_dict().items() if k not in ("name", "paper")}), "")
    Console().print(table)
    return 0


def kernel_arguments(recipe: Recipe, batch: Any) -> dict[str, Any]:
    """Keyword arguments for `objectives.policy_loss` from the recipe's kernel_params and the batch.

    `keep_ratio` / `scope` (S-trace) become the kept-token mask `keep`, computed once per step from
    the old policy's entropy (detached), as the 80/20 rule does.
    """
    from tokencredit.credit.entropy import top_entropy_mask

    params = dict(recipe.kernel_params)
    if "keep_ratio" in params:
        batch.require(("entropy",), f"ratio kernel {recipe.kernel!r}")
        params["keep"] = top_entropy_mask(batch.entropy, batch.mask, params.pop("keep_ratio"), params.pop("scope", "batch"))
    return params

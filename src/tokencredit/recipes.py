"""Recipes, and the one credit pipeline every engine uses.

A recipe names one choice of group baseline, credit method, loss and ratio kernel, with their
hyperparameters. Recipes are data (the `RECIPES` table), not code paths.

`token_credit(recipe, batch, special_ids=...)` is the one path from a recipe and a `RolloutBatch`
(with its per-token signals) to everything the objective needs: A [N], Â [N,T], the tokens that
carry a loss term (S-trace's kept set, DAPO's truncated rows) and the keyword arguments of
`tokencredit.objectives.policy_loss`. The trainer, `explain`, `probe`, `compare` (through the
trainer), the TRL plugin and the verl plugin all call it, so a recipe gives the same Â everywhere
(tests/test_engines_agree.py).

Names: `resolve(name)` is the one rule for reading a user's name, used by every engine:
``recipe:NAME`` is the recipe NAME and ``credit:NAME`` the credit method NAME on its own; a plain
NAME is the recipe when the table has one of that name (recipes win: ``surprisal`` is the
recipe, REINFORCE included), otherwise the credit method. A credit method on its own
(``kind="method"``) is the default objective (PPO-clip 0.2, per-token ratio, token-mean) over the
GRPO baseline, which an engine replaces with its own group normalisation
(`Recipe.with_method_baseline`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from tokencredit import advantages, credit, objectives
from tokencredit.batch import RolloutBatch
from tokencredit.errors import ConfigError, closest

# The clip range lives at the top of a recipe (as in verl's actor config); a loss that takes
# these parameters receives them from there.
CLIP_FIELDS = ("eps_low", "eps_high", "dual_clip")


@dataclass(frozen=True)
class Recipe:
    name: str
    paper: str
    advantage: str = "grpo"  # tokencredit.advantages.ESTIMATORS
    advantage_params: dict[str, Any] = field(default_factory=dict)
    credit: str = "uniform"  # tokencredit.credit.CREDIT_METHODS
    credit_params: dict[str, Any] = field(default_factory=dict)
    loss: str = "ppo-clip"  # tokencredit.objectives.LOSSES
    loss_params: dict[str, Any] = field(default_factory=dict)  # the loss's own, besides the clip range
    kernel: str = "token"  # tokencredit.objectives.KERNELS (read only by losses that use a ratio)
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
    kind: str = "recipe"  # "recipe": a row of the table; "method": a credit method on its own

    def with_overrides(self, **changes: Any) -> Recipe:
        """A copy with fields replaced; dict fields are merged key by key (e.g. kernel_params={"lam": 0.9})."""
        unknown = [k for k in changes if k not in self.__dataclass_fields__]
        if unknown:
            raise ConfigError(
                f"recipe has no field {unknown[0]!r}{closest(unknown[0], self.__dataclass_fields__)}"
            )
        merged = {
            k: {**getattr(self, k), **v} if isinstance(v, Mapping) and isinstance(getattr(self, k), dict) else v
            for k, v in changes.items()
        }
        return replace(self, **merged)

    def with_method_baseline(self, advantage: str, advantage_params: Mapping[str, Any] | None = None) -> Recipe:
        """For a credit method on its own, the engine's group baseline; a table recipe keeps its own."""
        if self.kind != "method":
            return self
        return replace(self, advantage=advantage, advantage_params=dict(advantage_params or {}))

    def loss_arguments(self) -> dict[str, Any]:
        """The loss's hyperparameters: the clip range fields it takes, then loss_params."""
        takes = objectives.get_loss(self.loss).defaults
        return {**{k: getattr(self, k) for k in CLIP_FIELDS if k in takes}, **self.loss_params}

    @property
    def uses_ratio(self) -> bool:
        return objectives.get_loss(self.loss).uses_ratio

    @property
    def per_token(self) -> bool:
        """True when the objective's on-policy gradient weight of each token is its Â (see objectives.effective)."""
        return objectives.is_per_token(self.loss, self.kernel)

    def objective_label(self) -> str:
        """One line for tables: the loss, the kernel and clip when it uses a ratio, the aggregation, KL."""
        takes_clip = "eps_low" in objectives.get_loss(self.loss).defaults
        clip = f"clip {self.eps_low:g}/{self.eps_high:g}"
        if self.loss == "ppo-clip":
            text = f"{self.kernel}, {clip}, {self.loss_agg_mode}"
        elif self.loss == "reinforce":
            text = f"REINFORCE, {self.loss_agg_mode}"
        elif self.uses_ratio:
            text = f"{self.loss} ({self.kernel} ratio{', ' + clip if takes_clip else ''}), {self.loss_agg_mode}"
        else:
            text = f"{self.loss}, {self.loss_agg_mode}"
        return text + (f", KL {self.kl_coef:g}" if self.kl_coef else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_DAPO = dict(
    eps_low=0.2, eps_high=0.28, dual_clip=10.0, loss_agg_mode="token-mean",
    dynamic_sampling=True, overlong_buffer=16, mask_truncated=False,
)  # fmt: skip
_SALIENCE = dict(
    advantage_params={"eps": 1e-8}, loss="reinforce", loss_agg_mode="seq-mean-token-mean",
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
    # -- the policy losses of verl 0.9.1's registry (tokencredit.objectives.losses_verl) and TRL's VESPO;
    #    each takes Â from any credit method (e.g. recipe cispo with credit_params / credit overrides)
    Recipe("cispo", "MiniMax 2025, MiniMax-M1 CISPO (arXiv 2506.13585)", loss="cispo", eps_low=1.0, eps_high=0.2,
           notes="-sg(clip(w, 0, 1.2)) Â log pi: no lower bound, eps_high 0.2 (verl's example: clip_ratio_low 10)"),
    Recipe("sapo", "Gao et al. 2025, SAPO (arXiv 2511.20347)", loss="sapo", loss_agg_mode="seq-mean-token-mean",
           notes="smooth gate (4/tau) sigmoid(tau (w - 1)) in place of the clip, tau 1.0 / 1.05; verl's seq-mean-token-mean"),
    Recipe("clip-cov", "Cui et al. 2025, Clip-Cov (arXiv 2505.22617)", loss="clip-cov",
           notes="PPO-clip 0.2 minus a random 2e-4 share of tokens with Â-log pi covariance in (1, 5) (verl's defaults)"),
    Recipe("kl-cov", "Cui et al. 2025, KL-Cov (arXiv 2505.22617)", loss="kl-cov",
           notes="-Â w, plus 0.1 |log ratio| on the top 2e-4 tokens by Â-log pi covariance (verl's defaults)"),
    Recipe("gmpo", "Zhao et al. 2025, GMPO (arXiv 2507.20673)", loss="gmpo", eps_low=0.4, eps_high=0.4,
           loss_agg_mode="seq-mean-token-mean",
           notes="geometric mean of the token ratios, clipped to e^(-0.4)..e^0.4 in log space (verl's example)"),
    Recipe("gpg", "Chu et al. 2025, GPG (arXiv 2504.02546)", advantage="gpg", loss="gpg",
           notes="REINFORCE loss -Â log pi with A = (N / M)(r - mean_g); no ratio, no KL (verl's example)"),
    Recipe("dppo-kl", "DPPO-Binary-KL, Rethinking the Trust Region in LLM RL (arXiv 2602.04879)", advantage="dr-grpo",
           loss="dppo-kl", eps_low=0.05, eps_high=0.05, loss_agg_mode="seq-mean-token-sum-norm",
           notes="binary-KL trust region 0.05 per token, truncated IS at 20; Dr.GRPO baseline and norm (verl's example)"),
    Recipe("dppo-tv", "DPPO-Binary-TV, Rethinking the Trust Region in LLM RL (arXiv 2602.04879)", advantage="dr-grpo",
           loss="dppo-tv", eps_low=0.15, eps_high=0.15, loss_agg_mode="seq-mean-token-sum-norm",
           notes="|pi - pi_old| trust region 0.15 per token, truncated IS at 20; Dr.GRPO baseline and norm (verl's example)"),
    Recipe("vespo", "VESPO (arXiv 2602.10693); TRL's loss_type='vespo'", loss="vespo",
           notes="-phi(w_seq) Â log pi with TRL's Gamma weights (k, lambda) = (2, 3) / (3, 2); token-mean as TRL"),
    # -- the advantage estimators of verl 0.9.1's registry (tokencredit.estimators)
    Recipe("reinforce++", "Hu et al. 2025, REINFORCE++ (arXiv 2501.03262)", advantage="reinforce++",
           notes="token-level discounted return (gamma 1) whitened over the batch's tokens; PPO-clip 0.2, token-mean"),
    Recipe("remax", "Li et al. 2024, ReMax (arXiv 2310.10505)", advantage="remax",
           notes="A = r - reward of a greedy rollout of the prompt (the engine supplies baseline_scores)"),
    Recipe("opo", "Hao et al. 2025, OPO (arXiv 2505.23585)", advantage="opo",
           notes="length-weighted group mean baseline; PPO-clip 0.2, token-mean"),
    Recipe("grpo-passk", "Pass@k training (arXiv 2503.19595), verl's grpo_passk", advantage="grpo-passk",
           notes="only each group's best response learns: (r_max - r_second) / (std + eps)"),
    Recipe("otb", "Li et al. 2026, The Optimal Token Baseline (PMLR 306); verl's optimal_token_baseline",
           advantage="otb",
           notes="per-token group baseline weighted by the cumulative path variance (1 - 2 pi + sum pi^2)"),
    # -- GRPO(lambda), the baseline S-trace compares against, and two per-token advantage shapings
    Recipe("grpo-lambda", "Parthasarathi et al. 2025, GRPO(λ) (arXiv 2510.00194)", kernel="grpo-lambda",
           kernel_params={"gamma": 1.0, "lam": 0.95, "trace": "recent"},
           notes="trace tr(t, j) = (gamma lam)^(t - j) ('recent') or max with (gamma lam)^j ('both') inside the ratio"),
    Recipe("entropy-advantage", "Cheng et al. 2025, Reasoning with Exploration (arXiv 2506.14758)",
           credit="entropy-advantage", credit_params={"alpha": 0.4, "kappa": 2.0}, eps_low=0.2, eps_high=0.28,
           notes="Â = A + min(alpha H, |A| / kappa), H detached; clip-higher (alpha, kappa our choice: see credit/shaping.py)"),
    Recipe("advantage-reweighting", "Yang et al. 2025, Advantage Reweighting, NeurIPS (arXiv 2505.12929)",
           credit="advantage-reweighting", credit_params={"alpha": 0.3}, eps_low=0.2, eps_high=0.24, kl_coef=0.001,
           notes="Â = (alpha pi_old + 1 - alpha) A, alpha 0.3; clip 0.2/0.24 and KL 0.001 as the authors' script"),
]


RECIPES: dict[str, Recipe] = {r.name: r for r in _TABLE}


def get_recipe(name: str) -> Recipe:
    """The table's recipe `name` (no credit-method fallback; see `resolve` for the name rule)."""
    try:
        return RECIPES[name]
    except KeyError:
        raise ConfigError(f"unknown recipe {name!r}{closest(name, RECIPES)}; known: {', '.join(RECIPES)}") from None


def known_names() -> list[str]:
    """Every plain name `resolve` accepts: the recipes, then the credit methods that are not also recipes."""
    return list(RECIPES) + [m for m in credit.CREDIT_METHODS if m not in RECIPES]


def method_recipe(name: str) -> Recipe:
    """A credit method on its own: the default objective over the GRPO baseline (kind "method")."""
    m = credit.get(name)
    return Recipe(name=name, paper=m.paper, credit=name, kind="method", notes=m.description)


def _lookup(name: str) -> Recipe:
    kind, sep, bare = name.partition(":")
    if sep:
        if kind == "recipe":
            return get_recipe(bare)
        if kind == "credit":
            return method_recipe(bare)
        raise ConfigError(f"unknown prefix {kind!r} in {name!r}; use recipe:NAME or credit:NAME")
    if name in RECIPES:
        return RECIPES[name]
    if name in credit.CREDIT_METHODS:
        return method_recipe(name)
    methods = [m for m in credit.CREDIT_METHODS if m not in RECIPES]
    raise ConfigError(
        f"unknown recipe or credit method {name!r}{closest(name, known_names())}; recipes: {', '.join(RECIPES)}; "
        f"credit methods on their own: {', '.join(methods)}"
    )


def resolve(name: str | Recipe, overrides: Mapping[str, Any] | None = None) -> Recipe:
    """The validated recipe for a name (the rule in the module docstring) or a Recipe, with `overrides`.

    Overrides replace fields; dict fields (credit_params, kernel_params, ...) are merged key by
    key. Every name and parameter is checked here, before any model is loaded: an unknown field,
    estimator, credit method, loss, kernel or parameter is a ConfigError naming the closest valid one.
    """
    recipe = name if isinstance(name, Recipe) else _lookup(name)
    changes = dict(overrides or {})
    if changes:
        recipe = recipe.with_overrides(**changes)
    validate(recipe, overridden=changes)
    return recipe


def validate(recipe: Recipe, overridden: Iterable[str] = ()) -> None:
    """ConfigError for anything in `recipe` that no registered piece would read, or reads wrongly."""
    where = f"recipe {recipe.name!r}"
    if recipe.kind not in ("recipe", "method"):
        raise ConfigError(f"{where}: kind must be 'recipe' or 'method', got {recipe.kind!r}")
    advantages.ESTIMATORS.check_params(recipe.advantage, recipe.advantage_params)
    credit.CREDIT_METHODS.check_params(recipe.credit, recipe.credit_params)
    if advantages.get_estimator(recipe.advantage).token_level and not credit.get(recipe.credit).token_advantages:
        takes = [m for m, c in credit.CREDIT_METHODS.items() if c.token_advantages]
        raise ConfigError(
            f"{where}: advantage estimator {recipe.advantage!r} gives a token-level A [N,T], which credit method "
            f"{recipe.credit!r} (defined on a sequence advantage A [N]) does not take; use one of: {', '.join(takes)}"
        )
    loss = objectives.get_loss(recipe.loss)
    objectives.LOSSES.check_params(recipe.loss, recipe.loss_params)
    clip_in_params = sorted(set(recipe.loss_params) & set(CLIP_FIELDS))
    if clip_in_params:
        raise ConfigError(f"{where}: set {clip_in_params[0]} as a recipe field (algo.{clip_in_params[0]}), not in loss_params")
    unread = [k for k in CLIP_FIELDS if k in overridden and k not in loss.defaults]
    if unread:
        raise ConfigError(f"{where}: policy loss {recipe.loss!r} has no clip range; {unread[0]} would never be read")
    if loss.uses_ratio:
        objectives.kernel_parameters(recipe.kernel, recipe.kernel_params)
    elif recipe.kernel != "token" or recipe.kernel_params:
        raise ConfigError(
            f"{where}: policy loss {recipe.loss!r} uses no importance ratio, so ratio kernel {recipe.kernel!r} "
            f"{dict(recipe.kernel_params) or ''} would never be read; use a loss with a ratio (e.g. ppo-clip)"
        )
    if recipe.loss_agg_mode not in objectives.AGG_MODES:
        raise ConfigError(
            f"{where}: unknown loss_agg_mode {recipe.loss_agg_mode!r}{closest(recipe.loss_agg_mode, objectives.AGG_MODES)}"
        )
    if recipe.kl_type not in ("k1", "k2", "k3"):
        raise ConfigError(f"{where}: kl_type must be 'k1', 'k2' or 'k3', got {recipe.kl_type!r}")
    checks = [
        (recipe.eps_low >= 0 and recipe.eps_high >= 0, "eps_low and eps_high must be >= 0"),
        (recipe.dual_clip is None or recipe.dual_clip > 1, "dual_clip must be > 1 or none"),
        (recipe.kl_coef >= 0, "kl_coef must be >= 0"),
        (recipe.overlong_buffer >= 0, "overlong_buffer must be >= 0"),
        (recipe.norm_constant is None or recipe.norm_constant > 0, "norm_constant must be > 0 or none"),
    ]
    for ok, rule in checks:
        if not ok:
            raise ConfigError(f"{where}: {rule}")


def credit_needs(recipe: Recipe) -> frozenset[str]:
    """Signals needed for A, Â and the kept set (all before the update): the estimator's (OTB), the credit
    method's and the ratio kernel's preparation's."""
    needs = set(credit.get(recipe.credit).needs) | advantages.get_estimator(recipe.advantage).needs
    if recipe.uses_ratio:
        needs |= objectives.get_kernel(recipe.kernel).needs
    return frozenset(needs)


def recipe_needs(recipe: Recipe) -> frozenset[str]:
    """Signals the whole objective needs: `credit_needs`, old log-probs for a ratio, reference log-probs for KL."""
    needs = set(credit_needs(recipe))
    if recipe.uses_ratio:
        needs.add("old_log_probs")
    if recipe.kl_coef:
        needs.add("ref_log_probs")
    return frozenset(needs)


def requires_lora(recipe: Recipe) -> bool:
    return credit.get(recipe.credit).requires_lora


def batch_fields(recipe: Recipe) -> frozenset[str]:
    """RolloutBatch fields besides the signals that the engine must fill for this recipe (ReMax:
    {"baseline_scores"}, the reward of one greedy rollout per prompt; see tokencredit.advantages.FIELDS)."""
    return advantages.get_estimator(recipe.advantage).fields


# ---------------------------------------------------------------------------------------------- the pipeline
@dataclass(frozen=True)
class TokenCredit:
    """What the objective needs for one batch under one recipe (all tensors detached).

    seq_advantages A [N] float32 (for a token-level estimator, each row's mean of A over its valid tokens);
    token_advantages Â [N,T] float32, 0 off `batch.mask`;
    mask bool [N,T]: valid tokens of the rows that train (DAPO's mask_truncated drops whole rows);
    loss_mask bool [N,T]: the tokens that carry a loss term (within S-trace's kept set);
    keep bool [N,T] or None: the kept set of a kept-set kernel; policy_args: the keyword
    arguments of `objectives.policy_loss` (loss, kernel and their parameters, aggregation, KL).
    """

    recipe: Recipe
    seq_advantages: Tensor
    token_advantages: Tensor
    mask: Tensor
    loss_mask: Tensor
    keep: Tensor | None
    policy_args: dict[str, Any]

    def policy_kwargs(self, rows: Tensor | slice | None = None) -> dict[str, Any]:
        """`policy_args` with its per-row tensors (the kept set) cut to `rows` (a micro-batch)."""
        if rows is None:
            return dict(self.policy_args)
        return {k: v[rows] if isinstance(v, Tensor) else v for k, v in self.policy_args.items()}

    def effective(self, loss_agg_mode: str = "token-mean") -> Tensor:
        """Â_eff [N,T]: the objective's on-policy gradient weight per token (`objectives.effective_credit`);
        equal to Â for per-token objectives under token-mean. `loss_agg_mode` defaults to token-mean
        (pass recipe.loss_agg_mode to include the recipe's row weighting)."""
        if self.recipe.per_token and loss_agg_mode == "token-mean":
            # what effective_credit's autograd gives for these objectives, without the backward pass
            return zero_outside(self.token_advantages, self.loss_mask)
        args = self.policy_kwargs()
        loss, kernel = args.pop("loss"), args.pop("kernel")
        for key in ("loss_agg_mode", "kl_coef", "kl_type"):
            args.pop(key, None)
        norm = args.pop("norm_constant", None)
        loss_keys = objectives.get_loss(loss).defaults
        return objectives.effective_credit(
            self.token_advantages,
            self.mask,
            loss=loss,
            loss_params={k: v for k, v in args.items() if k in loss_keys},
            kernel=kernel,
            kernel_args={k: v for k, v in args.items() if k not in loss_keys},
            loss_agg_mode=loss_agg_mode,
            norm_constant=norm,
        )


def credit_arguments(recipe: Recipe, special_ids: Iterable[int] | None) -> dict[str, Any]:
    """The credit method's parameters, with the tokenizer's special ids as `ignore_token_ids` when the
    method takes that parameter and the recipe does not set it (KTAE: EOS / pad get no key value)."""
    params = dict(recipe.credit_params)
    takes = credit.get(recipe.credit).defaults
    if special_ids is not None and "ignore_token_ids" in takes and "ignore_token_ids" not in params:
        params["ignore_token_ids"] = tuple(sorted({int(i) for i in special_ids}))
    return params


def token_credit(
    recipe: Recipe | str,
    batch: RolloutBatch,
    *,
    overrides: Mapping[str, Any] | None = None,
    special_ids: Iterable[int] | None = None,
    max_response_length: int | None = None,
) -> TokenCredit:
    """The one credit pipeline: recipe + batch (+ the tokenizer's special ids) -> `TokenCredit`.

    1. A = the recipe's estimator on the batch: A [N], or A [N,T] for a token-level one
       (REINFORCE++, OTB; only credit methods that take token advantages accept it) (advantages.estimate)
    2. Â = its credit method on the batch and A                               (credit.compute)
    3. the ratio kernel's arguments, prepared from the batch (S-trace: the kept set from the
       old policy's entropy)                                                   (objectives.prepare_kernel)
    4. the loss tokens: valid tokens, minus truncated rows when the recipe masks them, within the kept set.

    `recipe` is a Recipe or a name (`resolve` applies, with `overrides`). `special_ids`: the
    tokenizer's special token ids (KTAE gives them no key value). `max_response_length`: the
    normaliser of seq-mean-token-sum-norm when the recipe leaves norm_constant unset.
    """
    if isinstance(recipe, str) or overrides:
        recipe = resolve(recipe, overrides)
    adv = advantages.estimate(recipe.advantage, batch, **recipe.advantage_params)
    tok_adv = credit.compute(recipe.credit, batch, adv, **credit_arguments(recipe, special_ids))
    if adv.dim() == 2:
        m = batch.mask.to(adv.dtype)
        seq_adv = (adv * m).sum(-1) / m.sum(-1).clamp(min=1)
    else:
        seq_adv = adv
    mask = batch.mask
    if recipe.mask_truncated and batch.truncated is not None:
        mask = mask & ~batch.truncated[:, None]
    args: dict[str, Any] = {"loss": recipe.loss, "kernel": recipe.kernel, **recipe.loss_arguments()}
    keep = None
    if recipe.uses_ratio:
        kernel_args = objectives.prepare_kernel(recipe.kernel, batch, recipe.kernel_params)
        args.update(kernel_args)
        if objectives.get_kernel(recipe.kernel).uses_keep:
            keep = kernel_args["keep"]
    args.update(
        loss_agg_mode=recipe.loss_agg_mode,
        norm_constant=recipe.norm_constant or max_response_length,
        kl_coef=recipe.kl_coef,
        kl_type=recipe.kl_type,
    )
    loss_mask = objectives.loss_token_mask(mask, keep)
    return TokenCredit(recipe, seq_adv.detach().float(), tok_adv, mask, loss_mask, keep, args)


def zero_outside(values: Tensor, keep: Tensor | None) -> Tensor:
    """`values` with 0 outside the kept set (or unchanged without one)."""
    if keep is None:
        return values
    return torch.where(keep, values, torch.zeros((), dtype=values.dtype, device=values.device))


def from_dict(data: Mapping[str, Any], where: str = "recipe") -> Recipe:
    """A Recipe from its `to_dict()` form (a run's recipe.json), validated.

    Files written before policy losses were registered name REINFORCE as kernel "reinforce";
    that reads as loss "reinforce" with the per-token kernel. An unknown key is a ConfigError
    naming it and `where`.
    """
    d = dict(data)
    if d.get("kernel") == "reinforce":
        d.update(kernel="token", loss="reinforce")
    unknown = [k for k in d if k not in Recipe.__dataclass_fields__]
    if unknown:
        raise ConfigError(
            f"{where}: unknown recipe field {unknown[0]!r}{closest(unknown[0], Recipe.__dataclass_fields__)} "
            "(written by a newer tokencredit?)"
        )
    try:
        recipe = Recipe(**d)
    except TypeError as e:
        raise ConfigError(f"{where}: not a recipe ({e})") from None
    validate(recipe)
    return recipe

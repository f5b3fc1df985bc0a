"""The recipe table: every named recipe with its paper, as data (`tokencredit recipes -v` prints it)."""

from __future__ import annotations

from dataclasses import replace

from tokencredit import credit
from tokencredit.errors import ConfigError, closest
from tokencredit.recipes.recipe import Recipe

__all__ = ["RECIPES", "get_recipe", "known_names", "method_recipe"]

# Rows that share another row's objective are that row with a few fields replaced (`dataclasses.replace`,
# which the type checker reads against Recipe's fields, as it reads a Recipe(...) call): each row is a
# typed Recipe, never a splat of an untyped dict.
# DAPO's objective: clip-higher 0.2/0.28, dual clip 10, token-mean, dynamic sampling, overlong shaping.
_DAPO = Recipe(
    "dapo",
    "Yu et al. 2025, DAPO (arXiv 2503.14476)",
    eps_low=0.2,
    eps_high=0.28,
    dual_clip=10.0,
    loss_agg_mode="token-mean",
    dynamic_sampling=True,
    overlong_buffer=16,
    mask_truncated=False,
    notes="clip-higher 0.2/0.28, dual clip 10, token-mean, dynamic sampling, overlong shaping",
)
# ARCA's objective (REINFORCE, per-response mean), shared by the salience baselines it is compared with.
_ARCA = Recipe(
    "arca",
    "Lafuente-Mercado 2026, ARCA (arXiv 2606.00257)",
    advantage_params={"eps": 1e-8},
    credit="arca",
    credit_params={"sharpening": 1.0},
    loss="reinforce",
    loss_agg_mode="seq-mean-token-mean",
    notes="LoRA only: weights from the adapter's hidden-state residual; REINFORCE (the paper's runs: sharpening 2)",
)

_TABLE: list[Recipe] = [
    Recipe(
        "grpo",
        "Shao et al. 2024, DeepSeekMath (arXiv 2402.03300)",
        loss_agg_mode="seq-mean-token-mean",
        notes="z-score group baseline, PPO-clip 0.2, per-response mean; KL off (set kl_coef=0.04 for the paper's)",
    ),
    Recipe(
        "dr-grpo",
        "Liu et al. 2025, Dr.GRPO (arXiv 2503.20783)",
        advantage="dr-grpo",
        loss_agg_mode="seq-mean-token-sum-norm",
        notes="mean-only baseline, token sum / max length",
    ),
    Recipe(
        "rloo",
        "Ahmadian et al. 2024, RLOO (arXiv 2402.14740)",
        advantage="rloo",
        notes="leave-one-out baseline, PPO-clip 0.2, token-mean",
    ),
    _DAPO,
    Recipe(
        "gspo",
        "Zheng et al. 2025, GSPO (arXiv 2507.18071)",
        kernel="gspo",
        eps_low=3e-4,
        eps_high=4e-4,
        loss_agg_mode="seq-mean-token-mean",
        notes="sequence ratio exp(mean log-ratio), clip 3e-4/4e-4",
    ),
    replace(
        _DAPO,
        name="entropy-80-20",
        paper="Wang et al. 2025, 80/20 rule (arXiv 2506.01939)",
        credit="entropy-80-20",
        credit_params={"keep_ratio": 0.2, "scope": "batch"},
        notes="DAPO loss on the top-20% entropy tokens only; normaliser = all valid tokens",
    ),
    Recipe(
        "grpo+ktae",
        "Sun et al. 2025, KTAE, NeurIPS (arXiv 2505.16826)",
        credit="ktae",
        kl_coef=0.001,
        notes="Â = A + key-token value k(id); clip 0.2, KL 0.001, token-mean",
    ),
    replace(
        _DAPO,
        name="dapo+ktae",
        paper="Sun et al. 2025, KTAE, NeurIPS (arXiv 2505.16826)",
        credit="ktae",
        notes="DAPO with KTAE's additive key-token values",
    ),
    Recipe(
        "delta",
        "Zhang, Wu, Lin 2026, DelTA (arXiv 2605.21467)",
        credit="delta",
        credit_params={"lam_min": 0.8, "lam_max": 1.2, "refine_iters": 1},
        eps_low=0.2,
        eps_high=0.28,
        dual_clip=10.0,
        notes="Â = A * centroid-discriminator coefficients (mean 1); DAPO clip, no dynamic sampling",
    ),
    Recipe(
        "ptrace",
        "Mou et al. 2026, P-trace (arXiv 2605.05965); kernel is a reconstruction",
        kernel="ptrace",
        kernel_params={"lam": 0.95},
        eps_low=0.2,
        eps_high=0.28,
        notes="normalised eligibility-trace importance weights (reconstruction from the abstract)",
    ),
    Recipe(
        "strace",
        "Mou et al. 2026, S-trace (arXiv 2605.05965); kernel is a reconstruction",
        kernel="strace",
        kernel_params={"lam": 0.95, "keep_ratio": 0.2, "scope": "batch", "decay": "kept"},
        eps_low=0.2,
        eps_high=0.28,
        notes="P-trace over the top-20% entropy tokens only (reconstruction from the abstract)",
    ),
    _ARCA,
    replace(
        _ARCA,
        name="surprisal",
        paper="salience baseline in ARCA (arXiv 2606.00257)",
        credit="surprisal",
        credit_params={"sharpening": 1.0},
        notes="weights proportional to -log pi(y_t); REINFORCE",
    ),
    replace(
        _ARCA,
        name="entropy-reduction",
        paper="salience baseline in ARCA (arXiv 2606.00257)",
        credit="entropy-reduction",
        credit_params={"sharpening": 1.0},
        notes="weights from entropy drops H_t - H_t+1; REINFORCE",
    ),
    replace(
        _ARCA,
        name="policy-divergence",
        paper="salience baseline in ARCA (arXiv 2606.00257)",
        credit="policy-divergence",
        credit_params={"sharpening": 1.0},
        notes="LoRA only: weights |log pi - log pi_base|; REINFORCE",
    ),
    Recipe(
        "gcpo",
        "Li et al. 2026, GCPO (arXiv 2605.29198)",
        credit="gcpo",
        eps_low=0.2,
        eps_high=0.28,
        notes="rank-power token weights from a negative-prompt forward; Â = A * w",
    ),
    # -- the policy losses of verl 0.9.1's registry (tokencredit.objectives.losses_verl) and TRL's VESPO;
    #    each takes Â from any credit method (e.g. recipe cispo with credit_params / credit overrides)
    Recipe(
        "cispo",
        "MiniMax 2025, MiniMax-M1 CISPO (arXiv 2506.13585)",
        loss="cispo",
        eps_low=1.0,
        eps_high=0.2,
        notes="-sg(clip(w, 0, 1.2)) Â log pi: no lower bound, eps_high 0.2 (verl's example: clip_ratio_low 10)",
    ),
    Recipe(
        "sapo",
        "Gao et al. 2025, SAPO (arXiv 2511.20347)",
        loss="sapo",
        loss_agg_mode="seq-mean-token-mean",
        notes="smooth gate (4/tau) sigmoid(tau (w - 1)) in place of the clip, tau 1.0 / 1.05; verl's seq-mean-token-mean",
    ),
    Recipe(
        "clip-cov",
        "Cui et al. 2025, Clip-Cov (arXiv 2505.22617)",
        loss="clip-cov",
        notes="PPO-clip 0.2 minus a random 2e-4 share of tokens with Â-log pi covariance in (1, 5) (verl's defaults)",
    ),
    Recipe(
        "kl-cov",
        "Cui et al. 2025, KL-Cov (arXiv 2505.22617)",
        loss="kl-cov",
        notes="-Â w, plus 0.1 |log ratio| on the top 2e-4 tokens by Â-log pi covariance (verl's defaults)",
    ),
    Recipe(
        "gmpo",
        "Zhao et al. 2025, GMPO (arXiv 2507.20673)",
        loss="gmpo",
        eps_low=0.4,
        eps_high=0.4,
        loss_agg_mode="seq-mean-token-mean",
        notes="geometric mean of the token ratios, clipped to e^(-0.4)..e^0.4 in log space (verl's example)",
    ),
    Recipe(
        "gpg",
        "Chu et al. 2025, GPG (arXiv 2504.02546)",
        advantage="gpg",
        loss="gpg",
        notes="REINFORCE loss -Â log pi with A = (N / M)(r - mean_g); no ratio, no KL (verl's example)",
    ),
    Recipe(
        "dppo-kl",
        "DPPO-Binary-KL, Rethinking the Trust Region in LLM RL (arXiv 2602.04879)",
        advantage="dr-grpo",
        loss="dppo-kl",
        eps_low=0.05,
        eps_high=0.05,
        loss_agg_mode="seq-mean-token-sum-norm",
        notes="binary-KL trust region 0.05 per token, truncated IS at 20; Dr.GRPO baseline and norm (verl's example)",
    ),
    Recipe(
        "dppo-tv",
        "DPPO-Binary-TV, Rethinking the Trust Region in LLM RL (arXiv 2602.04879)",
        advantage="dr-grpo",
        loss="dppo-tv",
        eps_low=0.15,
        eps_high=0.15,
        loss_agg_mode="seq-mean-token-sum-norm",
        notes="|pi - pi_old| trust region 0.15 per token, truncated IS at 20; Dr.GRPO baseline and norm (verl's example)",
    ),
    Recipe(
        "vespo",
        "VESPO (arXiv 2602.10693); TRL's loss_type='vespo'",
        loss="vespo",
        notes="-phi(w_seq) Â log pi with TRL's Gamma weights (k, lambda) = (2, 3) / (3, 2); token-mean as TRL",
    ),
    # -- the advantage estimators of verl 0.9.1's registry (tokencredit.advantages.estimators)
    Recipe(
        "reinforce++",
        "Hu et al. 2025, REINFORCE++ (arXiv 2501.03262)",
        advantage="reinforce++",
        notes="token-level discounted return (gamma 1) whitened over the batch's tokens; PPO-clip 0.2, token-mean",
    ),
    Recipe(
        "remax",
        "Li et al. 2024, ReMax (arXiv 2310.10505)",
        advantage="remax",
        notes="A = r - reward of a greedy rollout of the prompt (the engine supplies baseline_scores)",
    ),
    Recipe(
        "opo",
        "Hao et al. 2025, OPO (arXiv 2505.23585)",
        advantage="opo",
        notes="length-weighted group mean baseline; PPO-clip 0.2, token-mean",
    ),
    Recipe(
        "grpo-passk",
        "Pass@k training (arXiv 2503.19595), verl's grpo_passk",
        advantage="grpo-passk",
        notes="only each group's best response learns: (r_max - r_second) / (std + eps)",
    ),
    Recipe(
        "otb",
        "Li et al. 2026, The Optimal Token Baseline (PMLR 306); verl's optimal_token_baseline",
        advantage="otb",
        notes="per-token group baseline weighted by the cumulative path variance (1 - 2 pi + sum pi^2)",
    ),
    # -- GRPO(lambda), the baseline S-trace compares against, and two per-token advantage shapings
    Recipe(
        "grpo-lambda",
        "Parthasarathi et al. 2025, GRPO(λ) (arXiv 2510.00194)",
        kernel="grpo-lambda",
        kernel_params={"gamma": 1.0, "lam": 0.95, "trace": "recent"},
        notes="trace tr(t, j) = (gamma lam)^(t - j) ('recent') or max with (gamma lam)^j ('both') inside the ratio",
    ),
    Recipe(
        "entropy-advantage",
        "Cheng et al. 2025, Reasoning with Exploration (arXiv 2506.14758)",
        credit="entropy-advantage",
        credit_params={"alpha": 0.4, "kappa": 2.0},
        eps_low=0.2,
        eps_high=0.28,
        notes="Â = A + min(alpha H, |A| / kappa), H detached; clip-higher (alpha, kappa our choice: see credit/token_shaping.py)",
    ),
    Recipe(
        "advantage-reweighting",
        "Yang et al. 2025, Advantage Reweighting, NeurIPS (arXiv 2505.12929)",
        credit="advantage-reweighting",
        credit_params={"alpha": 0.3},
        eps_low=0.2,
        eps_high=0.24,
        kl_coef=0.001,
        notes="Â = (alpha pi_old + 1 - alpha) A, alpha 0.3; clip 0.2/0.24 and KL 0.001 as the authors' script",
    ),
    # -- entropy in a local frame (PEPO) and covariance-aware reweighting (CW-GRPO): docs/spec/pepo.md, cw-grpo.md
    Recipe(
        "pepo",
        "Kim & Kwak 2026, PEPO, NeurIPS (arXiv 2609.39402)",
        credit="pepo",
        credit_params={"window": 101, "temperature": 1.0, "positive_only": True},
        eps_low=0.2,
        eps_high=0.28,
        notes="Â = c A on positive rollouts, c = proximal entropy (softmax over a centred 101-token window) "
        "rescaled to mean 1; GRPO token-mean, clip 0.2/0.28 (Eq. 8)",
    ),
    replace(
        _DAPO,
        name="entropy-80-20-proximal",
        paper="Kim & Kwak 2026, PEPO's 80/20 + proximal entropy (arXiv 2609.39402, Table 3)",
        credit="entropy-80-20",
        credit_params={"keep_ratio": 0.2, "scope": "batch", "frame": "proximal", "window": 101},
        notes="the 80/20 rule ranking PEPO's proximal entropy instead of the raw entropy; otherwise entropy-80-20",
    ),
    Recipe(
        "strace-proximal",
        "S-trace (Mou et al. 2026, reconstruction) with PEPO's proximal entropy (Kim & Kwak 2026, Eq. 6) "
        "ranking its kept set; the combination is ours",
        kernel="strace",
        kernel_params={
            "lam": 0.95,
            "keep_ratio": 0.2,
            "scope": "batch",
            "decay": "kept",
            "frame": "proximal",
            "window": 101,
        },
        eps_low=0.2,
        eps_high=0.28,
        notes="strace with its top-20% kept set ranked by proximal entropy (local, not batch-wide); otherwise strace",
    ),
    Recipe(
        "cw-grpo",
        "Wang et al. 2026, CW-GRPO, ACL (arXiv 2605.11538); details reconstructed",
        credit="cw-grpo",
        notes="Â = w A, w = exp(-c^2 / 2 sigma^2) of the token's log pi-A covariance c, rescaled to keep the "
        "batch's total weight; PPO-clip 0.2, token-mean (KL off: set kl_coef for TRL's beta)",
    ),
    # -- credit from Monte-Carlo values of the policy's prefixes: EXPENSIVE (K continuations per state; the cost
    # is printed every step); K and delta in the config's [oracle] section
    Recipe(
        "oracle",
        "Monte-Carlo token advantages A* (tokencredit's own)",
        credit="oracle",
        loss_agg_mode="seq-mean-token-mean",
        notes="EXPENSIVE: Â = A*_t = V(s_t+1) - V(s_t), K continuations per uncertain token; grpo's objective",
    ),
    Recipe(
        "vineppo",
        "Kazemnejad et al. 2025, VinePPO, ICML (arXiv 2410.01679)",
        credit="vineppo",
        notes="EXPENSIVE: Monte-Carlo values at line breaks (K = 9 each), step advantage on its tokens; PPO-clip 0.2",
    ),
    # -- a learned critic (tokencredit.critic; docs/spec/ppo.md): the `gae` estimator reads the batch's `values`,
    # which is what makes the trainer build and train a value model ([critic] in the config)
    Recipe(
        "ppo",
        "Schulman et al. 2017, PPO (arXiv 1707.06347) with GAE (arXiv 1506.02438), as verl's defaults",
        advantage="gae",
        advantage_params={"gamma": 1.0, "lam": 1.0},
        notes="learned critic, GAE gamma 1 lam 1 whitened over the batch's tokens; PPO-clip 0.2, token-mean (verl's defaults)",
    ),
    Recipe(
        "bpco",
        "Qi, Zhou, Lee 2026, Best Practice Critic Optimization (arXiv 2608.23566), reconstructed from its abstract",
        advantage="gae",
        advantage_params={
            "whiten": False,
            "length_alpha": 0.05,
            "target": "monte-carlo",
            "value_min": 0.0,
            "value_max": 1.0,
        },
        loss="dppo-tv",
        eps_low=0.15,
        eps_high=0.15,
        notes="critic bounded to [0, 1] on Monte-Carlo targets; unwhitened GAE, VAPO's length-adaptive lam; DPPO-TV; "
        "run with rollout.group_size=1",
    ),
]


RECIPES: dict[str, Recipe] = {r.name: r for r in _TABLE}


def get_recipe(name: str) -> Recipe:
    """The table's recipe `name` (no credit-method fallback; see `resolve` for the name rule)."""
    try:
        return RECIPES[name]
    except KeyError:
        raise ConfigError(
            f"unknown recipe {name!r}{closest(name, RECIPES)}; known: {', '.join(RECIPES)}"
        ) from None


def known_names() -> list[str]:
    """Every plain name `resolve` accepts: the recipes, then the credit methods that are not also recipes."""
    return list(RECIPES) + [m for m in credit.CREDIT_METHODS if m not in RECIPES]


def method_recipe(name: str) -> Recipe:
    """A credit method on its own: the default objective over the GRPO baseline (kind "method")."""
    m = credit.get(name)
    return Recipe(name=name, paper=m.paper, credit=name, kind="method", notes=m.description)

"""Every loss and estimator against its reference: verl 0.9.1's registered function, TRL 1.16's own loss code.

Random batches in float64 with token-level Â (any credit method's output), masks with an empty row and
one-token rows; values and gradients (d loss / d log pi) agree to 1e-6 under every aggregation mode.
verl's functions are called through its registries (`get_policy_loss_fn`, `get_adv_estimator_fn`) with an
ActorConfig / AlgoConfig; TRL's through `GRPOTrainer._compute_loss` on a stub trainer whose forward returns
the test's log-probs, so TRL's own per-token loss and normalisation run. Where verl or TRL fixes an
aggregation that tokencredit leaves to the recipe, the test says how the two meet.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tokencredit import advantages, objectives
from tokencredit.batch import RolloutBatch

# needs tokencredit[verl] and [trl]: skipped without them, run by `pytest -m extras`
pytestmark = pytest.mark.extras
ca = pytest.importorskip(
    "verl.trainer.ppo.core_algos", reason="verl is not installed (extra tokencredit[verl])"
)
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.workers.config.actor import ActorConfig, PolicyLossConfig  # noqa: E402

TOL = 1e-6
LENGTHS = [7, 0, 1, 4, 7, 3, 1, 5, 6, 2, 7, 4]  # an empty row and one-token rows
N, T = len(LENGTHS), max(LENGTHS)
GROUPS = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 3, 3])  # sizes 3, 3, 2, 4
MODES = objectives.AGG_MODES


def mask_of(lengths=LENGTHS) -> torch.Tensor:
    return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]


def policy_batch(seed: int, spread: float = 0.3):
    """(log pi leaf with grad, log pi_old, Â [N,T], mask) in float64; probabilities stay below 1."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(N, T, generator=g, dtype=torch.float64) * 2 - 0.05
    new = (old + spread * torch.randn(N, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    adv = torch.randn(N, T, generator=g, dtype=torch.float64)
    return new.requires_grad_(True), old, adv, mask_of()


def value_and_grad(fn, log_prob):
    log_prob.grad = None
    value = fn()
    (grad,) = torch.autograd.grad(value, log_prob)
    return value.detach(), grad


def assert_close(got, want, what):
    diff = float((got - want).abs().max())
    assert diff <= TOL * max(1.0, float(want.abs().max())), f"{what}: max |diff| = {diff:.3g}"


def actor_config(eps_low=0.2, eps_high=0.2, clip_ratio_c=3.0, tau_pos=1.0, tau_neg=1.05, **policy_loss):
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=eps_low,
        clip_ratio_low=eps_low,
        clip_ratio_high=eps_high,
        clip_ratio_c=clip_ratio_c,
        tau_pos=tau_pos,
        tau_neg=tau_neg,
        policy_loss=PolicyLossConfig(**policy_loss),
    )


def ours(log_prob, old, adv, mask, loss, mode, kernel="token", **loss_params):
    args = objectives.ObjectiveArgs(loss=loss, loss_params=loss_params, kernel=kernel, loss_agg_mode=mode)
    return objectives.policy_loss(log_prob, old if args.uses_ratio else None, adv, mask, args)[0]


# verl loss name, tokencredit loss, kernel, tokencredit parameters, verl ActorConfig arguments
LOSS_CASES = [
    (
        "vanilla",
        "ppo-clip",
        "token",
        {"eps_low": 0.2, "eps_high": 0.28, "dual_clip": 3.0},
        {"eps_high": 0.28},
    ),
    (
        "vanilla",
        "ppo-clip",
        "token",
        {"eps_low": 0.1, "eps_high": 0.1},
        {"eps_low": 0.1, "eps_high": 0.1, "clip_ratio_c": 1e9},
    ),
    (
        "vanilla",
        "ppo-clip",
        "token",
        {"eps_low": 0.2, "eps_high": 0.2, "dual_clip": 1.2},
        {"clip_ratio_c": 1.2},
    ),
    ("gspo", "ppo-clip", "gspo-token", {"eps_low": 0.2, "eps_high": 0.28}, {"eps_high": 0.28}),
    (
        "gspo",
        "ppo-clip",
        "gspo-token",
        {"eps_low": 3e-4, "eps_high": 4e-4},
        {"eps_low": 3e-4, "eps_high": 4e-4},
    ),
    ("cispo", "cispo", "token", {"eps_low": 0.2, "eps_high": 0.28}, {"eps_high": 0.28}),
    ("cispo", "cispo", "token", {"eps_low": 10.0, "eps_high": 0.2}, {"eps_low": 10.0}),
    ("gpg", "gpg", "token", {}, {}),
    ("clip_cov", "clip-cov", "token", {}, {}),
    (
        "clip_cov",
        "clip-cov",
        "token",
        {"clip_cov_ratio": 0.3, "clip_cov_lb": 0.0, "clip_cov_ub": 5.0},
        {"clip_cov_ratio": 0.3, "clip_cov_lb": 0.0},
    ),
    ("kl_cov", "kl-cov", "token", {}, {}),
    (
        "kl_cov",
        "kl-cov",
        "token",
        {"kl_cov_ratio": 0.3, "ppo_kl_coef": 1.0},
        {"kl_cov_ratio": 0.3, "ppo_kl_coef": 1.0},
    ),
    (
        "dppo_tv",
        "dppo-tv",
        "token",
        {"eps_low": 0.15, "eps_high": 0.15, "clip_ratio_c": 20.0},
        {"eps_low": 0.15, "eps_high": 0.15, "clip_ratio_c": 20.0},
    ),
    (
        "dppo_tv",
        "dppo-tv",
        "token",
        {"eps_low": 0.05, "eps_high": 0.1, "clip_ratio_c": 1.2},
        {"eps_low": 0.05, "eps_high": 0.1, "clip_ratio_c": 1.2},
    ),
    (
        "dppo_kl",
        "dppo-kl",
        "token",
        {"eps_low": 0.05, "eps_high": 0.05, "clip_ratio_c": 20.0},
        {"eps_low": 0.05, "eps_high": 0.05, "clip_ratio_c": 20.0},
    ),
    (
        "dppo_kl",
        "dppo-kl",
        "token",
        {"eps_low": 0.01, "eps_high": 0.02, "clip_ratio_c": 1.2},
        {"eps_low": 0.01, "eps_high": 0.02, "clip_ratio_c": 1.2},
    ),
]


def _verl_config(kw):
    policy = {
        k: kw[k]
        for k in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef")
        if k in kw
    }
    other = {k: v for k, v in kw.items() if k not in policy}
    return actor_config(**other, **policy)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("verl_name", "loss", "kernel", "params", "cfg"), LOSS_CASES)
def test_loss_equals_verl(verl_name, loss, kernel, params, cfg, mode, seed):
    log_prob, old, adv, mask = policy_batch(seed)
    fn, config = ca.get_policy_loss_fn(verl_name), _verl_config(cfg)
    torch.manual_seed(
        100 + seed
    )  # Clip-Cov draws its tokens from torch's generator: the same draw on both sides
    want, want_grad = value_and_grad(lambda: fn(old, log_prob, adv, mask.double(), mode, config)[0], log_prob)
    torch.manual_seed(100 + seed)
    got, got_grad = value_and_grad(
        lambda: ours(log_prob, old, adv, mask, loss, mode, kernel, **params), log_prob
    )
    assert_close(got, want, f"{verl_name} value ({mode})")
    assert_close(got_grad, want_grad, f"{verl_name} gradient ({mode})")
    assert float(got_grad.abs().sum()) > 0


@pytest.mark.parametrize("mode", MODES)
def test_sapo_equals_verl(mode, monkeypatch):
    """verl's sapo hard-codes seq-mean-token-mean: it equals ours there for any mode verl is passed, and
    with verl's agg_loss forced to `mode` its per-token terms aggregate to ours under every mode."""
    log_prob, old, adv, mask = policy_batch(2, spread=1.0)
    params = {"tau_pos": 0.8, "tau_neg": 1.3}
    config = actor_config(**params)
    fn = ca.get_policy_loss_fn("sapo")
    fixed, fixed_grad = value_and_grad(
        lambda: fn(old, log_prob, adv, mask.double(), mode, config)[0], log_prob
    )
    got, got_grad = value_and_grad(
        lambda: ours(log_prob, old, adv, mask, "sapo", "seq-mean-token-mean", **params), log_prob
    )
    assert_close(got, fixed, "sapo value")
    assert_close(got_grad, fixed_grad, "sapo gradient")

    real = ca.agg_loss
    monkeypatch.setattr(
        ca, "agg_loss", lambda loss_mat, loss_mask, loss_agg_mode, **kw: real(loss_mat, loss_mask, mode, **kw)
    )
    want, want_grad = value_and_grad(lambda: fn(old, log_prob, adv, mask.double(), mode, config)[0], log_prob)
    got, got_grad = value_and_grad(lambda: ours(log_prob, old, adv, mask, "sapo", mode, **params), log_prob)
    assert_close(got, want, f"sapo value ({mode})")
    assert_close(got_grad, want_grad, f"sapo gradient ({mode})")


@pytest.mark.parametrize("eps", [0.4, 0.05])
@pytest.mark.parametrize("mode", MODES)
def test_gmpo_equals_verl_geo_mean(mode, eps):
    """verl's geo_mean ignores loss_agg_mode and averages its per-response losses over all N rows. Ours puts
    each response's loss on its tokens: seq-mean-token-mean with global_seqs=N is verl's value; under every
    mode ours aggregates the per-response losses verl gives for each row alone."""
    log_prob, old, adv, mask = policy_batch(3)
    config = actor_config(eps_low=eps, eps_high=eps)
    fn = ca.get_policy_loss_fn("geo_mean")
    m = mask.double()
    want, want_grad = value_and_grad(lambda: fn(old, log_prob, adv, m, mode, config)[0], log_prob)
    got, got_grad = value_and_grad(
        lambda: objectives.policy_loss(
            log_prob,
            old,
            adv,
            mask,
            objectives.ObjectiveArgs(
                "gmpo", {"eps_low": eps, "eps_high": eps}, loss_agg_mode="seq-mean-token-mean"
            ),
            global_seqs=N,
        )[0],
        log_prob,
    )
    assert_close(got, want, "gmpo value")
    assert_close(got_grad, want_grad, "gmpo gradient")

    def per_row_reference():
        rows = torch.stack(
            [
                fn(old[i : i + 1], log_prob[i : i + 1], adv[i : i + 1], m[i : i + 1], mode, config)[0]
                for i in range(N)
            ]
        )
        return objectives.aggregate(rows[:, None].expand(N, T), mask, mode)

    want, want_grad = value_and_grad(per_row_reference, log_prob)
    got, got_grad = value_and_grad(
        lambda: ours(log_prob, old, adv, mask, "gmpo", mode, eps_low=eps, eps_high=eps), log_prob
    )
    assert_close(got, want, f"gmpo value ({mode})")
    assert_close(got_grad, want_grad, f"gmpo gradient ({mode})")


# ---------------------------------------------------------------------------------------------- estimators
def estimator_batch(seed: int, with_singleton: bool = False):
    g = torch.Generator().manual_seed(seed)
    mask = mask_of()
    scores = torch.tensor([1.0, 0.0, 0.5, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.5, 0.0])
    scores = scores[torch.randperm(N, generator=g)]
    old = (-torch.rand(N, T, generator=g) * 3 - 0.01) * mask
    p = old.exp()
    sum_sq = (p * p + torch.rand(N, T, generator=g) * (1 - p * p)) * mask
    baseline = torch.randint(0, 2, (N,), generator=g).float()
    batch = RolloutBatch(
        torch.zeros(N, T, dtype=torch.long),
        mask,
        GROUPS,
        scores,
        old_log_probs=old,
        sum_sq_probs=sum_sq,
        baseline_scores=baseline,
    )
    last = (torch.tensor(LENGTHS) - 1).clamp(min=0)  # an empty row's reward sits on its (masked) first column
    rewards = torch.zeros(N, T, dtype=torch.float64).scatter(1, last[:, None], scores.double()[:, None])
    index = np.array([f"uid-{int(i)}" for i in GROUPS], dtype=object)
    return batch, rewards, index


# verl estimator, tokencredit estimator, tokencredit params, verl keyword arguments (config is an AlgoConfig)
ESTIMATOR_CASES = [
    ("grpo", "grpo", {}, {"norm_adv_by_std_in_grpo": True}),
    ("grpo", "dr-grpo", {}, {"norm_adv_by_std_in_grpo": False}),
    ("rloo", "rloo", {}, {}),
    ("reinforce_plus_plus", "reinforce++", {}, {"config": {"gamma": 1.0}}),
    ("reinforce_plus_plus", "reinforce++", {"gamma": 0.9}, {"config": {"gamma": 0.9}}),
    ("reinforce_plus_plus_baseline", "reinforce++-baseline", {}, {}),
    ("remax", "remax", {}, {"remax": True}),
    ("opo", "opo", {}, {}),
    ("gpg", "gpg", {}, {}),
    ("gpg", "gpg", {"f_norm": 2.0}, {"f_norm": 2.0}),
    ("grpo_passk", "grpo-passk", {}, {"config": {"norm_adv_by_std_in_grpo": True}}),
    (
        "grpo_passk",
        "grpo-passk",
        {"norm_adv_by_std_in_grpo": False},
        {"config": {"norm_adv_by_std_in_grpo": False}},
    ),
    ("optimal_token_baseline", "otb", {}, {"otb": True}),
    ("optimal_token_baseline", "otb", {"handle_zero_tail": False}, {"otb": True, "handle_zero_tail": False}),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("verl_name", "name", "params", "kw"), ESTIMATOR_CASES)
def test_estimator_equals_verl(verl_name, name, params, kw, seed):
    batch, rewards, index = estimator_batch(seed)
    mask = batch.mask.double()
    kw = dict(kw)
    args: dict = {"token_level_rewards": rewards, "response_mask": mask, "index": index}
    args["config"] = AlgoConfig(**kw.pop("config", {}))
    if kw.pop("remax", False):
        args["reward_baselines"] = batch.baseline_scores.double()
    if kw.pop("otb", False):
        args.update(old_log_probs=batch.old_log_probs.double(), sum_pi_squared=batch.sum_sq_probs.double())
    want, _ = ca.get_adv_estimator_fn(verl_name)(**args, **kw)
    got = advantages.estimate(name, batch, **params).double()
    if got.dim() == 1:
        got = got[:, None] * mask
    assert_close(got, want.double() * mask, f"{name} ({seed})")
    assert float(got.abs().sum()) > 0


def test_otb_zero_tail():
    """A strictly longest response keeps its return past the second-longest length with handle_zero_tail
    (its baseline there is 0); without it the baseline there is its own return, so A = 0."""
    batch, _, _ = estimator_batch(0)
    batch.scores = torch.ones(N)
    batch.scores[1] = 0.0  # group 0: lengths 7, 0, 1; the longest (row 0) is correct
    a = advantages.estimate("otb", batch)
    b = advantages.estimate("otb", batch, handle_zero_tail=False)
    torch.testing.assert_close(a[0, 1:], torch.ones(T - 1))
    torch.testing.assert_close(b[0, 1:], torch.zeros(T - 1), atol=1e-6, rtol=0)
    torch.testing.assert_close(a[0, 0], b[0, 0])


# ---------------------------------------------------------------------------------------------- TRL
trl_trainer = pytest.importorskip(
    "trl.trainer.grpo_trainer", reason="TRL is not installed (extra tokencredit[trl])"
)


def trl_loss(loss_type, log_prob, old, adv, mask, *, epsilon=0.2, epsilon_high=0.28, sequence=False, **args):
    """TRL's GRPOTrainer._compute_loss on a stub trainer: one process, no accumulation, beta 0."""
    config = SimpleNamespace(
        delta=None,
        sapo_temperature_pos=1.0,
        sapo_temperature_neg=1.05,
        vespo_k_pos=2.0,
        vespo_lambda_pos=3.0,
        vespo_k_neg=3.0,
        vespo_lambda_neg=2.0,
        steps_per_generation=1,
        use_bias_correction_kl=False,
    )
    for k, v in args.items():
        setattr(config, k, v)
    accelerator = SimpleNamespace(
        num_processes=1,
        gather=lambda x: x,
        gather_for_metrics=lambda x: x,
        reduce=lambda x, reduction="sum": x,
    )
    stub = SimpleNamespace(
        loss_type=loss_type,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="sequence" if sequence else "token",
        beta=0.0,
        epsilon_low=epsilon,
        epsilon_high=epsilon_high,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        args=config,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=T,
        accelerator=accelerator,
        _metrics=defaultdict(lambda: defaultdict(list)),
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _get_per_token_logps_and_entropies=lambda *a, **k: (log_prob, torch.zeros_like(log_prob), None),
        get_gamma_weights=trl_trainer.GRPOTrainer.get_gamma_weights,  # TRL's static method
    )
    inputs = {
        "prompt_ids": torch.zeros(N, 1, dtype=torch.long),
        "prompt_mask": torch.ones(N, 1, dtype=torch.long),
        "completion_ids": torch.zeros(N, T, dtype=torch.long),
        "completion_mask": mask.double(),
        "advantages": adv,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum().double(),
    }
    return trl_trainer.GRPOTrainer._compute_loss(stub, None, inputs)


# TRL loss_type, TRL arguments, tokencredit objective, global_seqs
Args = objectives.ObjectiveArgs
CLIP = {"eps_low": 0.2, "eps_high": 0.28}
TRL_CASES = [
    ("grpo", {}, Args("ppo-clip", CLIP, loss_agg_mode="seq-mean-token-mean"), N),
    ("grpo", {"sequence": True}, Args("ppo-clip", CLIP, "gspo", loss_agg_mode="seq-mean-token-mean"), N),
    ("bnpo", {}, Args("ppo-clip", CLIP, loss_agg_mode="token-mean"), None),
    ("dr_grpo", {}, Args("ppo-clip", CLIP, loss_agg_mode="seq-mean-token-sum-norm", norm_constant=T), N),
    ("dapo", {}, Args("ppo-clip", CLIP, loss_agg_mode="token-mean"), None),
    ("luspo", {"sequence": True}, Args("ppo-clip", CLIP, "gspo", loss_agg_mode="seq-mean-token-sum"), N),
    (
        "cispo",
        {"epsilon_high": 5.0},
        Args("cispo", {"eps_low": 1.0, "eps_high": 4.0}, loss_agg_mode="token-mean"),
        None,
    ),
    (
        "cispo",
        {"epsilon_high": 1.2},
        Args("cispo", {"eps_low": 1.0, "eps_high": 0.2}, loss_agg_mode="token-mean"),
        None,
    ),
    (
        "sapo",
        {"sapo_temperature_pos": 0.9, "sapo_temperature_neg": 1.4},
        Args("sapo", {"tau_pos": 0.9, "tau_neg": 1.4}, loss_agg_mode="seq-mean-token-mean"),
        N,
    ),
    ("vespo", {}, Args("vespo", loss_agg_mode="token-mean"), None),
    (
        "vespo",
        {"vespo_k_pos": 1.5, "vespo_lambda_pos": 2.5, "vespo_k_neg": 2.0, "vespo_lambda_neg": 4.0},
        Args(
            "vespo",
            {"k_pos": 1.5, "lambda_pos": 2.5, "k_neg": 2.0, "lambda_neg": 4.0},
            loss_agg_mode="token-mean",
        ),
        None,
    ),
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("loss_type", "trl_args", "ours_args", "global_seqs"), TRL_CASES)
def test_loss_equals_trl(loss_type, trl_args, ours_args, global_seqs, seed):
    log_prob, old, adv, mask = policy_batch(10 + seed, spread=0.05 if loss_type == "vespo" else 0.3)
    if (
        loss_type == "vespo"
    ):  # VESPO's weight is sequence-level: one sign per response exercises both branches
        adv = adv[:, :1].expand(N, T).contiguous()
    want, want_grad = value_and_grad(
        lambda: trl_loss(loss_type, log_prob, old, adv, mask, **trl_args), log_prob
    )
    got, got_grad = value_and_grad(
        lambda: objectives.policy_loss(log_prob, old, adv, mask, ours_args, global_seqs=global_seqs)[0],
        log_prob,
    )
    assert_close(got, want, f"TRL {loss_type} value")
    assert_close(got_grad, want_grad, f"TRL {loss_type} gradient")
    assert float(got_grad.abs().sum()) > 0

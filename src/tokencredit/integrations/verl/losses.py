"""tokencredit's objective with the ratio kernels and losses verl lacks, as verl policy losses.

``tc_<kernel>``: PPO-clip with a ratio kernel verl has not (the eligibility traces, GRPO(lambda));
``tc_<loss>``: a policy loss verl has not (TRL's vespo). For a loss verl has (`VERL_LOSSES`), verl's
own ``policy_loss.loss_mode`` is used with a ``tc_`` estimator: the estimator supplies Â, verl's loss
trains on it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor
from verl.trainer.ppo import core_algos

from tokencredit import objectives
from tokencredit.errors import ConfigError
from tokencredit.integrations.engines import ENGINE_KERNELS
from tokencredit.integrations.verl.estimators import ESTIMATORS, cfg_value, slug, uses_keep

__all__ = ["LOSSES", "VERL_LOSSES", "check_pairing", "register_loss"]

LOSSES: dict[str, tuple[str, dict[str, Any]]] = {}  # verl loss name -> (kernel, kernel params)
# tokencredit's policy losses that verl 0.9.1 registers itself, and verl's loss_mode for each.
VERL_LOSSES = {
    "ppo-clip": "vanilla",
    "reinforce": "gpg",
    "gpg": "gpg",
    "cispo": "cispo",
    "sapo": "sapo",
    "clip-cov": "clip_cov",
    "kl-cov": "kl_cov",
    "gmpo": "geo_mean",
    "dppo-kl": "dppo_kl",
    "dppo-tv": "dppo_tv",
}


def _clip_args(loss: str, config: Any) -> dict[str, float]:
    """The clip range from verl's actor config, for a loss that takes it."""
    takes = objectives.get_loss(loss).defaults
    clip = float(cfg_value(config, "clip_ratio", 0.2))
    values = {
        "eps_low": float(cfg_value(config, "clip_ratio_low", clip)),
        "eps_high": float(cfg_value(config, "clip_ratio_high", clip)),
        "dual_clip": float(cfg_value(config, "clip_ratio_c", 3.0)),
    }
    return {k: v for k, v in values.items() if k in takes}


def _make_loss(
    verl_name: str,
    kernel: str,
    kernel_params: Mapping[str, Any],
    loss: str = "ppo-clip",
    loss_params: Mapping[str, Any] | None = None,
) -> Callable[..., tuple[Tensor, dict]]:
    k = objectives.get_kernel(kernel)
    uses_keep = k.uses_keep
    prepared_by_estimator = k.prepare.defaults if k.prepare is not None else {}
    params = {
        n: v
        for n, v in objectives.kernel_parameters(kernel, kernel_params).items()
        if n not in prepared_by_estimator
    }

    def policy_loss(
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
        **_: Any,
    ) -> tuple[Tensor, dict[str, float]]:
        """tokencredit objective (ratio kernel + loss + aggregation) with verl's actor settings."""
        if rollout_is_weights is not None:
            raise ConfigError(
                f"verl policy loss {verl_name!r} does not apply rollout-correction importance weights; "
                "set algorithm.rollout_correction=null (or use bypass mode without IS weights)"
            )
        info = dict(cfg_value(config, "global_batch_info", {}) or {})
        dp_size = float(info.get("dp_size") or 1)
        tokens, seqs = info.get("batch_num_tokens"), info.get("global_batch_size")
        mask = response_mask.bool()
        kernel_args = dict(params)
        if uses_keep:
            # The kept set travels in the advantages: the paired estimator zeroes Â outside it.
            # A zero-advantage response has no loss term either way.
            kernel_args["keep"] = mask & (advantages != 0)
        args = objectives.ObjectiveArgs(
            loss=loss,
            loss_params={**(loss_params or {}), **_clip_args(loss, config)},
            kernel=kernel,
            kernel_args=kernel_args,
            loss_agg_mode=loss_agg_mode,
            norm_constant=info.get("loss_scale_factor"),
        )
        value, metrics = objectives.policy_loss(
            log_prob,
            old_log_prob,
            advantages,
            mask,
            args,
            global_tokens=None if tokens is None else float(tokens) / dp_size,
            global_seqs=None if seqs is None else float(seqs) / dp_size,
        )
        out = {f"actor/tc_{k}": v for k, v in metrics.items()}
        out["actor/pg_clipfrac"] = metrics.get("clip_frac", 0.0)
        out["actor/pg_clipfrac_lower"] = metrics.get("clip_dual_frac", 0.0)
        out["actor/ppo_kl"] = metrics.get("approx_kl", 0.0)
        return value, out

    policy_loss.__name__ = f"tokencredit_{slug(verl_name)}"
    policy_loss.__qualname__ = policy_loss.__name__
    policy_loss.tokencredit_kernel = (kernel, dict(kernel_params))  # type: ignore[attr-defined]
    policy_loss.tokencredit_loss = loss  # type: ignore[attr-defined]
    return policy_loss


def register_loss(
    verl_name: str,
    kernel: str = "token",
    *,
    loss: str = "ppo-clip",
    loss_params: Mapping[str, Any] | None = None,
    **kernel_params: Any,
) -> Callable[..., tuple[Tensor, dict]]:
    """Register tokencredit's objective, policy loss `loss` with ratio kernel `kernel`, as verl policy loss
    `verl_name` (`loss_params`: the loss's hyperparameters besides the clip range).

    Clip ratios (clip_ratio_low / clip_ratio_high), dual clip (clip_ratio_c), loss_agg_mode and the
    global-batch normalisers come from verl's actor config; `kernel_params` (lam, decay) from the
    recipe of the same name when there is one. A kept-set kernel (S-trace) trains the valid tokens
    whose advantage is non-zero: pair it with an estimator that applies the kept set (tc_strace, or
    register_estimator(..., kernel="strace")); the hooks refuse other pairings.
    """
    if kernel in ENGINE_KERNELS and loss in VERL_LOSSES:
        raise ConfigError(
            f"verl already implements loss {loss!r} with kernel {kernel!r} (loss_mode {VERL_LOSSES[loss]} / gspo); use that"
        )
    objectives.get_kernel(kernel)
    objectives.LOSSES.check_params(loss, dict(loss_params or {}))
    fn = _make_loss(verl_name, kernel, kernel_params, loss, loss_params)
    core_algos.register_policy_loss(verl_name)(fn)
    LOSSES[verl_name] = (kernel, dict(kernel_params))
    return fn


def check_pairing(config: Any) -> None:
    """A kept-set loss (tc_strace) needs an estimator that puts the kept set into the advantages."""
    try:
        loss_mode = config.actor_rollout_ref.actor.policy_loss.loss_mode
        estimator = config.algorithm.adv_estimator
    except (AttributeError, KeyError):
        return
    if loss_mode not in LOSSES or not objectives.get_kernel(LOSSES[loss_mode][0]).uses_keep:
        return
    spec = ESTIMATORS.get(getattr(estimator, "value", estimator))
    if spec is None or not uses_keep(spec):
        raise ConfigError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} trains only the kept (high-entropy) token "
            f"set, which it reads from the advantages; algorithm.adv_estimator={estimator} does not provide it. "
            "Use algorithm.adv_estimator=tc_strace, or register a paired estimator with "
            "tokencredit.integrations.verl.register_estimator(name, method, kernel='strace')"
        )

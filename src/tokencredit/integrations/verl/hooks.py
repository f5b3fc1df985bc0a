"""The one place that touches verl: hooks on its trainers (and, with the actor extension, its FSDP
engine), applied right after each target module is first imported, so ``import verl`` stays light."""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

from torch import Tensor
from verl import DataProto
from verl.trainer.ppo import core_algos

from tokencredit.builder import needs_of
from tokencredit.integrations.verl import actor
from tokencredit.integrations.verl.estimators import (
    _CONTEXT,
    _LEGACY_SPECIAL_IDS,
    _LEGACY_TRAINER,
    ESTIMATORS,
    METRICS_KEY,
    _special_ids,
    _StepContext,
    cfg_value,
    worker_advantages,
)
from tokencredit.integrations.verl.import_hooks import when_imported
from tokencredit.integrations.verl.losses import check_pairing

__all__ = ["ACTOR_HOOK_TARGETS", "HOOK_TARGETS", "install_hooks"]


def _wrap_compute_advantage(original: Callable[..., DataProto]) -> Callable[..., DataProto]:
    if getattr(original, "tokencredit_hook", False):
        return original
    signature = inspect.signature(original)

    @functools.wraps(original)
    def compute_advantage(*args: Any, **kwargs: Any) -> DataProto:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        data, estimator = bound.arguments["data"], bound.arguments["adv_estimator"]
        name = getattr(estimator, "value", estimator)
        if name not in ESTIMATORS:
            return original(*args, **kwargs)
        if "response_mask" not in data.batch.keys():
            from verl.trainer.ppo.ray_trainer import compute_response_mask

            data.batch["response_mask"] = compute_response_mask(data)
        fn = core_algos.get_adv_estimator_fn(name)
        adv, returns = fn(
            token_level_rewards=data.batch["token_level_rewards"],
            response_mask=data.batch["response_mask"],
            index=data.non_tensor_batch.get("uid"),
            config=bound.arguments.get("config"),
            data=data,
        )
        data.batch["advantages"] = adv
        data.batch["returns"] = returns
        for key in actor.ADDED_KEYS:
            # the actor extension's signals are for the estimator only; do not ship them to the actor update.
            data.batch.pop(key, None)
        return data

    compute_advantage.tokencredit_hook = True  # type: ignore[attr-defined]
    return compute_advantage


def _actor_request(config: Any) -> tuple[str | None, tuple[str, ...]]:
    """(the configured tc_ estimator, what the actor extension's workers must compute for it); (None, ())
    when the switch is off or the estimator is not ours."""
    if not actor.enabled():
        return None, ()
    try:
        name = config.algorithm.adv_estimator
    except (AttributeError, KeyError):
        return None, ()
    name = getattr(name, "value", name)
    spec = ESTIMATORS.get(name)
    if spec is None:
        return None, ()
    return name, actor.requested(spec.credit, needs_of(spec).forward)


def _wrap_legacy_old_log_prob(original: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(original, "tokencredit_hook", False):
        return original
    if actor.enabled():
        actor.check_target(original, "_compute_old_log_prob")

    @functools.wraps(original)
    def _compute_old_log_prob(self: Any, *args: Any, **kwargs: Any) -> Any:
        config = getattr(self, "config", None)
        check_pairing(config)
        _LEGACY_SPECIAL_IDS[0] = _special_ids(getattr(self, "tokenizer", None))
        _LEGACY_TRAINER[0] = weakref.ref(self)  # its tokenizer and global step, for saved rollouts
        name, wanted = _actor_request(config)
        if wanted:
            batch = args[0] if args else kwargs["batch"]
            delta: dict[str, Any] = {}
            if "delta_coef" in wanted:  # DelTA's workers need A now (the actor package's docstring)
                spec = ESTIMATORS[name]
                delta = {
                    "seq_adv": worker_advantages(name, batch, config.algorithm),
                    "delta_params": actor.REDUCTIONS["delta"].worker_params(spec.credit_params),
                }
            with actor.requesting(self, batch, wanted, **delta) as signals:
                result = original(self, *args, **kwargs)
        else:
            result, signals = original(self, *args, **kwargs), {}
        old = result[0] if isinstance(result, tuple) else result
        if "entropys" in old.batch.keys():
            # `fit` pops "entropys" after logging it; keep it for the estimators.
            old.batch["tc_entropy"] = old.batch["entropys"]
        for key, value in signals.items():
            old.batch[key] = value  # `fit` unions these into the batch the estimator receives
        return result

    _compute_old_log_prob.tokencredit_hook = True  # type: ignore[attr-defined]
    return _compute_old_log_prob


def _wrap_v1_compute_advantage(original: Callable[..., Any], tq_module: Any) -> Callable[..., Any]:
    if getattr(original, "tokencredit_hook", False):
        return original

    @functools.wraps(original)
    def _compute_advantage(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        name = self.config.algorithm.adv_estimator
        if getattr(name, "value", name) not in ESTIMATORS:
            return original(self, batch, *args, **kwargs)
        check_pairing(self.config)

        def fetch(fields: list[str]) -> dict[str, Tensor]:
            got = tq_module.kv_batch_get(
                keys=batch.keys, partition_id=batch.partition_id, select_fields=fields
            )
            padded = got.to_padded_tensor()
            return {f: padded[f] for f in fields}

        def fetch_rows(fields: list[str]) -> dict[str, list[Tensor]]:
            got = tq_module.kv_batch_get(
                keys=batch.keys, partition_id=batch.partition_id, select_fields=fields
            )
            # nested fields (one row per sample, as the v1 trainer stores them) come back unpadded
            return {f: list(got[f].unbind()) for f in fields}

        rollout_corr = cfg_value(self.config.algorithm, "rollout_correction", None)
        bypass = bool(cfg_value(rollout_corr, "bypass_mode", False))  # no old-log-prob step, hence no entropy
        ctx = _StepContext(
            _special_ids(getattr(self, "tokenizer", None)),
            fetch,
            has_entropy=not bypass,
            metrics={},
            tokenizer=getattr(self, "tokenizer", None),
            step=getattr(self, "global_steps", None),
            fetch_rows=fetch_rows,
        )
        token = _CONTEXT.set(ctx)
        try:
            out = original(self, batch, *args, **kwargs)
        finally:
            _CONTEXT.reset(token)
        metrics = args[0] if args else kwargs.get("metrics")
        if isinstance(metrics, dict):
            metrics.update(ctx.metrics or {})  # the credit diagnostics, in verl's step log
        return out

    _compute_advantage.tokencredit_hook = True  # type: ignore[attr-defined]
    return _compute_advantage


def _wrap_compute_data_metrics(original: Callable[..., dict]) -> Callable[..., dict]:
    """verl's step metrics plus the credit diagnostics our estimator left in the batch (legacy trainer)."""
    if getattr(original, "tokencredit_hook", False):
        return original

    @functools.wraps(original)
    def compute_data_metrics(batch: DataProto, *args: Any, **kwargs: Any) -> dict:
        out = original(batch, *args, **kwargs)
        extra = (
            batch.meta_info.pop(METRICS_KEY, None)
            if isinstance(getattr(batch, "meta_info", None), dict)
            else None
        )
        return {**out, **extra} if extra else out

    compute_data_metrics.tokencredit_hook = True  # type: ignore[attr-defined]
    return compute_data_metrics


def _patch_ray_trainer(module: ModuleType) -> None:
    module.compute_advantage = _wrap_compute_advantage(module.compute_advantage)
    if hasattr(module, "compute_data_metrics"):
        module.compute_data_metrics = _wrap_compute_data_metrics(module.compute_data_metrics)
    legacy = getattr(module, "RayPPOTrainer", None)
    if legacy is not None and hasattr(legacy, "_compute_old_log_prob"):
        legacy._compute_old_log_prob = _wrap_legacy_old_log_prob(legacy._compute_old_log_prob)


def _patch_v1_utils(module: ModuleType) -> None:
    module.compute_advantage = _wrap_compute_advantage(module.compute_advantage)


def _patch_v1_trainer_base(module: ModuleType) -> None:
    module.PPOTrainer._compute_advantage = _wrap_v1_compute_advantage(
        module.PPOTrainer._compute_advantage, module.tq
    )


def _patch_fsdp_engine(module: ModuleType) -> None:
    engine = module.FSDPEngineWithLMHead
    engine.forward_step = actor.wrap_forward_step(engine.forward_step)
    engine.infer_batch = actor.wrap_infer_batch(engine.infer_batch)


# verl module -> the patch applied right after it is executed (or at once if it already was).
HOOK_TARGETS: dict[str, Callable[[ModuleType], None]] = {
    "verl.trainer.ppo.ray_trainer": _patch_ray_trainer,
    "verl.trainer.ppo.v1.utils": _patch_v1_utils,
    "verl.trainer.ppo.v1.trainer_base": _patch_v1_trainer_base,
}
# Worker side of the actor extension, hooked only when its switch is on (actor.enabled()).
ACTOR_HOOK_TARGETS: dict[str, Callable[[ModuleType], None]] = {
    "verl.workers.engine.fsdp.transformer_impl": _patch_fsdp_engine,
}


def install_hooks() -> list[str]:
    """Schedule (or apply, for already imported modules) the hooks of the module docstring; idempotent.

    Returns the verl modules hooked. A module that is never imported (e.g. the v1 trainer on an
    install without TransferQueue) is simply never patched. With the actor extension's switch on
    (actor.SWITCH), verl's FSDP engine is hooked too (ACTOR_HOOK_TARGETS).
    """
    targets = {**HOOK_TARGETS, **(ACTOR_HOOK_TARGETS if actor.enabled() else {})}
    for name, patch in targets.items():
        when_imported(name, patch)
    return list(targets)

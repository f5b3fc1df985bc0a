"""verl plugin: tokencredit's token credit as verl advantage estimators and policy losses.

Load it without forking verl: ``VERL_USE_EXTERNAL_MODULES=tokencredit.integrations.verl`` (verl
imports the module at ``import verl``; in a Ray cluster pass the variable through
``ray_kwargs.ray_init.runtime_env.env_vars``), then select
``algorithm.adv_estimator=tc_<name>`` and, for the trace kernels,
``actor_rollout_ref.actor.policy_loss.loss_mode=tc_ptrace`` / ``tc_strace``. See docs/integrations.md.

What it registers (generated, never listed by hand):

- one estimator ``tc_<slug>`` per recipe of `tokencredit.recipes.RECIPES` and per credit method
  of `tokencredit.credit.CREDIT_METHODS` that is not also a recipe (``tc_ktae``, ``tc_delta``,
  ``tc_strace``, ``tc_arca``, ``tc_entropy_80_20``, ``tc_gcpo``, ``tc_dapo_ktae``, ...). Each returns
  (Â, Â) [bs, T] computed by the core: the group baseline (`tokencredit.advantages`), then the
  credit method (`tokencredit.credit.compute`);
- one policy loss ``tc_<kernel>`` per ratio kernel verl does not already have (``tc_ptrace``,
  ``tc_strace``, ``tc_accumulating``), computed by `tokencredit.objectives.policy_loss` with
  verl's clip ratios, dual clip, ``loss_agg_mode`` and global-batch normalisers.

Inputs verl does not pass. A registered estimator receives only ``token_level_rewards``,
``response_mask``, ``index`` and ``config``; token credit needs the response token ids and, for
some methods, the old policy's entropy. `install_hooks` (run once at import; the one place that
touches verl) supplies them by the least invasive routes of the integration spec, patching each
verl module right after it is first imported (`HOOK_TARGETS`), so ``import verl`` stays light:

1. the module-level ``compute_advantage`` (in ``verl.trainer.ppo.ray_trainer`` and, on the v1
   trainer, ``verl.trainer.ppo.v1.utils``) is wrapped: for a ``tc_`` estimator it hands the whole
   ``DataProto`` to the estimator; every other estimator goes to verl's code untouched;
2. v1 trainer (verl 0.9 default): ``PPOTrainer._compute_advantage`` reads only a fixed field list
   from the TransferQueue; the wrapper lets our estimators fetch ``responses`` and ``entropy``
   (which the v1 trainer keeps there) for the same keys;
3. legacy trainer (``trainer.use_v1=False``): ``RayPPOTrainer._compute_old_log_prob`` returns the
   entropy that ``fit`` then pops; the wrapper keeps a copy under ``tc_entropy``.

Signals verl never computes (final hidden states for DelTA / ARCA, the adapter-free pass, GCPO's
negative-prompt pass) come from the actor extension, `tokencredit.integrations.verl_actor`, switched
on by ``TOKENCREDIT_VERL_ACTOR_SIGNALS=1`` (driver and Ray workers; legacy trainer): it hooks verl's
FSDP engine and the legacy trainer's ``_compute_old_log_prob``, so the old-log-prob step also
returns exactly the signals the selected estimator needs, under the batch keys of `SIGNAL_KEYS`
(``tc_hidden``, ...). Without them those estimators raise a `ConfigError` naming the switch. The
S-trace loss reads its kept token set from the advantages (see `register_loss`).
"""

from __future__ import annotations

import contextvars
import functools
import importlib.abc
import importlib.machinery
import inspect
import logging
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

import numpy as np
import torch
from packaging.version import Version
from torch import Tensor

from tokencredit import objectives
from tokencredit.batch import RolloutBatch
from tokencredit.errors import ConfigError, closest
from tokencredit.integrations._common import ENGINE_KERNELS, group_ids_from_labels, slug
from tokencredit.models import special_token_ids
from tokencredit.recipes import (
    RECIPES,
    Recipe,
    credit_needs,
    known_names,
    resolve,
    token_credit,
    zero_outside,
)

try:
    import verl
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "tokencredit.integrations.verl needs verl: pip install 'tokencredit[verl]' and then "
        "pip install --no-deps 'verl>=0.9,<0.10' (see docs/integrations.md)"
    ) from err

__all__ = [
    "ESTIMATORS",
    "LOSSES",
    "SIGNAL_KEYS",
    "SUPPORTED_VERSIONS",
    "batch_from_dataproto",
    "ACTOR_HOOK_TARGETS",
    "HOOK_TARGETS",
    "check_version",
    "estimator_spec",
    "install_hooks",
    "register_estimator",
    "register_loss",
]

log = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ">=0.9,<0.10"
_MIN_VERSION, _MAX_VERSION = Version("0.9.0"), Version("0.10.0")


def check_version(version: str | None = None) -> str:
    """Raise ImportError unless verl's version is in SUPPORTED_VERSIONS (the range we test)."""
    found = verl.__version__ if version is None else version
    if not _MIN_VERSION <= Version(found) < _MAX_VERSION:
        raise ImportError(
            f"tokencredit.integrations.verl supports verl {SUPPORTED_VERSIONS} (tested with 0.9.1); found verl "
            f"{found}. Its hooks wrap verl-internal functions whose signatures change between releases, so "
            "other versions are refused rather than silently mis-wired."
        )
    return found


check_version()

from verl import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402

from tokencredit.integrations import verl_actor  # noqa: E402

# Where each per-token signal is read from in a DataProto's batch, first match wins. verl's own
# keys: old_log_probs, ref_log_prob, entropy (v1 TransferQueue field), entropys (legacy
# old-log-prob output, kept as tc_entropy by our hook); the other tc_* keys come from the actor
# extension (tokencredit.integrations.verl_actor, switched on by TOKENCREDIT_VERL_ACTOR_SIGNALS=1).
SIGNAL_KEYS: dict[str, tuple[str, ...]] = {
    "old_log_probs": ("old_log_probs",),
    "ref_log_probs": ("ref_log_prob",),
    "entropy": ("tc_entropy", "entropy", "entropys"),
    **{name: (key,) for name, key in verl_actor.BATCH_KEYS.items()},
}

ESTIMATORS: dict[str, Recipe] = {}  # verl estimator name -> resolved recipe
LOSSES: dict[str, tuple[str, dict[str, Any]]] = {}  # verl loss name -> (kernel, kernel params)


# ---------------------------------------------------------------------------------------------- step context
@dataclass
class _StepContext:
    """What the trainer-level hooks know about the step whose advantages are being computed."""

    special_ids: tuple[int, ...] | None = None
    fetch: Callable[[list[str]], dict[str, Tensor]] | None = None  # v1: fields from the TransferQueue


_CONTEXT: contextvars.ContextVar[_StepContext | None] = contextvars.ContextVar("tc_verl_step", default=None)
# The legacy trainer's tokenizer special ids (set by its hook in the driver process).
_LEGACY_SPECIAL_IDS: list[tuple[int, ...] | None] = [None]


def _special_ids(tokenizer: Any) -> tuple[int, ...] | None:
    return special_token_ids(tokenizer) or None


# ---------------------------------------------------------------------------------------------- batches
def _first_key(data: DataProto, keys: Iterable[str]) -> str | None:
    present = set(data.batch.keys())
    return next((k for k in keys if k in present), None)


def batch_from_dataproto(
    data: DataProto,
    needs: Iterable[str] = (),
    *,
    token_level_rewards: Tensor | None = None,
    response_mask: Tensor | None = None,
    who: str = "tokencredit",
) -> RolloutBatch:
    """A RolloutBatch [bs, T] from a verl DataProto.

    token ids = ``responses``; mask = ``response_mask``; score = sum of ``token_level_rewards`` over
    the response (verl puts the outcome reward at the last valid token; an in-reward KL penalty is
    summed in, as verl's GRPO does); group ids = ``non_tensor_batch["uid"]``; the per-token
    signals `needs` from the keys in SIGNAL_KEYS. Raises ConfigError naming a missing field.
    """
    batch = data.batch
    rewards = batch["token_level_rewards"] if token_level_rewards is None else token_level_rewards
    mask = batch["response_mask"] if response_mask is None else response_mask
    if "responses" not in batch.keys():
        raise ConfigError(
            f"{who}: the DataProto has no 'responses' (response token ids); keys: {sorted(batch.keys())}"
        )
    if "uid" not in data.non_tensor_batch:
        raise ConfigError(
            f"{who}: the DataProto has no non_tensor_batch['uid'] (the prompt group of each response)"
        )
    token_ids = batch["responses"]
    if token_ids.shape != mask.shape:
        raise ConfigError(
            f"{who}: 'responses' has shape {tuple(token_ids.shape)} but 'response_mask' {tuple(mask.shape)}"
        )
    signals: dict[str, Tensor] = {}
    for name in sorted(set(needs)):
        key = _first_key(data, SIGNAL_KEYS[name])
        if key is None:
            raise ConfigError(_missing_signal_message(who, name))
        signals[name] = batch[key].float()
    return RolloutBatch(
        token_ids=token_ids,
        mask=mask.bool(),
        group_ids=group_ids_from_labels(data.non_tensor_batch["uid"]).to(token_ids.device),
        scores=rewards.float().sum(-1),
        **signals,
    )


def _missing_signal_message(who: str, name: str) -> str:
    keys = " / ".join(SIGNAL_KEYS[name])
    if name == "entropy":
        how = (
            "verl computes it with the old log-probs; it is in the batch when tokencredit.integrations.verl is "
            "imported through VERL_USE_EXTERNAL_MODULES in the trainer process (its hooks keep it)"
        )
    elif verl_actor.enabled():
        how = (
            f"{verl_actor.SWITCH} is set in this process, but the signal did not arrive: the extension hooks the "
            "legacy trainer's old-log-prob step (trainer.use_v1=False) and needs the variable in the Ray workers "
            "too (docs/integrations.md, 'Methods that need the actor extension')"
        )
    else:
        how = (
            f"verl's actor does not compute it. Switch on tokencredit's actor extension with {verl_actor.SWITCH}=1 "
            "in the driver and the Ray workers, and trainer.use_v1=False (docs/integrations.md, 'Methods that need "
            "the actor extension')"
        )
    return f"{who} needs the per-token signal {name!r} (batch key {keys}), which this DataProto lacks: {how}"


# ---------------------------------------------------------------------------------------------- estimators
def _cfg(config: Any, key: str, default: Any) -> Any:
    if config is None:
        return default
    getter = getattr(config, "get", None)
    value = getter(key, default) if callable(getter) else getattr(config, key, default)
    return default if value is None else value


def _uses_keep(recipe: Recipe) -> bool:
    return recipe.uses_ratio and objectives.get_kernel(recipe.kernel).uses_keep


def _make_estimator(verl_name: str, spec: Recipe) -> Callable[..., tuple[Tensor, Tensor]]:
    needs = credit_needs(spec)

    def estimator(
        token_level_rewards: Tensor,
        response_mask: Tensor,
        index: np.ndarray | None = None,
        config: Any = None,
        data: DataProto | None = None,
        **_: Any,
    ) -> tuple[Tensor, Tensor]:
        """tokencredit token advantages Â [bs, T] (returned twice: advantages and returns)."""
        if data is None:
            raise ConfigError(
                f"verl estimator {verl_name!r} needs the whole DataProto (response token ids"
                f"{', ' + ', '.join(sorted(needs)) if needs else ''}); tokencredit's compute_advantage "
                "hook passes it. The hook is installed when tokencredit.integrations.verl is imported "
                "(VERL_USE_EXTERNAL_MODULES=tokencredit.integrations.verl) and covers verl's PPO trainers "
                "(v1 and legacy); this call came from another code path"
            )
        ctx = _CONTEXT.get()
        _fetch_missing(data, needs, ctx)
        batch = batch_from_dataproto(
            data, needs, token_level_rewards=token_level_rewards, response_mask=response_mask,
            who=f"verl estimator {verl_name!r}",
        )  # fmt: skip
        special = ctx.special_ids if ctx is not None and ctx.special_ids else _LEGACY_SPECIAL_IDS[0]
        # A credit method on its own uses verl's own GRPO settings (eps 1e-6, norm_adv_by_std_in_grpo).
        baseline = "grpo" if bool(_cfg(config, "norm_adv_by_std_in_grpo", True)) else "dr-grpo"
        tc = token_credit(spec.with_method_baseline(baseline), batch, special_ids=special)
        # The kept set (S-trace) travels to the paired loss in the advantages: 0 outside it.
        tok = zero_outside(tc.token_advantages, tc.keep).to(device=token_level_rewards.device)
        return tok, tok.clone()

    estimator.__name__ = f"tokencredit_{slug(verl_name)}"
    estimator.__qualname__ = estimator.__name__
    estimator.tokencredit_spec = spec  # type: ignore[attr-defined]
    return estimator


def _fetch_missing(data: DataProto, needs: Iterable[str], ctx: _StepContext | None) -> None:
    """v1 trainer: bring `responses` / `entropy` from the TransferQueue into `data` when absent."""
    if ctx is None or ctx.fetch is None:
        return
    missing = [] if "responses" in data.batch.keys() else ["responses"]
    if "entropy" in needs and _first_key(data, SIGNAL_KEYS["entropy"]) is None:
        missing.append("entropy")
    if not missing:
        return
    fetched = ctx.fetch(missing)
    mask = data.batch["response_mask"]
    for key in missing:
        value = fetched[key]
        if value.shape[0] != len(data):
            raise ConfigError(
                f"TransferQueue field {key!r}: {value.shape[0]} rows for a batch of {len(data)}"
            )
        if value.shape[-1] < mask.shape[-1]:
            value = torch.nn.functional.pad(value, (0, mask.shape[-1] - value.shape[-1]))
        data.batch[key] = value[:, : mask.shape[-1]].to(mask.device)


def register_estimator(
    verl_name: str,
    credit: str,
    *,
    credit_params: Mapping[str, Any] | None = None,
    kernel: str | None = None,
    kernel_params: Mapping[str, Any] | None = None,
) -> Callable[..., tuple[Tensor, Tensor]]:
    """Register a tokencredit estimator in verl's registry under `verl_name`.

    `credit`: a recipe or credit method name (tokencredit.recipes / tokencredit.credit);
    `credit_params` override the method's hyperparameters; `kernel` / `kernel_params` name the
    ratio kernel the estimator is paired with (only a kept-set kernel changes the estimator: Â is
    zeroed outside the kept set, which the matching loss reads). Use it in your own module listed
    in VERL_USE_EXTERNAL_MODULES for variants, e.g. register_estimator("tc_ktae_top05", "ktae",
    credit_params={"top": 0.5}).
    """
    spec = resolve(credit, {"credit_params": dict(credit_params)} if credit_params else None)
    if kernel is not None:  # a new kernel starts from its own defaults, not the old kernel's parameters
        spec = resolve(replace(spec, kernel=kernel, kernel_params=dict(kernel_params or {})))
    elif kernel_params:
        spec = resolve(spec, {"kernel_params": dict(kernel_params)})
    fn = _make_estimator(verl_name, spec)
    existing = core_algos.ADV_ESTIMATOR_REGISTRY.get(verl_name)
    if existing is not None and getattr(existing, "tokencredit_spec", None) is not None:
        core_algos.ADV_ESTIMATOR_REGISTRY.pop(verl_name)  # re-registration of our own name (module reload)
    core_algos.register_adv_est(verl_name)(fn)
    ESTIMATORS[verl_name] = spec
    return fn


# ---------------------------------------------------------------------------------------------- losses
def _make_loss(
    verl_name: str, kernel: str, kernel_params: Mapping[str, Any]
) -> Callable[..., tuple[Tensor, dict]]:
    k = objectives.get_kernel(kernel)
    uses_keep = k.uses_keep
    prepared_by_estimator = k.prepare.defaults if k.prepare is not None else {}
    params = {n: v for n, v in objectives.kernel_parameters(kernel, kernel_params).items() if n not in prepared_by_estimator}

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
        """tokencredit objective (ratio kernel + PPO clip + aggregation) with verl's actor settings."""
        if rollout_is_weights is not None:
            raise ConfigError(
                f"verl policy loss {verl_name!r} does not apply rollout-correction importance weights; "
                "set algorithm.rollout_correction=null (or use bypass mode without IS weights)"
            )
        clip = float(_cfg(config, "clip_ratio", 0.2))
        eps_low = float(_cfg(config, "clip_ratio_low", clip))
        eps_high = float(_cfg(config, "clip_ratio_high", clip))
        dual_clip = float(_cfg(config, "clip_ratio_c", 3.0))
        info = dict(_cfg(config, "global_batch_info", {}) or {})
        dp_size = float(info.get("dp_size") or 1)
        tokens, seqs = info.get("batch_num_tokens"), info.get("global_batch_size")
        mask = response_mask.bool()
        kw: dict[str, Any] = dict(params)
        if uses_keep:
            # The kept set travels in the advantages: the paired estimator zeroes Â outside it.
            # A zero-advantage response has no loss term either way.
            kw["keep"] = mask & (advantages != 0)
        loss, metrics = objectives.policy_loss(
            log_prob,
            old_log_prob,
            advantages,
            mask,
            kernel=kernel,
            eps_low=eps_low,
            eps_high=eps_high,
            dual_clip=dual_clip,
            loss_agg_mode=loss_agg_mode,
            norm_constant=info.get("loss_scale_factor"),
            global_tokens=None if tokens is None else float(tokens) / dp_size,
            global_seqs=None if seqs is None else float(seqs) / dp_size,
            **kw,
        )
        out = {f"actor/tc_{k}": v for k, v in metrics.items()}
        out["actor/pg_clipfrac"] = metrics.get("clip_frac", 0.0)
        out["actor/pg_clipfrac_lower"] = metrics.get("clip_dual_frac", 0.0)
        out["actor/ppo_kl"] = metrics.get("approx_kl", 0.0)
        return loss, out

    policy_loss.__name__ = f"tokencredit_{slug(verl_name)}"
    policy_loss.__qualname__ = policy_loss.__name__
    policy_loss.tokencredit_kernel = (kernel, dict(kernel_params))  # type: ignore[attr-defined]
    return policy_loss


def register_loss(verl_name: str, kernel: str, **kernel_params: Any) -> Callable[..., tuple[Tensor, dict]]:
    """Register tokencredit's objective with ratio kernel `kernel` as verl policy loss `verl_name`.

    Clip ratios (clip_ratio_low / clip_ratio_high), dual clip (clip_ratio_c), loss_agg_mode and the
    global-batch normalisers come from verl's actor config; `kernel_params` (lam, decay) from the
    recipe of the same name when there is one. A kept-set kernel (S-trace) trains the valid tokens
    whose advantage is non-zero: pair it with an estimator that applies the kept set (tc_strace, or
    register_estimator(..., kernel="strace")); the hooks refuse other pairings.
    """
    if kernel in ENGINE_KERNELS:
        raise ConfigError(f"verl already implements kernel {kernel!r} (loss_mode vanilla / gspo); use that")
    objectives.get_kernel(kernel)
    fn = _make_loss(verl_name, kernel, kernel_params)
    core_algos.register_policy_loss(verl_name)(fn)
    LOSSES[verl_name] = (kernel, dict(kernel_params))
    return fn


def _check_pairing(config: Any) -> None:
    """A kept-set loss (tc_strace) needs an estimator that puts the kept set into the advantages."""
    try:
        loss_mode = config.actor_rollout_ref.actor.policy_loss.loss_mode
        estimator = config.algorithm.adv_estimator
    except (AttributeError, KeyError):
        return
    if loss_mode not in LOSSES or not objectives.get_kernel(LOSSES[loss_mode][0]).uses_keep:
        return
    spec = ESTIMATORS.get(getattr(estimator, "value", estimator))
    if spec is None or not _uses_keep(spec):
        raise ConfigError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} trains only the kept (high-entropy) token "
            f"set, which it reads from the advantages; algorithm.adv_estimator={estimator} does not provide it. "
            "Use algorithm.adv_estimator=tc_strace, or register a paired estimator with "
            "tokencredit.integrations.verl.register_estimator(name, method, kernel='strace')"
        )


# ---------------------------------------------------------------------------------------------- hooks
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
        for key in verl_actor.BATCH_KEYS.values():
            # [bs, T, H] hidden states are for the estimator only; do not ship them to the actor update.
            data.batch.pop(key, None)
        return data

    compute_advantage.tokencredit_hook = True  # type: ignore[attr-defined]
    return compute_advantage


def _actor_request(config: Any) -> tuple[str, ...]:
    """The actor-extension signals the configured tc_ estimator needs; () when the switch is off."""
    if not verl_actor.enabled():
        return ()
    try:
        name = config.algorithm.adv_estimator
    except (AttributeError, KeyError):
        return ()
    spec = ESTIMATORS.get(getattr(name, "value", name))
    return verl_actor.requested(credit_needs(spec)) if spec is not None else ()


def _wrap_legacy_old_log_prob(original: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(original, "tokencredit_hook", False):
        return original
    if verl_actor.enabled():
        verl_actor.check_target(original, "_compute_old_log_prob")

    @functools.wraps(original)
    def _compute_old_log_prob(self: Any, *args: Any, **kwargs: Any) -> Any:
        config = getattr(self, "config", None)
        _check_pairing(config)
        _LEGACY_SPECIAL_IDS[0] = _special_ids(getattr(self, "tokenizer", None))
        wanted = _actor_request(config)
        if wanted:
            batch = args[0] if args else kwargs["batch"]
            with verl_actor.requesting(self, batch, wanted) as signals:
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
        _check_pairing(self.config)

        def fetch(fields: list[str]) -> dict[str, Tensor]:
            got = tq_module.kv_batch_get(
                keys=batch.keys, partition_id=batch.partition_id, select_fields=fields
            )
            padded = got.to_padded_tensor()
            return {f: padded[f] for f in fields}

        token = _CONTEXT.set(_StepContext(_special_ids(getattr(self, "tokenizer", None)), fetch))
        try:
            return original(self, batch, *args, **kwargs)
        finally:
            _CONTEXT.reset(token)

    _compute_advantage.tokencredit_hook = True  # type: ignore[attr-defined]
    return _compute_advantage


def _patch_ray_trainer(module: ModuleType) -> None:
    module.compute_advantage = _wrap_compute_advantage(module.compute_advantage)
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
    engine.forward_step = verl_actor.wrap_forward_step(engine.forward_step)


# verl module -> the patch applied right after it is executed (or at once if it already was).
HOOK_TARGETS: dict[str, Callable[[ModuleType], None]] = {
    "verl.trainer.ppo.ray_trainer": _patch_ray_trainer,
    "verl.trainer.ppo.v1.utils": _patch_v1_utils,
    "verl.trainer.ppo.v1.trainer_base": _patch_v1_trainer_base,
}
# Worker side of the actor extension, hooked only when its switch is on (verl_actor.enabled()).
ACTOR_HOOK_TARGETS: dict[str, Callable[[ModuleType], None]] = {
    "verl.workers.engine.fsdp.transformer_impl": _patch_fsdp_engine,
}
_PENDING: dict[str, Callable[[ModuleType], None]] = {}


class _PostImportPatcher(importlib.abc.MetaPathFinder):
    """Patches a pending verl module right after its code runs, so `import verl` stays light.

    verl imports this plugin from its package __init__ (VERL_USE_EXTERNAL_MODULES), before any
    trainer module exists; importing the trainers there would pull the whole training stack into
    every Ray worker and risk import cycles. Instead the loader of each target is wrapped once.
    """

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _PENDING:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                run = spec.loader.exec_module

                def exec_module(module: ModuleType, run: Callable[[ModuleType], None] = run) -> None:
                    run(module)
                    patch = _PENDING.pop(fullname, None)
                    if patch is not None:
                        patch(module)

                spec.loader.exec_module = exec_module  # type: ignore[method-assign]
                return spec
        return None


def install_hooks() -> list[str]:
    """Schedule (or apply, for already imported modules) the hooks of the module docstring; idempotent.

    Returns the verl modules hooked. A module that is never imported (e.g. the v1 trainer on an
    install without TransferQueue) is simply never patched. With the actor extension's switch on
    (verl_actor.SWITCH), verl's FSDP engine is hooked too (ACTOR_HOOK_TARGETS).
    """
    targets = {**HOOK_TARGETS, **(ACTOR_HOOK_TARGETS if verl_actor.enabled() else {})}
    for name, patch in targets.items():
        module = sys.modules.get(name)
        if module is not None:
            patch(module)
        else:
            _PENDING[name] = patch
    if _PENDING and not any(isinstance(f, _PostImportPatcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportPatcher())
    return list(targets)


def _register_all() -> None:
    """One estimator per recipe and per credit method that is not a recipe; one loss per trace kernel."""
    for name in known_names():
        try:
            register_estimator(f"tc_{slug(name)}", name)
        except ConfigError as err:  # a recipe whose credit method is not registered in this build
            log.warning("tokencredit: estimator tc_%s not registered: %s", slug(name), err)
    for kernel in objectives.KERNELS:
        if kernel in ENGINE_KERNELS:
            continue
        params = dict(RECIPES[kernel].kernel_params) if kernel in RECIPES else {}
        register_loss(f"tc_{slug(kernel)}", kernel, **params)


def estimator_spec(verl_name: str) -> Recipe:
    """The resolved recipe behind a registered tc_ estimator (for docs and tests)."""
    try:
        return ESTIMATORS[verl_name]
    except KeyError:
        raise ConfigError(f"no tokencredit estimator {verl_name!r}{closest(verl_name, ESTIMATORS)}") from None


_register_all()
HOOKED = install_hooks()

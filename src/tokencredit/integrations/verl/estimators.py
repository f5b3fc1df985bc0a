"""tokencredit's credit pipeline as verl advantage estimators (``tc_<recipe>`` / ``tc_<method>``)."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor
from verl import DataProto
from verl.trainer.ppo import core_algos

from tokencredit import objectives
from tokencredit.batch import MC_SIGNALS
from tokencredit.builder import needs_of
from tokencredit.errors import ConfigError, closest
from tokencredit.integrations._common import slug
from tokencredit.integrations.verl.batch import SIGNAL_KEYS, batch_from_dataproto, first_key
from tokencredit.models import special_token_ids
from tokencredit.recipes import Recipe, resolve, token_credit, zero_outside

__all__ = ["ESTIMATORS", "cfg_value", "estimator_spec", "register_estimator", "uses_keep"]

ESTIMATORS: dict[str, Recipe] = {}  # verl estimator name -> resolved recipe


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


# ---------------------------------------------------------------------------------------------- estimators
def cfg_value(config: Any, key: str, default: Any) -> Any:
    if config is None:
        return default
    getter = getattr(config, "get", None)
    value = getter(key, default) if callable(getter) else getattr(config, key, default)
    return default if value is None else value


def needs_sampled_values(recipe: Recipe) -> bool:
    """True for recipes whose credit reads Monte-Carlo values (oracle, vineppo): no tc_ estimator for them."""
    return bool(needs_of(recipe).sampled)


def uses_keep(recipe: Recipe) -> bool:
    return recipe.uses_ratio and objectives.get_kernel(recipe.kernel).uses_keep


def _make_estimator(verl_name: str, spec: Recipe) -> Callable[..., tuple[Tensor, Tensor]]:
    needs = needs_of(spec)

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
                f"{', ' + ', '.join(sorted(needs.forward)) if needs.forward else ''}); tokencredit's compute_advantage "
                "hook passes it. The hook is installed when tokencredit.integrations.verl is imported "
                "(automatically through verl's plugin entry point, or VERL_USE_EXTERNAL_MODULES) and covers verl's PPO trainers "
                "(v1 and legacy); this call came from another code path"
            )
        ctx = _CONTEXT.get()
        _fetch_missing(data, needs.forward, ctx)
        batch = batch_from_dataproto(
            data, needs, token_level_rewards=token_level_rewards, response_mask=response_mask,
            who=f"verl estimator {verl_name!r}",
        )  # fmt: skip
        special = ctx.special_ids if ctx is not None and ctx.special_ids else _LEGACY_SPECIAL_IDS[0]
        # A credit method on its own uses verl's own GRPO settings (eps 1e-6, norm_adv_by_std_in_grpo).
        baseline = "grpo" if bool(cfg_value(config, "norm_adv_by_std_in_grpo", True)) else "dr-grpo"
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
    if "entropy" in needs and first_key(data, SIGNAL_KEYS["entropy"]) is None:
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
    if needs_sampled_values(spec):
        raise ConfigError(
            f"{credit!r} reads Monte-Carlo values of the policy's prefixes ({', '.join(MC_SIGNALS)}), which verl's "
            "trainer does not sample; use tokencredit's own trainer"
        )
    fn = _make_estimator(verl_name, spec)
    existing = core_algos.ADV_ESTIMATOR_REGISTRY.get(verl_name)
    if existing is not None and getattr(existing, "tokencredit_spec", None) is not None:
        core_algos.ADV_ESTIMATOR_REGISTRY.pop(verl_name)  # re-registration of our own name (module reload)
    core_algos.register_adv_est(verl_name)(fn)
    ESTIMATORS[verl_name] = spec
    return fn



def estimator_spec(verl_name: str) -> Recipe:
    """The resolved recipe behind a registered tc_ estimator (for docs and tests)."""
    try:
        return ESTIMATORS[verl_name]
    except KeyError:
        raise ConfigError(f"no tokencredit estimator {verl_name!r}{closest(verl_name, ESTIMATORS)}") from None


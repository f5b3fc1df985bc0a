"""tokencredit's credit pipeline as verl advantage estimators (``tc_<recipe>`` / ``tc_<method>``)."""

from __future__ import annotations

import contextvars
import re
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor
from verl import DataProto
from verl.trainer.ppo import core_algos

from tokencredit import advantages, diagnostics, objectives
from tokencredit.batch import MC_SIGNALS, RolloutBatch
from tokencredit.builder import Needs, needs_of
from tokencredit.errors import ConfigError, closest
from tokencredit.integrations.verl import actor, rollouts
from tokencredit.integrations.verl.actor.reductions import REDUCTIONS
from tokencredit.integrations.verl.batch import SIGNAL_KEYS, batch_from_dataproto, first_key
from tokencredit.models import special_token_ids
from tokencredit.recipes import Recipe, TokenCredit, resolve, token_credit, zero_outside

__all__ = [
    "ESTIMATORS",
    "METRICS_KEY",
    "cfg_value",
    "credit_metrics",
    "estimator_spec",
    "register_estimator",
    "slug",
    "uses_keep",
    "worker_advantages",
]

ESTIMATORS: dict[str, Recipe] = {}  # verl estimator name -> resolved recipe
# DataProto.meta_info key under which an estimator leaves its credit diagnostics for verl's step log.
METRICS_KEY = "tokencredit_metrics"
_ADV_TOL = 1e-5  # DelTA: |A here - A the workers used| allowed (the same float32 computation, twice)


# ---------------------------------------------------------------------------------------------- step context
@dataclass
class _StepContext:
    """What the trainer-level hooks know about the step whose advantages are being computed."""

    special_ids: tuple[int, ...] | None = None
    fetch: Callable[[list[str]], dict[str, Tensor]] | None = None  # v1: fields from the TransferQueue
    has_entropy: bool = False  # v1: the TransferQueue holds the old policy's entropy (for the diagnostics)
    metrics: dict[str, float] | None = None  # v1: the estimator's credit diagnostics, for the step's metrics
    tokenizer: Any = None  # v1: the trainer's tokenizer and global step (saved rollouts)
    step: int | None = None
    fetch_rows: Callable[[list[str]], dict[str, list[Tensor]]] | None = None  # v1: unpadded rows (prompts)


_CONTEXT: contextvars.ContextVar[_StepContext | None] = contextvars.ContextVar("tc_verl_step", default=None)
# The legacy trainer's tokenizer special ids (set by its hook in the driver process).
_LEGACY_SPECIAL_IDS: list[tuple[int, ...] | None] = [None]
# The legacy trainer itself (a weak reference, set by the same hook): its tokenizer and global step, read
# when rollouts are saved.
_LEGACY_TRAINER: list[weakref.ref[Any] | None] = [None]


def slug(name: str) -> str:
    """The identifier-style name of a recipe or credit method in verl's registries (``tc_<slug>``):
    'dapo+ktae' -> 'dapo_ktae', 'entropy-80-20' -> 'entropy_80_20', 'reinforce++' -> 'reinforce_pp' (so it
    does not read as plain REINFORCE)."""
    return re.sub(r"[^0-9A-Za-z]+", "_", name.replace("++", "_pp")).strip("_").lower()


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


def needs_critic_values(recipe: Recipe) -> bool:
    """True for recipes whose advantage reads a learned critic's values (ppo, bpco): verl trains its own critic
    (algorithm.adv_estimator=gae), so no tc_ estimator is registered for them."""
    return "values" in needs_of(recipe).fields


def uses_keep(recipe: Recipe) -> bool:
    return recipe.uses_ratio and objectives.get_kernel(recipe.kernel).uses_keep


def _recipe(spec: Recipe, config: Any) -> Recipe:
    """The recipe an estimator runs: a credit method on its own uses verl's GRPO settings (eps 1e-6,
    norm_adv_by_std_in_grpo False: Dr.GRPO's mean-only baseline); a table recipe keeps its own baseline."""
    baseline = "grpo" if bool(cfg_value(config, "norm_adv_by_std_in_grpo", True)) else "dr-grpo"
    return spec.with_method_baseline(baseline)


def worker_advantages(verl_name: str, data: DataProto, config: Any) -> Tensor:
    """DelTA's sequence advantages A [bs] float32 for the workers, before the old-log-prob step.

    `data` is the legacy trainer's batch at that step, whose ``rm_scores`` are the rewards (``fit``'s
    ``extract_reward``), ``uid`` the groups; `config` verl's ``algorithm`` config. The baseline is the one
    the estimator uses at the advantage step (`_recipe`), on the batch `batch_from_dataproto` builds there;
    the estimator checks that both agree.
    """
    spec = estimator_spec(verl_name)
    who = f"verl estimator {verl_name!r} (DelTA's advantages for the workers)"
    if bool(cfg_value(config, "use_kl_in_reward", False)):
        raise ConfigError(
            f"{who}: algorithm.use_kl_in_reward=True subtracts a KL penalty from the rewards after the old-log-prob "
            "step, where the workers compute DelTA's coefficients from the advantages; use the KL loss instead "
            "(actor_rollout_ref.actor.use_kl_loss=True, algorithm.use_kl_in_reward=False)"
        )
    if "rm_scores" not in data.batch.keys():
        raise ConfigError(f"{who}: the batch has no 'rm_scores' (the rewards) at the old-log-prob step")
    recipe = _recipe(spec, config)
    estimator = advantages.get_estimator(recipe.advantage)
    if estimator.needs:
        raise ConfigError(
            f"{who}: advantage estimator {recipe.advantage!r} reads {', '.join(sorted(estimator.needs))}, which "
            "verl computes in the old-log-prob step itself; DelTA's workers need A before it"
        )
    rewards = data.batch["rm_scores"]
    batch = batch_from_dataproto(
        data,
        Needs(fields=needs_of(spec).fields),
        token_level_rewards=rewards,
        response_mask=data.batch["response_mask"],
        who=who,
    )
    adv = advantages.estimate(recipe.advantage, batch, **recipe.advantage_params)
    if adv.dim() != 1:
        raise ConfigError(
            f"{who}: DelTA assigns a sequence advantage A [N]; {recipe.advantage!r} gives A [N,T]"
        )
    return adv.detach().float().cpu()


def credit_metrics(
    token_advantages: Tensor, mask: Tensor, seq_advantages: Tensor, entropy: Tensor | None = None
) -> dict[str, float]:
    """verl step-log metrics of one batch's credit (``tokencredit/<name>``): `tokencredit.diagnostics.summary`
    (credit Gini, effective-token ratio, sign flips; with the entropy, the share of |Â| on the top-20%
    entropy tokens and the sign x entropy quadrants) and Â's min / max over the valid tokens."""
    tok, m = token_advantages.detach().float().cpu(), mask.bool().cpu()
    ent = None if entropy is None else entropy.detach().float().cpu()
    out = diagnostics.summary(tok, m, seq_advantages.detach().float().cpu(), ent)
    valid = tok[m]
    out["adv_min"] = float(valid.min()) if valid.numel() else 0.0
    out["adv_max"] = float(valid.max()) if valid.numel() else 0.0
    return {f"tokencredit/{k}": float(v) for k, v in out.items()}


def _check_sent_advantages(data: DataProto, seq_adv: Tensor, who: str) -> None:
    """DelTA's workers computed c~ for the A the driver sent before the old-log-prob step: it must be this A."""
    sent = data.batch[actor.SEQ_ADV] if actor.SEQ_ADV in data.batch.keys() else None
    if sent is None:
        raise ConfigError(
            f"{who}: the batch has DelTA's coefficients but not the advantages the workers used"
        )
    sent = sent.to(device=seq_adv.device, dtype=torch.float32)
    if sent.shape != seq_adv.shape or not torch.allclose(sent, seq_adv, rtol=_ADV_TOL, atol=_ADV_TOL):
        diff = float((sent - seq_adv).abs().max()) if sent.shape == seq_adv.shape else float("nan")
        raise ConfigError(
            f"{who}: the sequence advantages at the advantage step differ from the ones the workers computed "
            f"DelTA's coefficients with at the old-log-prob step (max |diff| {diff:.3g}): the rewards changed in "
            "between (algorithm.use_kl_in_reward=True, a reward shaping or filtering step); DelTA in the workers "
            "needs the final rewards before the old-log-prob step"
        )


def _entropy_for_metrics(data: DataProto, batch: RolloutBatch, ctx: _StepContext | None) -> Tensor | None:
    if batch.entropy is not None:
        return batch.entropy
    if ctx is not None and ctx.fetch is not None and ctx.has_entropy:
        _fetch_missing(data, {"entropy"}, ctx)
    key = first_key(data, SIGNAL_KEYS["entropy"])
    return None if key is None else data.batch[key].float()


def _make_estimator(verl_name: str, spec: Recipe) -> Callable[..., tuple[Tensor, Tensor]]:
    needs = needs_of(spec)
    reduction = REDUCTIONS.get(spec.credit)

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
        who = f"verl estimator {verl_name!r}"
        # The actor extension's workers send a reduction of the hidden states, never the states themselves: the
        # batch carries it as the core's reduced signal, which the credit method reads in their place.
        reduced = reduction if reduction is not None and reduction.key in data.batch.keys() else None
        step_needs = needs
        if reduced is not None:
            step_needs = replace(needs, forward=(needs.forward - set(reduced.replaces)) | {reduced.signal})
        _fetch_missing(data, step_needs.forward, ctx)
        batch = batch_from_dataproto(
            data, step_needs, token_level_rewards=token_level_rewards, response_mask=response_mask, who=who
        )
        special = ctx.special_ids if ctx is not None and ctx.special_ids else _LEGACY_SPECIAL_IDS[0]
        tc = token_credit(_recipe(spec, config), batch, special_ids=special)
        if reduced is not None and reduced.sends_advantages:
            _check_sent_advantages(data, tc.seq_advantages, who)
        # The kept set (S-trace) travels to the paired loss in the advantages: 0 outside it.
        tok = zero_outside(tc.token_advantages, tc.keep)
        metrics = credit_metrics(tok, batch.mask, tc.seq_advantages, _entropy_for_metrics(data, batch, ctx))
        data.meta_info[METRICS_KEY] = metrics  # legacy trainer: merged into the step log (hooks)
        if ctx is not None and ctx.metrics is not None:
            ctx.metrics.update(metrics)  # v1 trainer: its _compute_advantage's metrics
        saving = rollouts.saving_from_env()
        if saving is not None:
            _save_rollouts(saving, data, batch, tc, tok, ctx)
        tok = tok.to(device=token_level_rewards.device)
        return tok, tok.clone()

    estimator.__name__ = f"tokencredit_{slug(verl_name)}"
    estimator.__qualname__ = estimator.__name__
    estimator.tokencredit_spec = spec  # type: ignore[attr-defined]
    return estimator


def _save_rollouts(
    saving: rollouts.RolloutSaving,
    data: DataProto,
    batch: RolloutBatch,
    tc: TokenCredit,
    tok: Tensor,
    ctx: _StepContext | None,
) -> None:
    """`rollouts.save_rollouts` at the trainer's global step when it is due: the tokenizer and step from the v1
    trainer's step context or the legacy trainer (recorded at its old-log-prob step); the prompts from the batch,
    or from the v1 trainer's TransferQueue."""
    if ctx is not None and ctx.step is not None:
        tokenizer, step = ctx.tokenizer, ctx.step
    else:
        trainer = _LEGACY_TRAINER[0]() if _LEGACY_TRAINER[0] is not None else None
        if trainer is None or getattr(trainer, "global_steps", None) is None:
            raise ConfigError(
                f"{rollouts.SAVE_ENV} is set, but this advantage computation came from no verl trainer tokencredit "
                "hooks (the legacy trainer is seen at its old-log-prob step, which "
                "algorithm.rollout_correction.bypass_mode skips; the v1 trainer at its _compute_advantage): unset it"
            )
        tokenizer, step = getattr(trainer, "tokenizer", None), int(trainer.global_steps)
    if not saving.due(step):
        return
    if tokenizer is None:
        raise ConfigError(
            f"{rollouts.SAVE_ENV} is set, but the verl trainer has no tokenizer to write the texts with"
        )
    prompts = rollouts.prompt_ids(data)
    if prompts is None and ctx is not None and ctx.fetch_rows is not None:
        prompts = [row.tolist() for row in ctx.fetch_rows(["prompts"])["prompts"]]
    if prompts is None:
        raise ConfigError(
            f"{rollouts.SAVE_ENV}: the batch has no 'prompts' (prompt token ids) to save with the rollouts"
        )
    rollouts.save_rollouts(saving, step, data, batch, tc, tok, tokenizer, prompts)


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
    if needs_critic_values(spec):
        raise ConfigError(
            f"{credit!r} reads a learned critic's values (advantage estimator {spec.advantage!r}); verl trains its "
            "own critic: use verl's algorithm.adv_estimator=gae (with its critic.* settings), not a tc_ estimator"
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

"""verl plugin: tokencredit's token credit as verl advantage estimators and policy losses.

No set-up: installing tokencredit registers it in verl's ``verl.plugins`` entry-point group
(`tokencredit.integrations.verl.plugin`), which verl loads at ``import verl`` in the driver and in
every Ray worker. ``VERL_USE_EXTERNAL_MODULES=tokencredit.integrations.verl`` keeps working: importing
this package (or any module in it) loads the plugin once (verl's compat patch, then `register`) and hands
on `register`'s names. Then select ``algorithm.adv_estimator=tc_<name>`` and, for the trace kernels,
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
touches verl) supplies them by the least invasive routes of docs/integrations.md, patching each
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
negative-prompt pass) come from the actor extension, `tokencredit.integrations.verl.actor`, switched
on by ``TOKENCREDIT_VERL_ACTOR_SIGNALS=1`` (driver and Ray workers; legacy trainer): it hooks verl's
FSDP engine and the legacy trainer's ``_compute_old_log_prob``, so the old-log-prob step also
returns exactly what the selected estimator needs. Hidden states stay in the workers: for DelTA
they return the coefficients c~ (``tc_delta_coef``, computed with batch statistics summed over the
data-parallel ranks from the sequence advantages the driver sends, ``tc_seq_adv``), for ARCA the
adapter residual norms (``tc_adapter_residual``); the estimator reads those [bs, T] values as the core's
reduced signals (``delta_coefficients``, ``adapter_residual``), which the credit methods take in place of
the hidden states, so Â comes from the one pipeline (`tokencredit.recipes.token_credit`); for DelTA it
checks that the A of that pipeline is the A the workers used. Without them those estimators raise
a `ConfigError` naming the switch. The S-trace loss reads its kept token set from the advantages
(see `register_loss`).

Each estimator also leaves its credit diagnostics (`estimators.credit_metrics`: credit Gini,
effective-token ratio, share of |Â| on high-entropy tokens, Â min / max, as ``tokencredit/<name>``)
for verl's step log: the legacy trainer's ``compute_data_metrics`` and the v1 trainer's
``_compute_advantage`` metrics are hooked to carry them. With ``TOKENCREDIT_VERL_SAVE_ROLLOUTS=DIR`` (and
``TOKENCREDIT_VERL_SAVE_ROLLOUTS_EVERY=N``) it also saves every N steps the batch's rollouts with their Â
for ``tokencredit explain`` / ``probe`` (`rollouts`).

Modules: `plugin` (the entry point: the compat patch, then `register`, or a warning saying why not),
`register` (the version check, the registrations, the hooks installed), `compat` (the verl versions
accepted; verl 0.9.1 next to TRL 1.x), `batch` (DataProto -> RolloutBatch), `estimators` (the ``tc_``
estimators), `losses` (the ``tc_`` policy losses), `hooks` (the patches of verl's trainers, applied by
`import_hooks` right after each target module is first imported), `rollouts` (the saved rollouts),
`actor` (the actor extension) and `local` (verl's real trainer on a CPU).
"""

# The plugin first: if the registration cannot load, the entry point's module warns why (verl itself
# would swallow the error); the import of `register` below then raises it.
from tokencredit.integrations.verl import plugin  # noqa: F401  (registers on import)
from tokencredit.integrations.verl.register import (
    ACTOR_HOOK_TARGETS,
    ESTIMATORS,
    HOOK_TARGETS,
    LOSSES,
    SIGNAL_KEYS,
    SUPPORTED_VERSIONS,
    batch_from_dataproto,
    check_version,
    estimator_spec,
    install_hooks,
    register_all,
    register_estimator,
    register_loss,
)

__all__ = [
    "ACTOR_HOOK_TARGETS",
    "ESTIMATORS",
    "HOOK_TARGETS",
    "LOSSES",
    "SIGNAL_KEYS",
    "SUPPORTED_VERSIONS",
    "batch_from_dataproto",
    "check_version",
    "estimator_spec",
    "install_hooks",
    "register_all",
    "register_estimator",
    "register_loss",
]

"""Plugins that run tokencredit's credit methods inside other RL engines.

- `tokencredit.integrations.verl` (extra ``tokencredit[verl]``): advantage estimators ``tc_*`` and
  policy losses ``tc_ptrace`` / ``tc_strace`` in verl's registries, loaded by verl's ``verl.plugins``
  entry point (`tokencredit.integrations.verl.plugin`) or through
  ``VERL_USE_EXTERNAL_MODULES=tokencredit.integrations.verl``; with the actor extension
  (`tokencredit.integrations.verl.actor`) and verl's real trainer on a CPU
  (`tokencredit.integrations.verl.local`).
- `tokencredit.integrations.trl` (extra ``tokencredit[trl]``): ``CreditGRPOTrainer``, a TRL
  ``GRPOTrainer`` that trains on (B, T) token advantages from any credit method or recipe.
- `tokencredit.integrations.engines`: what both plugins assume of their engine (the ratio kernels its
  own losses implement, the version check).

Neither plugin is imported here, so ``import tokencredit`` never needs verl or TRL.
See docs/integrations.md.
"""

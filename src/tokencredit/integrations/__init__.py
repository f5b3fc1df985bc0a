"""Plugins that run tokencredit's credit methods inside other RL engines.

- `tokencredit.integrations.verl` (extra ``tokencredit[verl]``): advantage estimators ``tc_*`` and
  policy losses ``tc_ptrace`` / ``tc_strace`` in verl's registries, loaded through
  ``VERL_USE_EXTERNAL_MODULES=tokencredit.integrations.verl``.
- `tokencredit.integrations.trl` (extra ``tokencredit[trl]``): ``CreditGRPOTrainer``, a TRL
  ``GRPOTrainer`` that trains on (B, T) token advantages from any credit method or recipe.

Neither submodule is imported here, so ``import tokencredit`` never needs verl or TRL.
See docs/integrations.md.
"""

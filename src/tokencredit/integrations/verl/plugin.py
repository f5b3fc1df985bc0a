"""Entry point of verl's plugin group: ``pip install tokencredit`` is all a verl user needs.

verl 0.9 imports every entry point of the ``verl.plugins`` group at ``import verl``, in every process
(the driver and each Ray worker). tokencredit's pyproject.toml declares this module there. Importing it
(Python runs the package's ``__init__`` first, which imports this module before anything else) applies
`tokencredit.integrations.verl.compat` (verl 0.9.1's model patching imports a TRL class that TRL 1.x
removed, which stops verl's actor worker when ``tokencredit[trl]`` is installed), then imports
`tokencredit.integrations.verl.register`, which checks verl's version, registers the ``tc_`` estimators
and policy losses and installs the hooks. ``VERL_USE_EXTERNAL_MODULES=tokencredit.integrations.verl``
keeps working (the modules are imported once either way). verl swallows an entry point's exception (it
logs it at debug level), so a plugin that cannot load, e.g. next to an unsupported verl version, says why
here with a warning instead of leaving ``algorithm.adv_estimator=tc_ktae`` to fail as an unknown name.
Set ``VERL_USE_EXTERNAL_PLUGINS=none`` (verl's switch) to load no entry-point plugin at all.
"""

from __future__ import annotations

import warnings

from tokencredit.integrations.verl.compat import install_trl_value_head_check

try:
    install_trl_value_head_check()  # verl 0.9.1's actor start-up fails next to TRL 1.x without it
    from tokencredit.integrations.verl import register  # noqa: F401  (registers on import)
except ImportError as err:
    warnings.warn(
        f"tokencredit's verl plugin is not loaded, so no tc_ estimator or loss is registered: {err}",
        RuntimeWarning,
        stacklevel=1,
    )

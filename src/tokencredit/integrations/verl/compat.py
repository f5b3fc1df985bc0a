"""Compatibility with verl's releases: the range tokencredit accepts, and one fix for verl 0.9.1 next to TRL 1.x.

`VERL_VERSIONS` is the one range of verl releases that the plugin (`tokencredit.integrations.verl.register`)
and the CPU dry run (`tokencredit.integrations.verl.local`) are tested with and accept; each checks it at
import, before any verl-internal module is imported.

verl 0.9.1 next to TRL 1.x: answer verl's ``is_trl_available`` for the class verl actually imports.
verl's model patching (``verl.models.transformers.monkey_patch.apply_monkey_patch``, run for every
model its FSDP engine builds) imports TRL's ``AutoModelForCausalLMWithValueHead`` whenever
``is_trl_available()``; TRL 1.x removed that class, so with ``tokencredit[trl,verl]`` installed the
import fails and the actor worker dies at start-up. `install_trl_value_head_check` makes the check
say whether the class exists (it only patches the value-head model's ``state_dict``, which a run
without one never needs). Applied by the ``verl.plugins`` entry point (`tokencredit.integrations.verl.plugin`)
and by `tokencredit.integrations.verl.local`; idempotent. Importing this module imports no verl module.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable

__all__ = ["VERL_VERSIONS", "install_trl_value_head_check", "value_head_check"]

# The verl releases the plugin and verl.local are tested with (0.9.1) and accept (one range for both).
VERL_VERSIONS = ">=0.9,<0.10"

# verl modules that import the name at their import time (they keep the function they saw then).
_HOLDERS = ("verl.utils.import_utils", "verl.utils.model", "verl.models.transformers.monkey_patch")


def value_head_check(original: Callable[[], bool]) -> Callable[[], bool]:
    """`original` (verl's "is trl importable") and TRL has AutoModelForCausalLMWithValueHead."""
    if getattr(original, "tokencredit_hook", False):
        return original

    @functools.wraps(original)
    def is_trl_available() -> bool:
        if not original():
            return False
        for module in ("trl.experimental.ppo", "trl"):
            try:
                if hasattr(importlib.import_module(module), "AutoModelForCausalLMWithValueHead"):
                    return True
            except ImportError:
                continue
        return False

    is_trl_available.tokencredit_hook = True  # type: ignore[attr-defined]
    return is_trl_available


def install_trl_value_head_check() -> None:
    """Replace ``is_trl_available`` in verl's import_utils and in the verl modules already holding it."""
    import verl.utils.import_utils  # noqa: F401  (modules imported later take the patched function from here)

    for name in _HOLDERS:
        module = sys.modules.get(name)
        if module is not None:
            module.is_trl_available = value_head_check(module.is_trl_available)

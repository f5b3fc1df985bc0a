"""Run a callback right after a module's code executes (or at once if it already has): how the verl
plugin patches verl's trainers (`hooks`) and `tokencredit.integrations.verl.local` registers its rollout
backend without importing those modules itself, so ``import verl`` stays light in the driver and in every
Ray worker.

One meta-path finder wraps the loader of each pending module once; `PENDING` holds the callbacks.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["PENDING", "PostImportPatcher", "when_imported"]

# module name -> the callback run right after the module executes
PENDING: dict[str, Callable[[ModuleType], None]] = {}


class PostImportPatcher(importlib.abc.MetaPathFinder):
    """Finds a pending module with the other finders and wraps its loader's exec_module so that the
    module's callback runs right after its code (the callback is removed from `PENDING` first)."""

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in PENDING:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                run = spec.loader.exec_module

                def exec_module(module: ModuleType, run: Callable[[ModuleType], None] = run) -> None:
                    run(module)
                    callback = PENDING.pop(fullname, None)
                    if callback is not None:
                        callback(module)

                spec.loader.exec_module = exec_module  # type: ignore[method-assign]
                return spec
        return None


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """`callback(module)` now if `name` is imported, else right after it first executes; callbacks for
    the same module run in the order given, and the same callback given again is not added twice."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    before = PENDING.get(name)
    if before is callback:
        return
    if before is None:
        PENDING[name] = callback
    else:

        def both(m: ModuleType, first: Callable = before, second: Callable = callback) -> None:
            first(m)
            second(m)

        PENDING[name] = both
    if not any(isinstance(f, PostImportPatcher) for f in sys.meta_path):
        sys.meta_path.insert(0, PostImportPatcher())

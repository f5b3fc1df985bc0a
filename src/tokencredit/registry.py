"""Named registries of pure functions (estimators, credit methods, ratio kernels, losses).

One owner for the rules every registry of the core follows: a name is registered once; an
unknown name or an unknown parameter is a `ConfigError` that names the closest valid one; a
function's hyperparameters are its keyword defaults, read from its signature, so a parameter
cannot be documented in one place and read in another.

Entries register themselves when their module is imported (a decorator such as
`tokencredit.credit.register`). A package that holds a registry imports all of its own public
modules with `import_submodules` (sorted by name, so the registration order is fixed), so a new
module is picked up without being added to any list. `Registry.temporary` registers entries for
the length of a `with` block (tests, docs/extending.md) and restores the registry afterwards.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Generic, Protocol, TypeVar

from tokencredit.errors import ConfigError, closest


class Entry(Protocol):
    """What a registry holds: a name and the defaults of its hyperparameters.

    Both are read-only properties, so a frozen dataclass (a field) and a class computing `defaults`
    (a property, as `objectives.Kernel`) both satisfy it; a plain attribute here would demand a
    settable one, which no frozen entry has.
    """

    @property
    def name(self) -> str: ...

    @property
    def defaults(self) -> Mapping[str, Any]: ...


E = TypeVar("E", bound=Entry)


def keyword_defaults(fn: Callable[..., Any], skip: int) -> dict[str, Any]:
    """{name: default} of `fn`'s parameters after the first `skip` (its tensor inputs).

    A parameter without a default after the tensor inputs is a registration error: every
    hyperparameter needs a documented default.
    """
    params = list(inspect.signature(fn).parameters.values())[skip:]
    out: dict[str, Any] = {}
    for p in params:
        if p.kind in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL):
            continue
        if p.default is inspect.Parameter.empty:
            raise ValueError(f"{fn.__qualname__}: hyperparameter {p.name!r} has no default")
        out[p.name] = p.default
    return out


def import_submodules(package: str, path: Iterable[str], skip: Iterable[str] = ()) -> list[ModuleType]:
    """Import every public module of `package` (its `__path__` is `path`), sorted by name.

    A package whose modules register entries calls it as ``import_submodules(__name__, __path__)``
    from its ``__init__``. Modules (and subpackages) whose name starts with an underscore are left
    out, and so are the names in `skip` (the package's own registry module, imported before);
    importing one twice is a no-op.
    """
    left_out = set(skip)
    names = sorted(
        m.name
        for m in pkgutil.iter_modules(list(path))
        if not m.name.startswith("_") and m.name not in left_out
    )
    return [importlib.import_module(f"{package}.{name}") for name in names]


class Registry(Generic[E]):
    """name -> entry, for entries that carry a `name` and their parameters' `defaults`."""

    def __init__(self, kind: str) -> None:
        self.kind = kind  # "credit method", "ratio kernel", ... (used in error messages)
        self._entries: dict[str, E] = {}

    def add(self, entry: E) -> E:
        if entry.name in self._entries:
            raise ValueError(f"{self.kind} {entry.name!r} is already registered")
        self._entries[entry.name] = entry
        return entry

    @contextmanager
    def temporary(self, *entries: E) -> Iterator[Registry[E]]:
        """Register `entries` (and whatever the block registers) only inside the `with` block.

            with CREDIT_METHODS.temporary():
                @register("test-halves", needs=("entropy",))
                def halves(batch, advantages, low=0.5): ...

        On exit the registry holds exactly the entries it held before, in the same order, even when
        the block raises. Entries are checked as by `add` (a taken name is a ValueError).
        """
        saved = dict(self._entries)
        try:
            for entry in entries:
                self.add(entry)
            yield self
        finally:
            self._entries.clear()
            self._entries.update(saved)

    def get(self, name: str) -> E:
        try:
            return self._entries[name]
        except KeyError:
            raise ConfigError(
                f"unknown {self.kind} {name!r}{closest(name, self._entries)}; registered: "
                f"{', '.join(sorted(self._entries))}"
            ) from None

    def check_params(
        self, name: str, params: Mapping[str, Any], allowed: Mapping[str, Any] | None = None
    ) -> None:
        """Raise ConfigError for the first key of `params` that `name` does not take (closest name given).

        `allowed` replaces the entry's own defaults as the set of valid keys (e.g. a kernel's
        parameters plus those of its preparation hook).
        """
        valid = self.get(name).defaults if allowed is None else allowed
        unknown = sorted(set(params) - set(valid))
        if unknown:
            bad = unknown[0]
            raise ConfigError(
                f"{self.kind} {name!r} has no parameter {bad!r}{closest(bad, valid)}; "
                f"its parameters: {', '.join(sorted(valid)) or '(none)'}"
            )

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, name: str) -> E:
        return self._entries[name]

    def items(self) -> Iterator[tuple[str, E]]:
        return iter(self._entries.items())

    def values(self) -> Iterator[E]:
        return iter(self._entries.values())

    def keys(self) -> Iterator[str]:
        return iter(self._entries)

"""Token credit methods: Â [N,T] from a `RolloutBatch` and the group advantages A [N] (or A [N,T]).

`registry` holds the registry and the one entry point (`compute`, `register`, `get`; its docstring
states the contract every method meets); each other module holds methods and registers them on
import: `uniform` (GRPO, Â = A), `arca` (ARCA and its salience baselines), `cw_grpo` (CW-GRPO),
`delta` (DelTA), `entropy` (the 80/20 rule, in the global or PEPO's proximal frame), `gcpo`, `ktae`,
`montecarlo` (oracle, VinePPO), `pepo` (PEPO) and `token_shaping` (entropy-advantage,
advantage-reweighting).

Adding a method is one module: every public module of this package is imported below, sorted by
name (`tokencredit.registry.import_submodules`), so a new ``credit/my_method.py`` whose function is
decorated with ``@register("my-method", ...)`` is registered on ``import tokencredit.credit`` and
usable as ``credit:my-method`` by every engine, with no list to edit.
"""

from tokencredit.credit.registry import CREDIT_METHODS, CreditMethod, compute, get, register, token_view

# `uniform` first, so that every listing of the registry (`tokencredit recipes`, the plugins' names)
# starts with the baseline, as it always has; then the other modules in name order.
from tokencredit.credit.uniform import uniform
from tokencredit.errors import ConfigError
from tokencredit.registry import import_submodules as _import_submodules

__all__ = [
    "CREDIT_METHODS",
    "ConfigError",
    "CreditMethod",
    "compute",
    "get",
    "register",
    "token_view",
    "uniform",
]

_import_submodules(__name__, __path__, skip=("registry",))

"""The credit registry (`tokencredit.credit.registry`): its order, and a method added as one module.

docs/extending.md promises that a credit method is one module: a file under src/tokencredit/credit/
whose function carries ``@register`` is registered on ``import tokencredit.credit`` (the package imports
every public module of itself, sorted by name) and is then usable by name and as ``credit:NAME`` with
no recipe row. The module is written to a temporary folder added to the package's search path in a
fresh interpreter, so the source tree and this process's registry are untouched.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tokencredit import credit

_NEW_MODULE = '''
"""A throwaway method: Â = 2 A (reads the entropy only to declare a signal)."""

from torch import Tensor

from tokencredit.batch import RolloutBatch
from tokencredit.credit.registry import register


@register("my-method", needs=("entropy",), paper="tests/credit/test_registry.py")
def my_method(batch: RolloutBatch, advantages: Tensor, scale: float = 2.0) -> Tensor:
    """Â = scale A on every valid token."""
    batch.signal("entropy", "credit method 'my-method'")
    return scale * advantages[:, None].expand(batch.mask.shape)
'''

_PROBE = """
import importlib.util, json, sys

import torch

spec = importlib.util.find_spec("tokencredit.credit")  # tokencredit.credit is not imported yet
spec.submodule_search_locations.append(sys.argv[1])
package = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = package
spec.loader.exec_module(package)

from tokencredit.batch import RolloutBatch
from tokencredit.builder import needs_of
from tokencredit.recipes import RECIPES, known_names, resolve, token_credit

batch = RolloutBatch(
    token_ids=torch.ones(4, 3, dtype=torch.long),
    mask=torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]]),
    group_ids=torch.tensor([0, 0, 1, 1]),
    scores=torch.tensor([1.0, 0.0, 0.0, 1.0]),
    entropy=torch.rand(4, 3),
)
out = token_credit("credit:my-method", batch)
print(json.dumps({
    "methods": list(package.CREDIT_METHODS),
    "in_table": "my-method" in RECIPES,
    "known": "my-method" in known_names(),
    "kinds": [resolve("credit:my-method").kind, resolve("my-method").kind],
    "needs": sorted(needs_of(resolve("credit:my-method")).forward),
    "doubled": bool(torch.equal(out.token_advantages, 2 * out.seq_advantages[:, None] * batch.mask)),
}))
"""


def test_registered_in_module_order_uniform_first():
    """`uniform` (the baseline) first, then every other module's methods in module name order."""
    modules = [m.fn.__module__ for m in credit.CREDIT_METHODS.values()]
    assert modules[0] == "tokencredit.credit.uniform"
    assert modules[1:] == sorted(modules[1:])
    assert "tokencredit.credit.registry" not in modules


def test_a_new_module_is_registered_and_usable_as_credit_name(tmp_path):
    (tmp_path / "my_method.py").write_text(textwrap.dedent(_NEW_MODULE))
    run = subprocess.run(
        [sys.executable, "-c", _PROBE, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    before = list(credit.CREDIT_METHODS)
    # sorted in by its module name (my_method: after montecarlo's methods, before pepo's and token_shaping's)
    modules = [credit.get(m).fn.__module__.rsplit(".", 1)[-1] for m in before]
    at = next(i for i, m in enumerate(modules) if i > 0 and m > "my_method")
    assert got["methods"] == [*before[:at], "my-method", *before[at:]]
    assert not got["in_table"] and got["known"]
    assert got["kinds"] == ["method", "method"]
    assert got["needs"] == ["entropy"]
    assert got["doubled"]

"""docs/extending.md, walked through with a throwaway credit method and a throwaway policy loss.

"test-halves" (one hyperparameter, one declared signal) is the guide's own example of step (a), read from
docs/extending.md and run as written (so the page cannot drift from what works), and "test-soft-clip" is
registered with the package's own decorator, both only inside `Registry.temporary` blocks, and the recipe row of
"test-halves" only for the test (`monkeypatch`), as a contributor would add them in
src/tokencredit/credit/ and src/tokencredit/recipes/table.py. Each test checks what the guide
promises: the name is listed (registry, `known_names`, `tokencredit recipes`), an unknown parameter
names the closest one, the `needs` reach the batch builder, the method meets the fuzz contract of
every built-in method (tests/credit/test_credit_fuzz.py) and gives the same Â through every engine that
runs in-process (tests/test_engines_agree.py's batch), and the loss meets the objective's contract.
An autouse fixture asserts that every registry and the recipe table are afterwards as before.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from conftest import TESTS
from tokencredit import advantages, credit, objectives
from tokencredit.batch import RolloutBatch
from tokencredit.builder import ScoredRollouts, build_batch, needs_of
from tokencredit.cli import main as cli_main
from tokencredit.errors import ConfigError
from tokencredit.objectives import LossInputs, ObjectiveArgs, effective_credit, policy_loss
from tokencredit.recipes import RECIPES, Recipe, known_names, resolve, token_credit


def _test_module(name: str) -> ModuleType:
    """Another test file's module (its helpers), wherever it lives under tests/, imported once under its name."""
    if name not in sys.modules:
        folder = str(next(TESTS.rglob(f"{name}.py")).parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        importlib.import_module(name)
    return sys.modules[name]


fuzz = _test_module(
    "test_credit_fuzz"
)  # the contract of every credit method: batches(), check_credit_contract
agree = _test_module("test_engines_agree")  # the engines' fixed batch and their glue
fixed, tokenizer = agree.fixed, agree.tokenizer  # module-scoped fixtures, used as they are

HALVES, SOFT_CLIP = "test-halves", "test-soft-clip"


# ---------------------------------------------------------------------------------------------- what is added
def guide_example() -> str:
    """The code of step (a) in docs/extending.md, as a contributor would paste it into a module."""
    text = (TESTS.parent / "docs" / "extending.md").read_text(encoding="utf-8")
    section = text[text.index("## (a) A credit method") : text.index("## (b)")]
    block = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert block is not None, "docs/extending.md step (a) has no Python example"
    return textwrap.dedent(block.group(1))


@contextmanager
def halves_registered() -> Iterator[str]:
    """Step (a) of the guide: its own example module, run as written (the name made a throwaway one),
    registered for the `with` block only."""
    with credit.CREDIT_METHODS.temporary():
        exec(guide_example().replace('"halves"', repr(HALVES)), {"__name__": "halves_example"})
        yield HALVES


@contextmanager
def soft_clip_registered() -> Iterator[str]:
    """Step (b) of the guide: a policy loss, registered for the `with` block only."""
    with objectives.LOSSES.temporary():

        @objectives.register_loss(SOFT_CLIP, uses_ratio=True, per_token=True, paper="docs/extending.md")
        def soft_clip(inputs: LossInputs, scale: float = 2.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            """loss_t = -Â_t tanh(scale (w_t - 1)) / scale: slope 1 at w = 1, bounded by 1 / scale."""
            if scale <= 0:
                raise ConfigError(f"policy loss {SOFT_CLIP!r}: scale must be > 0, got {scale}")
            assert inputs.log_w is not None
            w = torch.exp(inputs.log_w)
            loss = -inputs.advantages * torch.tanh(scale * (w - 1.0)) / scale
            zero = torch.zeros((), dtype=loss.dtype, device=loss.device)
            return torch.where(inputs.mask, loss, zero), {
                "saturated": inputs.mask & (scale * (w - 1).abs() > 2)
            }

        yield SOFT_CLIP


def _registries() -> dict[str, list]:
    regs = {
        "credit": credit.CREDIT_METHODS,
        "loss": objectives.LOSSES,
        "kernel": objectives.KERNELS,
        "estimator": advantages.ESTIMATORS,
    }
    return {**{k: list(r.items()) for k, r in regs.items()}, "recipes": list(RECIPES.items())}


@pytest.fixture(autouse=True)
def registries_restored():
    """Every test leaves each registry and the recipe table exactly as it found them."""
    before = _registries()
    yield
    assert _registries() == before


@pytest.fixture
def halves(monkeypatch):
    """The method and its recipe row (the guide's table step), for one test."""
    with halves_registered() as name:
        row = Recipe(
            name,
            "docs/extending.md (a throwaway example)",
            credit=name,
            credit_params={"low": 0.25},
            eps_high=0.28,
            notes="Â = A x (1 on high-entropy tokens, low elsewhere)",
        )
        monkeypatch.setitem(RECIPES, name, row)
        yield name
    assert name not in credit.CREDIT_METHODS


def _expected(batch: RolloutBatch, low: float) -> torch.Tensor:
    """The rule by hand, on the GRPO advantages."""
    a = advantages.grpo(batch.scores, batch.group_ids)
    out = torch.zeros(batch.mask.shape)
    for i in range(batch.num_rollouts):
        n = int(batch.mask[i].sum())
        if n:
            h = batch.entropy[i, :n].double()
            out[i, :n] = float(a[i]) * torch.where(h >= h.mean(), 1.0, low).float()
    return out


# ---------------------------------------------------------------------------------------------- the credit method
def test_registration_is_temporary():
    with halves_registered():
        assert HALVES in credit.CREDIT_METHODS and HALVES in known_names()
    assert HALVES not in credit.CREDIT_METHODS and HALVES not in known_names()
    with pytest.raises(ConfigError, match=f"unknown credit method '{HALVES}'"):
        credit.get(HALVES)
    with pytest.raises(RuntimeError), halves_registered():  # a failing block restores the registry too
        raise RuntimeError
    copy = dataclasses.replace(credit.get("uniform"), name="test-copy")  # an entry built elsewhere
    with credit.CREDIT_METHODS.temporary(copy):
        assert credit.get("test-copy") is copy
    with pytest.raises(ValueError, match="already registered"), credit.CREDIT_METHODS.temporary(copy, copy):
        pass
    assert "test-copy" not in credit.CREDIT_METHODS


def test_listed_by_the_registry_and_by_tokencredit_recipes(halves, capsys, monkeypatch):
    m = credit.get(halves)
    assert m.needs == frozenset({"entropy"}) and dict(m.defaults) == {"low": 0.5}
    assert not m.token_advantages and not m.requires_lora
    assert halves in known_names() and resolve(halves).credit_params == {"low": 0.25}
    assert resolve(f"credit:{halves}").kind == "method"
    monkeypatch.setenv("COLUMNS", "250")
    assert cli_main(["recipes"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if f" {halves} " in line)
    assert "docs/extending.md" in row and "0.2/0.28" in row
    assert cli_main(["recipes", "-v"]) == 0
    # -v adds each recipe's fields in a row of its own; rich may fold that long cell at any character, so
    # the value itself is checked on the recipe above and here only that the throwaway recipe is listed
    verbose = capsys.readouterr().out
    assert f" {halves} " in verbose and verbose.count("\n") > out.count("\n")


def test_a_method_without_a_recipe_row_is_listed_with_its_parameters(capsys, monkeypatch):
    """Step (a)'s promise: the module alone makes the method visible, with its parameters and defaults."""
    with halves_registered():
        assert HALVES not in RECIPES
        monkeypatch.setenv("COLUMNS", "250")
        assert cli_main(["recipes"]) == 0
        out = capsys.readouterr().out
        row = next(line for line in out.splitlines() if line.lstrip().startswith(f"{HALVES} "))
        assert "low = 0.5" in row and "entropy" in row
        assert cli_main(["recipes", f"credit:{HALVES}"]) == 0
        toml = capsys.readouterr().out
        assert f"# '{HALVES}' takes (defaults): low = 0.5" in toml and f'credit = "{HALVES}"' in toml


def test_unknown_parameter_names_the_closest(halves, fixed):
    batch, _, _ = fixed
    adv = advantages.grpo(batch.scores, batch.group_ids)
    with pytest.raises(ConfigError, match=r"no parameter 'lwo' \(closest: low\)"):
        credit.compute(halves, batch, adv, lwo=0.3)
    with pytest.raises(ConfigError, match=r"'lwo' \(closest: low\)"):
        resolve(f"credit:{halves}", {"credit_params": {"lwo": 0.3}})
    with pytest.raises(ConfigError, match="low must be in"):
        credit.compute(halves, batch, adv, low=2.0)


def test_needs_reach_the_batch_builder(halves, fixed):
    """The declared signal is what `needs_of` asks every engine for, and a batch without it is refused."""
    batch, _, _ = fixed
    assert needs_of(resolve(f"credit:{halves}")).forward == {"entropy"}
    assert needs_of(resolve(halves), objective=True).forward == {"entropy", "old_log_probs"}
    bare = dataclasses.replace(batch, entropy=None)
    with pytest.raises(ValueError, match="entropy"):
        credit.compute(halves, bare, advantages.grpo(bare.scores, bare.group_ids))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fuzz.batches())
def test_meets_the_fuzz_contract_of_every_credit_method(data):
    batch, adv = data
    with halves_registered() as name:
        out = fuzz.check_credit_contract(name, batch, adv)
    signs = torch.sign(adv)[:, None].expand_as(out)  # multiplicative with w > 0 (low = 0.5): keeps A's sign
    nz = batch.mask & (out != 0)
    assert (torch.sign(out)[nz] == signs[nz]).all()


# ---------------------------------------------------------------------------------------------- the engines
def test_core_pipeline_computes_the_rule(halves, fixed):
    batch, special, _ = fixed
    torch.testing.assert_close(
        token_credit(f"credit:{halves}", batch).token_advantages, _expected(batch, 0.5)
    )
    torch.testing.assert_close(
        token_credit(halves, batch, special_ids=special).token_advantages, _expected(batch, 0.25)
    )


def test_an_engine_plugin_through_the_builder(halves, fixed):
    """Step (d): rollouts -> needs_of -> build_batch (signals given, no model) -> token_credit."""
    batch, special, _ = fixed
    recipe = resolve(halves)
    needs = needs_of(recipe)
    rollouts = ScoredRollouts(
        response_ids=batch.token_ids,
        response_mask=batch.mask,
        group_ids=batch.group_ids,
        scores=batch.scores,
        truncated=batch.truncated,
    )
    built = build_batch(
        rollouts, needs, given={s: getattr(batch, s) for s in needs.forward}, who="test engine"
    )
    got = token_credit(recipe, built, special_ids=special)
    agree.assert_same(agree.loss_tokens(got), agree.reference(halves, batch, special), "builder", halves)
    with pytest.raises(ConfigError, match="test engine needs the per-token signal.*entropy"):
        build_batch(rollouts, needs, who="test engine")


@pytest.mark.parametrize("form", ["credit:{}", "{}"])
def test_explain_and_probe_agree_with_the_core(form, halves, fixed, tokenizer):
    from tokencredit import models, probe
    from tokencredit.columns import resolve_methods
    from tokencredit.data.synthetic import ArithmeticTask
    from tokencredit.explain import explain_batch, make_groups

    name = form.format(halves)
    batch, special, _ = fixed
    want = agree.reference(name, batch, special)
    ids = models.special_token_ids(tokenizer)
    seq = token_credit(name, batch, special_ids=special).seq_advantages
    tokens = [[str(int(x)) for x in row[m]] for row, m in zip(batch.token_ids, batch.mask)]
    credits: dict = {}
    data = explain_batch(
        batch,
        resolve_methods([name]),
        make_groups(batch, tokens, seq, groups=agree.N_GROUPS),
        special_ids=ids,
        credits=credits,
    )
    assert not data.methods[0].skipped, data.methods[0].note
    agree.assert_same(agree.loss_tokens(credits[name]), want, "explain", name)

    problems = [p for p in ArithmeticTask(seed=1).sample(agree.N_GROUPS, "heldout") for _ in range(agree.G)]
    truth, _ = probe.build_truth(problems, batch.token_ids, batch.mask, batch.group_ids, tokenizer)
    credits = {}
    res = probe.probe_batch(batch, truth, resolve_methods([name]), special_ids=ids, credits=credits)
    assert res[name]["status"] == "ok", res[name]
    agree.assert_same(agree.loss_tokens(credits[name]), want, "probe", name)


@pytest.mark.extras
def test_trl_agrees_with_the_core(halves, fixed, tiny_model_dir, tmp_path, monkeypatch):
    """The recipe row through the TRL plugin's glue, as tests/test_engines_agree.py runs each table recipe.
    (The verl plugin registers its tc_ estimators once, at import, in verl's own registry, which has no way
    to remove one: a throwaway method is not registered there.)"""
    pytest.importorskip("trl", reason="TRL is not installed (extra tokencredit[trl])")
    import tokencredit.integrations.trl as trl_module

    batch, special, _ = fixed
    trainer = agree._trl_trainer(trl_module, tiny_model_dir, tmp_path, halves)
    trainer.model.train()
    signals = {"entropy": batch.entropy, "old_log_probs": batch.old_log_probs}
    monkeypatch.setattr(trainer, "_signals", lambda *args, **kwargs: dict(signals))
    trainer._tc_rewards = batch.scores[:, None].clone()
    output = {
        "completion_ids": batch.token_ids.clone(),
        "completion_mask": batch.mask.long(),
        "prompt_ids": torch.zeros(agree.N, 1, dtype=torch.long),
        "prompt_mask": torch.ones(agree.N, 1, dtype=torch.long),
    }
    agree.assert_same(
        trainer._token_advantages([], output), agree.reference(halves, batch, special), "TRL", halves
    )


# ---------------------------------------------------------------------------------------------- the policy loss
N, T = 6, 8
MASK = torch.arange(T)[None] < torch.tensor([8, 0, 1, 5, 8, 3])[:, None]


def _log_probs(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(N, T, generator=g, dtype=torch.float64) * 2 - 0.05
    new = (old + 0.3 * torch.randn(N, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    return new.requires_grad_(True), old, torch.randn(N, T, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("kernel", ["token", "gspo", "gspo-token", "ptrace", "grpo-lambda"])
@pytest.mark.parametrize("mode", objectives.AGG_MODES)
def test_loss_meets_the_objective_contract(kernel, mode):
    """Finite loss and gradient under every kernel and aggregation, no gradient and no loss off the mask."""
    with soft_clip_registered() as name:
        log_prob, old, adv = _log_probs(2)
        args = ObjectiveArgs(loss=name, loss_params={"scale": 3.0}, kernel=kernel, loss_agg_mode=mode)
        loss, metrics = policy_loss(log_prob, old, adv, MASK, args)
        (grad,) = torch.autograd.grad(loss, log_prob)
        assert bool(torch.isfinite(loss)) and bool(torch.isfinite(grad).all())
        assert bool((grad[~MASK] == 0).all()) and bool((grad[MASK] != 0).any())
        assert all(v == v for v in metrics.values())
        lr = (log_prob - old).detach()
        per_token, _ = objectives.get_loss(name).fn(LossInputs(log_prob.detach(), adv, MASK, lr, lr, old))
        assert bool((per_token[~MASK] == 0).all())


def test_loss_flags_parameters_and_listing():
    with soft_clip_registered() as name:
        spec = objectives.get_loss(name)
        assert name in objectives.LOSSES and dict(spec.defaults) == {"scale": 2.0}
        # per_token=True tells the truth: at pi = pi_old the gradient weight of token t is Â_t
        g = torch.Generator().manual_seed(1)
        a_hat = torch.randn(N, T, generator=g, dtype=torch.float64) * MASK
        old = -torch.rand(N, T, generator=g, dtype=torch.float64) * 2 * MASK
        got = effective_credit(a_hat, MASK, ObjectiveArgs(loss=name), old_log_probs=old)
        torch.testing.assert_close(got, a_hat.float(), atol=1e-6, rtol=1e-6)
        with pytest.raises(ConfigError, match=r"no parameter 'scal' \(closest: scale\)"):
            ObjectiveArgs(loss=name, loss_params={"scal": 1.0})
        recipe = resolve(Recipe("soft", "docs/extending.md", loss=name, loss_params={"scale": 4.0}))
        assert recipe.objective_args().loss_params["scale"] == 4.0
    assert name not in objectives.LOSSES
    with pytest.raises(ConfigError, match="unknown policy loss"):
        ObjectiveArgs(loss=name)

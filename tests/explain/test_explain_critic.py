"""`tokencredit explain` with a learned critic: a ppo run's trained critic gives the `values` its column reads.

A micro run trained 2 steps with `ppo` on the tiny test model: explain RUN shows the ppo column beside the
default methods, equal to the core pipeline's credit on the saved rollouts with V from the loaded critic
(computed here row by row, unpadded); without a critic the column is skipped saying why; a --critic that has
none is one line.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from test_explain import Page  # the page parser of the explain tests (tests/explain is on the path)

from conftest import TOY_REWARDS_DIR, _micro_sets
from tokencredit import cli
from tokencredit.critic import TrainedCritic
from tokencredit.data.templates import render
from tokencredit.errors import ConfigError
from tokencredit.explain import assemble_batch, load_run_rollouts
from tokencredit.recipes import RECIPES, token_credit
from tokencredit.train.checkpoint import load_run_critic
from tokencredit.train.config import load_config
from tokencredit.train.rundir import RunDir
from tokencredit.train.trainer import Trainer


@pytest.fixture(scope="module")
def ppo_run(tiny_model_dir, tmp_path_factory):
    """A micro run trained 2 steps with ppo (its critic in the checkpoints and in final/critic.pt)."""
    run = tmp_path_factory.mktemp("ppo") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(TOY_REWARDS_DIR))
        cfg = load_config(sets=_micro_sets(tiny_model_dir, 2, **{"eval.save_groups": 2}), recipe="ppo")
        Trainer(cfg, run).fit()
    return run


def _explain(*argv) -> int:
    return cli.main(["explain", *map(str, argv)])


def _unpadded_values(critic: TrainedCritic, run, groups) -> torch.Tensor:
    """V [N,T] of the critic, one row at a time on its own prompt + response ids (no padding)."""
    cfg = RunDir(run).read_config()
    tok = critic.tokenizer
    rows = []
    for g in groups:
        prompt = tok(render(cfg.data.template, g.problem, tok))["input_ids"]
        for c in g.completions:
            seq = torch.tensor([prompt + list(c.token_ids)])
            mask = torch.ones(1, len(c.token_ids), dtype=torch.bool)
            rows.append(critic.values(seq, torch.ones_like(seq), len(prompt), mask)[0])
    width = max(len(r) for r in rows)
    return torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])


def test_final_save_and_checkpoint_hold_the_same_critic(ppo_run):
    rd = RunDir(ppo_run)
    assert rd.has_final_critic()
    final = load_run_critic(ppo_run)
    ckpt = load_run_critic(ppo_run / "checkpoints" / "step_000002.pt")
    assert final.step == ckpt.step == 2 and "final/critic.pt" in final.source
    for (n, a), b in zip(final.model.state_dict().items(), ckpt.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), n
    assert float(final.model.head.weight.abs().sum()) > 0  # trained, not the zero-initialised head


def test_explain_run_shows_the_critics_column(ppo_run, tmp_path):
    out = tmp_path / "e.html"
    assert _explain(ppo_run, "--out", out) == 0  # the default --methods, plus the run's critic column
    page = Page(out.read_text())
    assert "ppo" not in page.skipped and {"uniform", "delta", "ppo"} <= {k[0] for k in page.tokens}
    assert "critic values V: the critic of run" in out.read_text()
    # the core's credit with V from the loaded critic, computed here row by row
    _, groups = load_run_rollouts(ppo_run)
    critic = load_run_critic(ppo_run)
    batch = assemble_batch(groups)
    values = _unpadded_values(critic, ppo_run, groups)
    batch = dataclasses.replace(batch, values=values[:, : batch.mask.shape[1]] * batch.mask)
    eff = token_credit(critic.recipe, batch).effective()
    shown = [(r, t, float(cell["a"])) for (m, r, t), cell in page.tokens.items() if m == "ppo"]
    assert shown and all(torch.isfinite(torch.tensor([a for *_, a in shown])))
    assert max(abs(a) for *_, a in shown) > 1e-3  # non-zero credit
    for r, t, a in shown:
        assert a == pytest.approx(float(eff[r, t]), abs=1e-4)


def test_explain_without_a_critic_skips_the_column(ppo_run, tiny_model_dir, tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_text(
        json.dumps({"problem": "What is 1+2?", "completions": ["3", "4", "12"], "rewards": [1.0, 0.0, 0.0]})
        + "\n"
    )
    out = tmp_path / "j.html"
    assert _explain("--jsonl", f, "--model", tiny_model_dir, "--methods", "uniform,ppo", "--out", out) == 0
    page = Page(out.read_text())
    assert "needs a trained critic" in page.skipped["ppo"] and "--critic RUN" in page.skipped["ppo"]
    # the same file with --critic: the column is computed
    assert _explain("--jsonl", f, "--model", tiny_model_dir, "--critic", ppo_run, "--out", out) == 0
    page = Page(out.read_text())
    assert "ppo" not in page.skipped and any(k[0] == "ppo" for k in page.tokens)


def test_critic_errors_are_one_line(ppo_run, tiny_model_dir, tmp_path, capsys):
    grpo = tmp_path / "grpo"
    grpo.mkdir()
    (grpo / "config.toml").write_text((ppo_run / "config.toml").read_text())
    (grpo / "recipe.json").write_text(json.dumps(RECIPES["grpo"].to_dict()))
    f = tmp_path / "in.jsonl"
    f.write_text(json.dumps({"problem": "1+2?", "completions": ["3", "4"], "rewards": [1.0, 0.0]}) + "\n")
    base = ["--jsonl", f, "--model", tiny_model_dir, "--out", tmp_path / "x.html"]
    assert _explain(*base, "--critic", grpo) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "recipe 'grpo', which has no critic" in err[0] and "ppo / bpco" in err[0]
    assert _explain(*base, "--critic", tmp_path / "nowhere") == 2
    assert "not a tokencredit run directory" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="no saved critic"):
        empty = tmp_path / "empty"
        empty.mkdir()
        (empty / "config.toml").write_text((ppo_run / "config.toml").read_text())
        (empty / "recipe.json").write_text((ppo_run / "recipe.json").read_text())
        load_run_critic(empty)


def test_a_credit_method_beside_a_critic_run_gets_grpos_baseline():
    # a ppo run's estimator (GAE) gives token-level A, which KTAE (defined on a sequence A) cannot take: the
    # method's column gets GRPO's group baseline instead of an error; a method that takes token-level A keeps it
    from tokencredit.columns import resolve_methods

    ppo = RECIPES["ppo"]
    ktae, shaping = resolve_methods(
        ["ktae", "credit:cw-grpo"],
        advantage=ppo.advantage,
        advantage_params=ppo.advantage_params,
        run_recipe=ppo,
    )
    assert ktae.recipe.advantage == "grpo" and ktae.recipe.credit == "ktae"
    assert shaping.recipe.kind == "method" and shaping.recipe.advantage == "gae"

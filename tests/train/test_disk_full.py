"""The run directory's writers on a full disk (issue 22): nothing torn, nothing temporary left,
the previous version intact, an error naming the file. The whole-run cases (a full disk during a
real `tokencredit train`, then `--resume`) are in tests/test_reliability.py."""

from __future__ import annotations

import json

import pytest
import torch

from tokencredit.atomic import atomic_write_text
from tokencredit.errors import DiskFullError
from tokencredit.train import checkpoint as ck
from tokencredit.train.rundir import MetricsLog, RunDir


def _leftovers(root):
    return sorted(p.name for p in root.rglob("*tmp*"))


def test_atomic_write_keeps_the_old_file_and_removes_its_temporary(tmp_path, full_disk):
    path = tmp_path / "summary.json"
    path.write_text('{"old": true}')
    full_disk(tmp_path, "summary.json", partial=4)
    with pytest.raises(
        DiskFullError, match=rf"disk full while writing {path} \(No space left on device\)"
    ) as e:
        atomic_write_text(path, json.dumps({"new": "x" * 100}))
    assert e.value.path == str(path)
    assert path.read_text() == '{"old": true}' and _leftovers(tmp_path) == []


def test_metrics_line_cut_by_a_full_disk_is_removed(tmp_path, full_disk):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.append({"step": 1, "reward": 0.5})
    full_disk(tmp_path, "metrics.jsonl", partial=10)  # 10 bytes of the next line land, then ENOSPC
    with pytest.raises(DiskFullError, match="metrics.jsonl"):
        log.append({"step": 2, "reward": 0.25})
    assert (tmp_path / "metrics.jsonl").read_text() == '{"reward": 0.5, "step": 1}\n'


def _save(root, step):
    torch.manual_seed(step)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return ck.save_checkpoint(root, step, model, opt, sched, keep=2)


@pytest.mark.parametrize("target", ["step_000002.pt", "step_000002.json"])
def test_a_checkpoint_cut_by_a_full_disk_leaves_the_previous_one_newest(
    target, tmp_path, full_disk, monkeypatch
):
    _save(tmp_path, 1)
    disk = full_disk(tmp_path, target, partial=100)
    with pytest.raises(DiskFullError, match=target):
        _save(tmp_path, 2)
    assert RunDir(tmp_path).checkpoint_steps() == [1]  # no .pt without its digest
    assert ck.load_latest_checkpoint(tmp_path, log=pytest.fail)["step"] == 1
    assert _leftovers(tmp_path) == []
    disk.undo()  # space is back
    _save(tmp_path, 2)
    assert ck.load_latest_checkpoint(tmp_path, log=pytest.fail)["step"] == 2


def test_final_model_export_on_a_full_disk_leaves_no_half_written_directory(
    tiny_model_dir, micro_sets, tmp_path, monkeypatch, capsys
):
    """The final export is written by safetensors and the tokenizer, not through the run directory's
    writers: a full disk there also names the directory, removes the partial export, and resumes."""
    import errno

    from transformers import PreTrainedModel

    from tokencredit import cli

    real_save = PreTrainedModel.save_pretrained

    def save_then_fill_the_disk(self, path, **kw):
        real_save(self, path, **kw)  # some files land, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", save_then_fill_the_disk)
    run = tmp_path / "run"
    sets = [a for s in micro_sets(tiny_model_dir) for a in ("--set", s)]
    assert cli.main(["train", "--recipe", "strace", "--out", str(run), *sets]) == 1
    err = capsys.readouterr().err
    assert f"disk full while writing {run}/final (No space left on device)" in err
    assert "last good checkpoint: step 2" in err
    assert not (run / ".final.tmp").exists() and not (run / "final").exists()
    monkeypatch.setattr(PreTrainedModel, "save_pretrained", real_save)  # space is back
    assert cli.main(["train", "--resume", str(run)]) == 0 and (run / "final" / "config.json").is_file()

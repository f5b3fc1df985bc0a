import json

import torch

from tokencredit.train import checkpoint as ck
from tokencredit.train.rundir import MetricsLog


def _setup():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    model.bias.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    sched.step()
    return model, opt, sched


def test_save_restore_roundtrip_and_rng(tmp_path):
    model, opt, sched = _setup()
    ck.save_checkpoint(tmp_path, 5, model, opt, sched, extra={"sampler_cursor": 17})
    want_next = torch.rand(3)
    state = ck.load_latest_checkpoint(tmp_path)
    assert state["step"] == 5 and state["extra"]["sampler_cursor"] == 17
    assert set(state["model"]) == {"weight"}  # only trainable parameters
    m2, o2, s2 = _setup()
    with torch.no_grad():
        m2.weight.zero_()
    assert ck.restore(m2, o2, s2, state) == 5
    torch.testing.assert_close(m2.weight, model.weight)
    assert s2.get_last_lr() == sched.get_last_lr()
    assert torch.equal(torch.rand(3), want_next)  # RNG restored to the moment of saving


def test_corrupt_latest_falls_back_to_previous(tmp_path, capsys):
    model, opt, sched = _setup()
    ck.save_checkpoint(tmp_path, 1, model, opt, sched, keep=3)
    ck.save_checkpoint(tmp_path, 2, model, opt, sched, keep=3)
    p = tmp_path / "checkpoints" / "step_000002.pt"
    p.write_bytes(p.read_bytes()[:-10])  # truncated
    msgs = []
    state = ck.load_latest_checkpoint(tmp_path, log=msgs.append)
    assert state["step"] == 1 and "step_000002" in msgs[0] and "digest mismatch" in msgs[0]
    # a partial write (no digest file) is also skipped
    ck.save_checkpoint(tmp_path, 3, model, opt, sched, keep=3)
    (tmp_path / "checkpoints" / "step_000003.json").unlink()
    assert ck.load_latest_checkpoint(tmp_path, log=msgs.append)["step"] == 1
    assert ck.load_latest_checkpoint(tmp_path / "nothing") is None


def test_keep_prunes_old_checkpoints(tmp_path):
    model, opt, sched = _setup()
    for s in range(1, 5):
        ck.save_checkpoint(tmp_path, s, model, opt, sched, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pt"))
    assert names == ["step_000003.pt", "step_000004.pt"]


def test_metrics_log_truncates_torn_and_later_lines(tmp_path):
    log = MetricsLog(tmp_path / "m.jsonl")
    for s in range(1, 5):
        log.append({"step": s, "reward": s / 10})
    with open(log.path, "a") as f:
        f.write('{"step": 5, "rew')  # torn line from a kill -9
    log.truncate_after(3)
    lines = log.path.read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3]
    log.append({"step": 4})
    assert [r["step"] for r in log.read()] == [1, 2, 3, 4]


def test_temp_files_of_a_killed_writer_are_removed(tmp_path):
    """A kill -9 during a checkpoint write leaves a checkpoint-sized temp file; the next save removes it
    (but never a file the current process is writing) and loading ignores it."""
    model, opt, sched = _setup()
    ck.save_checkpoint(tmp_path, 1, model, opt, sched)
    ckdir = tmp_path / "checkpoints"
    stale = ckdir / ".step_000002.pt.tmp-999999999"
    stale.write_bytes(b"\0" * 1000)
    assert ck.load_latest_checkpoint(tmp_path)["step"] == 1
    ck.save_checkpoint(tmp_path, 2, model, opt, sched)
    assert not stale.exists()
    assert sorted(p.name for p in ckdir.iterdir()) == [
        "step_000001.json",
        "step_000001.pt",
        "step_000002.json",
        "step_000002.pt",
    ]

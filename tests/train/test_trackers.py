"""Experiment trackers (run.report_to): the option's values and errors, the metric names, a tracker that
fails mid-run; then real runs of the micro trainer read back from TensorBoard's event files, wandb's
offline run file and an MLflow file store (marked `extras`: they need tokencredit[tensorboard] etc.)."""

import io
import json
import struct
import sys
import time

import pytest
from rich.console import Console

from tokencredit.errors import ConfigError
from tokencredit.train import trackers
from tokencredit.train.config import load_config, validate_config
from tokencredit.train.rundir import RunDir
from tokencredit.train.trackers import (
    Trackers,
    metric_name,
    mlflow_key,
    parse_report_to,
    require,
    tracker_metrics,
)
from tokencredit.train.trainer import Trainer


def _records(run_dir):
    return RunDir(run_dir).metrics.read()


def _expected(run_dir):
    """{tracker name: [(step, value), ...]} of every numeric field metrics.jsonl holds."""
    out = {}
    for rec in _records(run_dir):
        step, metrics = tracker_metrics(rec)
        for key, value in metrics.items():
            out.setdefault(key, []).append((step, value))
    return out


def _train(tiny_model_dir, micro_sets, run_dir, report_to, steps=2, *, console=None, **extra):
    cfg = load_config(
        sets=micro_sets(tiny_model_dir, steps, **{"run.report_to": report_to, **extra}), recipe="grpo"
    )
    trainer = Trainer(cfg, run_dir, console=console or Console(file=io.StringIO()))
    trainer.fit()
    return trainer


# ---------------------------------------------------------------------- the option
@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("none", []),
        ("tensorboard", ["tensorboard"]),
        ("tensorboard, WandB", ["tensorboard", "wandb"]),
        (["wandb", "mlflow", "wandb"], ["wandb", "mlflow"]),
        (["none"], []),
        ([], []),
        ("all", ["all"]),
    ],
)
def test_report_to_takes_trl_values(value, names):
    assert parse_report_to(value) == names


def test_report_to_from_set_and_toml(tmp_path):
    assert load_config().run.report_to == ["none"]
    assert load_config(sets=["run.report_to=tensorboard"]).run.report_to == ["tensorboard"]
    assert load_config(sets=["run.report_to=tensorboard,wandb"]).run.report_to == ["tensorboard", "wandb"]
    assert load_config(sets=['run.report_to=["wandb", "mlflow"]']).run.report_to == ["wandb", "mlflow"]
    for text, want in (
        ('report_to = "wandb"', ["wandb"]),
        ('report_to = ["tensorboard", "mlflow"]', ["tensorboard", "mlflow"]),
    ):
        (tmp_path / "c.toml").write_text(f"[run]\n{text}\n")
        assert load_config(tmp_path / "c.toml").run.report_to == want


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("tensorbord", r"unknown tracker 'tensorbord' \(closest: tensorboard\)"),
        ("wandbb", r"\(closest: wandb\)"),
        ("comet_ml", "a TRL tracker this trainer does not log to"),
        ("none,wandb", "'none' and 'all' stand alone"),
    ],
)
def test_unknown_tracker_is_an_error_naming_the_closest(value, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(load_config(sets=[f"run.report_to={value}"]))


@pytest.mark.parametrize(("name", "module"), sorted(trackers.TRACKERS.items()))
def test_a_missing_library_names_the_extra(name, module, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as when it is not installed
    with pytest.raises(
        ConfigError,
        match=rf'run.report_to={name}: {name} is not installed .*pip install "tokencredit\[{name}\]"',
    ):
        require([name])
    # at start-up: before the data, the model or the run directory
    with pytest.raises(ConfigError, match=rf"tokencredit\[{name}\]"):
        Trainer(load_config(sets=[f"run.report_to={name}"]), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_all_with_no_tracker_installed_is_an_error(monkeypatch):
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="none of tensorboard, wandb, mlflow is installed"):
        require("all")


# ---------------------------------------------------------------------- metric names
def test_metric_names():
    assert [
        metric_name(k)
        for k in (
            "credit_gini",
            "credit_q_pos_high",
            "eval_greedy_accuracy",
            "eval_pass@2",
            "time_generate",
            "wall_time",
            "tokens_per_s",
            "reward",
            "pg_loss",
        )
    ] == [
        "credit/gini",
        "credit/q_pos_high",
        "eval/greedy_accuracy",
        "eval/pass@2",
        "time/generate",
        "time/wall",
        "time/tokens_per_s",
        "train/reward",
        "train/pg_loss",
    ]
    assert mlflow_key("eval/pass@2") == "eval/pass_at_2" and mlflow_key("credit/gini") == "credit/gini"
    step = {"step": 3, "reward": 0.5, "rollouts": 8, "credit_gini": 0.25, "wall_time": 1.5}
    assert tracker_metrics(step) == (
        3,
        {"train/reward": 0.5, "train/rollouts": 8.0, "credit/gini": 0.25, "time/wall": 1.5},
    )
    evaluation = {"step": 4, "type": "eval", "eval_greedy_accuracy": 0.75, "wall_time": 2.0}
    assert tracker_metrics(evaluation) == (4, {"eval/greedy_accuracy": 0.75})  # the wall time is the step's
    skipped = {"step": 5, "rollouts": 0, "skipped": "no informative group after dynamic sampling"}
    assert tracker_metrics(skipped) == (5, {"train/rollouts": 0.0})


# ---------------------------------------------------------------------- failures
class _Recorder:
    """A tracker that records its calls and fails on `fail_at`."""

    note = None

    def __init__(self, name, fail_at=None):
        self.name, self.fail_at, self.calls = name, fail_at, []

    def log_config(self, config):
        self.calls.append("config")

    def log(self, step, metrics):
        self.calls.append(step)
        if step == self.fail_at:
            raise OSError("connection lost")

    def close(self, exit_code):
        self.calls.append(f"close {exit_code}")


def test_a_failing_tracker_warns_once_and_the_others_go_on():
    warnings = []
    broken, fine = _Recorder("wandb", fail_at=2), _Recorder("tensorboard")
    t = Trackers([broken, fine], warnings.append)
    for step in (1, 2, 3):
        t.log({"step": step, "reward": 0.5})
    t.close(0)
    t.close(0)  # a second close does nothing
    assert broken.calls == [1, 2, "close 1"]  # switched off, and released
    assert fine.calls == [1, 2, 3, "close 0"]
    assert len(warnings) == 1 and "wandb: logging step 2 failed (OSError: connection lost)" in warnings[0]
    assert "metrics.jsonl has every record" in warnings[0]


def test_a_tracker_that_cannot_start_stops_the_run_before_training(monkeypatch, tmp_path):
    opened = _Recorder("tensorboard")

    class Unreachable:
        def __init__(self, run, *, first_step, resume):
            raise ConnectionError("no route to host")

    monkeypatch.setitem(trackers._BACKENDS, "tensorboard", lambda run, **kw: opened)
    monkeypatch.setitem(trackers._BACKENDS, "mlflow", Unreachable)
    with pytest.raises(
        ConfigError, match=r"run.report_to=mlflow: mlflow could not start \(ConnectionError: no route"
    ):
        Trackers.start(
            ["tensorboard", "mlflow"], RunDir(tmp_path), {}, first_step=0, resume=False, warn=print
        )
    assert opened.calls == ["close 1"]  # the one already open is closed


def test_a_tracker_failing_mid_run_loses_nothing(tiny_model_dir, micro_sets, monkeypatch, tmp_path):
    failing = _Recorder("tensorboard", fail_at=1)
    monkeypatch.setitem(
        trackers.TRACKERS, "tensorboard", "json"
    )  # no library needed: the tracker is a stand-in
    monkeypatch.setitem(trackers._BACKENDS, "tensorboard", lambda run, **kw: failing)
    out = io.StringIO()
    _train(tiny_model_dir, micro_sets, tmp_path / "run", "tensorboard", console=Console(file=out, width=200))
    assert [r["step"] for r in _records(tmp_path / "run") if r.get("type") != "eval"] == [1, 2]
    assert (tmp_path / "run" / "final" / "config.json").is_file()
    assert failing.calls == ["config", 1, "close 1"]
    assert out.getvalue().count("tensorboard: logging step 1 failed") == 1


# ---------------------------------------------------------------------- real trackers (extras)
@pytest.mark.extras
def test_tensorboard_logs_every_record_and_a_resumed_run_once(tiny_model_dir, micro_sets, tmp_path):
    pytest.importorskip("tensorboard", reason="TensorBoard is not installed (extra tokencredit[tensorboard])")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = load_config(
        sets=micro_sets(
            tiny_model_dir, 4, **{"run.report_to": "tensorboard", "eval.every": 1, "checkpoint.every": 2}
        ),
        recipe="grpo",
    )
    quiet = Console(file=io.StringIO())
    first = Trainer(cfg, tmp_path / "run", console=quiet)
    real_step = first.step

    def step_then_crash(i):
        if i == 3:  # after the checkpoint at step 2 and one more step, logged and then redone on resume
            raise RuntimeError("crash")
        return real_step(i)

    first.step = step_then_crash
    with pytest.raises(RuntimeError, match="crash"):
        first.fit()  # the writer is closed on the error: its events are on disk
    Trainer(cfg, tmp_path / "run", resume=True, console=quiet).fit()

    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    got = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    want = _expected(tmp_path / "run")
    assert {"credit/gini", "credit/sign_flip", "train/reward", "eval/greedy_accuracy", "time/wall"} <= set(
        want
    )
    assert set(got) == set(want)
    for tag, points in want.items():  # step 3 of the first session hidden (purge_step): one point per step
        assert [s for s, _ in got[tag]] == [s for s, _ in points], tag
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in points], rel=1e-6), tag  # float32
    assert [s for s, _ in want["credit/gini"]] == [1, 2, 3, 4]
    assert "config/text_summary" in events.Tags()["tensors"]


def _wandb_records(path):
    """The protobuf Records of a wandb transaction log (run-ID.wandb): a ':W&B' header of 7 bytes, then
    LevelDB-style log records (checksum 4, length 2, type 1: full, first, middle, last) in 32 KiB blocks."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B", f"{path}: not a wandb transaction log"
    pos, parts = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a record header is padding
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero padding up to the end of the block
            pos += block - pos % block
            continue
        parts = (b"" if kind in (1, 2) else parts) + data[pos + 7 : pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            yield record


def _wandb_history(run_file):
    """{name: [(train/global_step, value), ...]} and the config of an offline wandb run file."""
    deadline = time.monotonic() + 60
    # wandb's service process writes the file: `run.finish()` may return before it has written the end
    while [r.WhichOneof("record_type") for r in _wandb_records(run_file)][-1:] != ["exit"]:
        assert time.monotonic() < deadline, f"{run_file}: no exit record after 60 s"
        time.sleep(0.1)
    history, config = {}, {}
    for record in _wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            for key, value in row.items():
                if not key.startswith("_") and key != trackers.STEP_METRIC:
                    history.setdefault(key, []).append((row[trackers.STEP_METRIC], value))
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
    return history, config


@pytest.mark.extras
def test_wandb_offline_logs_every_record_and_resumes_the_same_run(
    tiny_model_dir, micro_sets, monkeypatch, tmp_path
):
    pytest.importorskip("wandb", reason="wandb is not installed (extra tokencredit[wandb])")
    monkeypatch.setenv("WANDB_MODE", "offline")  # no network
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    monkeypatch.delenv("WANDB_DIR", raising=False)  # the default: the run directory
    for var in (
        "WANDB_CONFIG_DIR",
        "WANDB_CACHE_DIR",
        "WANDB_DATA_DIR",
    ):  # nothing written to the home directory
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    run_dir = tmp_path / "run"
    _train(tiny_model_dir, micro_sets, run_dir, "wandb")
    run_id = json.loads((run_dir / "trackers.json").read_text())["wandb"]
    (run_file,) = (run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    history, config = _wandb_history(run_file)
    assert history == _expected(run_dir)
    assert {"credit/gini", "train/reward", "eval/greedy_accuracy"} <= set(history)
    assert config["run"]["report_to"] == ["wandb"] and config["algo"]["recipe"] == "grpo"

    cfg = load_config(sets=micro_sets(tiny_model_dir, 3, **{"run.report_to": "wandb"}), recipe="grpo")
    Trainer(cfg, run_dir, resume=True, console=Console(file=io.StringIO())).fit()
    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 2 and files[1].name == f"run-{run_id}.wandb"  # the same wandb run continued
    assert [s for s, _ in _wandb_history(files[1])[0]["credit/gini"]] == [3]


@pytest.mark.extras
def test_mlflow_logs_every_record_to_a_file_store(tiny_model_dir, micro_sets, monkeypatch, tmp_path):
    pytest.importorskip("mlflow", reason="mlflow is not installed (extra tokencredit[mlflow])")
    from mlflow.tracking import MlflowClient

    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv(
            var, raising=False
        )  # the defaults (the run sets MLFLOW_ALLOW_FILE_STORE; undone after)
    run_dir = tmp_path / "run"
    _train(tiny_model_dir, micro_sets, run_dir, "mlflow", **{"eval.samples": 2})
    run_id = json.loads((run_dir / "trackers.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["run.report_to"] == "['mlflow']" and run.data.params["algo.recipe"] == "grpo"
    want = _expected(run_dir)
    assert {"credit/gini", "train/reward", "eval/greedy_accuracy", "eval/avg_at_k", "eval/pass@2"} <= set(
        want
    )
    assert not {"eval/greedy_acc", "eval/avg@2", "eval/mean_response_length"} & set(want)  # one name each
    for key, points in want.items():
        history = client.get_metric_history(run_id, mlflow_key(key))
        assert sorted((m.step, m.value) for m in history) == points, key

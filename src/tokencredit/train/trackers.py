"""Experiment trackers (`run.report_to`, TRL's name and values): TensorBoard, Weights & Biases, MLflow.

`require` checks the chosen trackers at start-up (a missing library is a ConfigError naming the extra
to install); `Trackers.start` opens them and logs the configuration; the trainer passes every
metrics.jsonl record to `Trackers.log`. Each backend imports its library only when chosen. A tracker
that fails once the run is going is reported once and switched off: training goes on, and
metrics.jsonl stays the source of truth. The names a record's keys get are `metric_name`'s
(docs/trackers.md).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from tokencredit.errors import ConfigError, closest

__all__ = [
    "REPORT_TO",
    "STEP_METRIC",
    "TRACKERS",
    "Tracker",
    "Trackers",
    "flat_params",
    "metric_name",
    "mlflow_key",
    "parse_report_to",
    "require",
    "tracker_metrics",
]

# tracker name -> the module that must import (also the extra's name: pip install "tokencredit[NAME]")
TRACKERS = {"tensorboard": "torch.utils.tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
REPORT_TO = ("none", "all", *TRACKERS)
# TRL's (transformers') other report_to values: named as such in the error rather than as typos
_TRL_ONLY = (
    "azure_ml",
    "clearml",
    "codecarbon",
    "comet_ml",
    "dagshub",
    "dvclive",
    "flyte",
    "kubeflow",
    "neptune",
    "swanlab",
    "trackio",
)
STEP_METRIC = "train/global_step"  # wandb's x-axis (TRL's name for it)
# Keys named as a group rather than by prefix; every other key without a credit_/eval_/time_ prefix is train/KEY.
_NAMED = {"wall_time": "time/wall", "tokens_per_s": "time/tokens_per_s"}
_PREFIXES = ("credit", "eval", "time")
_START_HINT = {
    "tensorboard": "",
    "wandb": "; log in with `wandb login`, or set WANDB_MODE=offline to log on this machine only",
    "mlflow": "; check MLFLOW_TRACKING_URI",
}


class RunFiles(Protocol):
    """What a tracker needs of the run directory (`tokencredit.train.rundir.RunDir` is one; named by its
    members, not imported, because rundir imports the config, which validates run.report_to here)."""

    path: Path
    tensorboard_dir: Path
    mlflow_dir: Path
    trackers_path: Path

    def read_tracker_ids(self) -> dict[str, str]: ...
    def write_tracker_id(self, tracker: str, run_id: str) -> None: ...


# ---------------------------------------------------------------------- names and values
def parse_report_to(value: str | list[str]) -> list[str]:
    """The trackers `run.report_to` names, in order, without repeats: [] for "none", ["all"] for "all".

    A string may hold several comma-separated names. An unknown name is a ConfigError naming the
    closest valid one; "none" and "all" stand alone.
    """
    items = value.split(",") if isinstance(value, str) else list(value)
    names: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(
                f"run.report_to: expected tracker names, got {item!r}; valid: {', '.join(REPORT_TO)}"
            )
        name = item.strip().lower()
        if not name:  # "tensorboard," or an empty TOML list
            continue
        if name in _TRL_ONLY:
            raise ConfigError(
                f"run.report_to: {name!r} is a TRL tracker this trainer does not log to; "
                f"valid: {', '.join(REPORT_TO)}"
            )
        if name not in REPORT_TO:
            raise ConfigError(
                f"run.report_to: unknown tracker {item.strip()!r}{closest(name, REPORT_TO)}; "
                f"valid: {', '.join(REPORT_TO)}"
            )
        if name not in names:
            names.append(name)
    if len(names) > 1 and {"none", "all"} & set(names):
        raise ConfigError(f"run.report_to: 'none' and 'all' stand alone, got {names}")
    return [] if names in ([], ["none"]) else names


def require(value: str | list[str]) -> list[str]:
    """The trackers to open: `parse_report_to`'s, "all" being every tracker whose library is installed.
    Imports each chosen library; a missing one is a ConfigError saying which extra to install."""
    names = parse_report_to(value)
    if names == ["all"]:
        names = [n for n in TRACKERS if importlib.util.find_spec(n)]  # each one's package has its name
        if not names:
            raise ConfigError(
                "run.report_to=all: none of tensorboard, wandb, mlflow is installed "
                '(e.g. pip install "tokencredit[tensorboard]")'
            )
    for name in names:
        try:
            importlib.import_module(TRACKERS[name])
        except ImportError as e:
            raise ConfigError(
                f'run.report_to={name}: {name} is not installed ({e}); pip install "tokencredit[{name}]"'
            ) from None
    return names


def metric_name(key: str) -> str:
    """The tracker name of a metrics.jsonl key: credit_X -> credit/X, eval_X -> eval/X, time_X -> time/X,
    wall_time -> time/wall, tokens_per_s -> time/tokens_per_s, anything else -> train/KEY."""
    if key in _NAMED:
        return _NAMED[key]
    prefix, _, rest = key.partition("_")
    return f"{prefix}/{rest}" if prefix in _PREFIXES and rest else f"train/{key}"


def tracker_metrics(record: dict[str, Any]) -> tuple[int, dict[str, float]]:
    """(step, {tracker name: value}) of one metrics.jsonl record: its numeric fields (an evaluation's
    eval_* only: its wall time is the step's), named by `metric_name`; text (`skipped`) is left out."""
    is_eval = record.get("type") == "eval"
    out = {}
    for key, value in record.items():
        if (
            key in ("step", "type")
            or not isinstance(value, (int, float))
            or (is_eval and not key.startswith("eval_"))
        ):
            continue
        out[metric_name(key)] = float(value)
    return int(record["step"]), out


def flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"section.key": value} of a nested config dict; lists and other non-scalars as their repr (hparams and
    params take scalars only)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_params(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, (bool, int, float, str)) else repr(value)
    return out


# ---------------------------------------------------------------------- the backends
class Tracker(Protocol):
    """One backend. `log` gets `tracker_metrics`' names; `close` the run's exit code (0 finished,
    128 + signal number stopped by a signal, else failed). `note`: what the user should know once it
    opened (a resumed run that starts a new tracker run), else None."""

    name: str
    note: str | None

    def log_config(self, config: dict[str, Any]) -> None: ...

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self, exit_code: int) -> None: ...


class TensorBoardTracker:
    """Event files in RUN_DIR/tensorboard/ (`tensorboard --logdir RUN_DIR`)."""

    name = "tensorboard"
    note = None

    def __init__(self, run: RunFiles, *, first_step: int, resume: bool) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: TensorBoard hides earlier events at or after the first step this session logs,
        # so the steps a resumed run redoes after its checkpoint (or an old run's in a reused directory) show once.
        self.writer = SummaryWriter(log_dir=str(run.tensorboard_dir), purge_step=first_step)

    def log_config(self, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        flat = flat_params(config)
        for summary in hparams(flat, {}):
            self.writer.file_writer.add_summary(summary)
        self.writer.add_text("config", "\n".join(f"    {k} = {v!r}" for k, v in flat.items()))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def close(self, exit_code: int) -> None:
        self.writer.close()


class WandbTracker:
    """A wandb run (project WANDB_PROJECT or "tokencredit", named after the run directory) whose files go
    to RUN_DIR/wandb/ unless WANDB_DIR is set; WANDB_MODE (online, offline, disabled) is wandb's own.
    Its id is kept in the run directory: a resumed run continues the same wandb run."""

    name = "wandb"

    def __init__(self, run: RunFiles, *, first_step: int, resume: bool) -> None:
        import wandb

        run_id = run.read_tracker_ids().get(self.name) if resume else None
        self.note = _new_run_note(self.name, run) if resume and run_id is None else None
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "tokencredit",
            name=run.path.name,
            id=run_id,
            resume="allow",
            dir=None if os.environ.get("WANDB_DIR") else str(run.path),
            reinit="create_new",  # a run of the caller's own stays as it is (not finished, not logged into)
        )
        try:
            run.write_tracker_id(self.name, self.run.id)
            self.run.define_metric(STEP_METRIC)
            self.run.define_metric("*", step_metric=STEP_METRIC)
        except BaseException:
            self.run.finish(exit_code=1)  # no wandb run left open behind a failed start
            raise

    def log_config(self, config: dict[str, Any]) -> None:
        self.run.config.update(config, allow_val_change=True)  # a resumed run may change run.steps

    def log(self, step: int, metrics: dict[str, float]) -> None:
        # the step as a metric, not wandb's own `step=`: a resumed run logs again the steps it redoes,
        # which wandb's monotonic step would drop
        self.run.log({STEP_METRIC: step, **metrics})

    def close(self, exit_code: int) -> None:
        self.run.finish(exit_code=exit_code)


class MlflowTracker:
    """An MLflow run (experiment MLFLOW_EXPERIMENT_NAME or "tokencredit", named after the run directory)
    at MLFLOW_TRACKING_URI, by default a file store in RUN_DIR/mlruns/. Its id is kept in the run
    directory: a resumed run continues the same MLflow run."""

    name = "mlflow"

    def __init__(self, run: RunFiles, *, first_step: int, resume: bool) -> None:
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = run.mlflow_dir.resolve().as_uri()
            # MLflow >= 3.x refuses a file store unless allowed; mlflow-skinny has no other local store
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        self.run_id = self._resumed(run.read_tracker_ids().get(self.name)) if resume else None
        self.note = _new_run_note(self.name, run) if resume and self.run_id is None else None
        if self.run_id is None:
            experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "tokencredit"
            found = self.client.get_experiment_by_name(experiment)
            exp_id = found.experiment_id if found else self.client.create_experiment(experiment)
            self.run_id = self.client.create_run(exp_id, run_name=run.path.name).info.run_id
        run.write_tracker_id(self.name, self.run_id)

    def _resumed(self, run_id: str | None) -> str | None:
        """`run_id` set running again, None when there is none or this tracking URI does not hold it."""
        if not run_id:
            return None
        try:
            self.client.get_run(run_id)
        except Exception:  # MlflowException: not at this URI (another MLFLOW_TRACKING_URI): a new run
            return None
        self.client.update_run(run_id, status="RUNNING")
        return run_id

    def log_config(self, config: dict[str, Any]) -> None:
        from mlflow.entities import Param

        # params cannot change once logged: a resumed run adds only the keys its run lacks
        logged = self.client.get_run(self.run_id).data.params
        params = [Param(k, str(v)) for k, v in flat_params(config).items() if k not in logged]
        for i in range(0, len(params), 100):  # MLflow's limit per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(
            self.run_id, metrics=[Metric(mlflow_key(k), v, now, step) for k, v in metrics.items()]
        )

    def close(self, exit_code: int) -> None:
        self.client.set_terminated(
            self.run_id, "FINISHED" if exit_code == 0 else "KILLED" if exit_code > 128 else "FAILED"
        )


def _new_run_note(name: str, run: RunFiles) -> str:
    return (
        f"{name}: no earlier {name} run of {run.path} found (none in {run.trackers_path.name}, or not at this "
        f"tracking location); this session logs to a new {name} run"
    )


def mlflow_key(name: str) -> str:
    """`name` as MLflow allows it (letters, digits, _ - . / : space): eval/pass@2 -> eval/pass_at_2."""
    return re.sub(r"[^\w./: -]", "_", name.replace("@", "_at_"))


_BACKENDS: dict[str, Callable[..., Tracker]] = {
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "mlflow": MlflowTracker,
}


# ---------------------------------------------------------------------- the trainer's view
class Trackers:
    """The open trackers of one training session. A failure after start-up warns once (through `warn`)
    and switches that tracker off; the others and the training go on."""

    def __init__(self, trackers: list[Tracker] | None = None, warn: Callable[[str], None] = print) -> None:
        self.active = list(trackers or [])
        self.warn = warn

    @classmethod
    def start(
        cls,
        names: list[str],
        run: RunFiles,
        config: dict[str, Any],
        *,
        first_step: int,
        resume: bool,
        warn: Callable[[str], None],
    ) -> Trackers:
        """Open `names` (from `require`) and log `config` to each. A tracker that cannot start (wandb not
        logged in, an unreachable server) is a ConfigError: nothing has been trained yet."""
        opened: list[Tracker] = []
        for name in names:
            try:
                opened.append(_BACKENDS[name](run, first_step=first_step, resume=resume))
            except Exception as e:
                cls(opened, warn).close(1)
                raise ConfigError(
                    f"run.report_to={name}: {name} could not start ({type(e).__name__}: {e})"
                    f"{_START_HINT[name]}"
                ) from e
        for tracker in opened:
            if tracker.note:
                warn(tracker.note)
        trackers = cls(opened, warn)
        trackers._each("logging the config", lambda t: t.log_config(config))
        return trackers

    def log(self, record: dict[str, Any]) -> None:
        """Log one metrics.jsonl record (`tracker_metrics`)."""
        if not self.active:
            return
        step, metrics = tracker_metrics(record)
        if metrics:
            self._each(f"logging step {step}", lambda t: t.log(step, metrics))

    def close(self, exit_code: int) -> None:
        """Close every tracker (the exit code: see `Tracker`); later calls do nothing."""
        self._each("closing", lambda t: t.close(exit_code))
        self.active = []

    def _each(self, what: str, call: Callable[[Tracker], None]) -> None:
        for tracker in list(self.active):
            try:
                call(tracker)
            except Exception as e:
                self.active.remove(tracker)
                then = (
                    ""
                    if what == "closing"
                    else f"; {tracker.name} is off for the rest of this run, which goes on"
                )
                self.warn(
                    f"{tracker.name}: {what} failed ({type(e).__name__}: {e}){then} "
                    "(metrics.jsonl has every record)"
                )
                if what != "closing":
                    try:
                        tracker.close(1)  # release its writer / background process
                    except Exception:  # already reported: the tracker is broken
                        pass

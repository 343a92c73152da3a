"""One MLflow run per training run, delivered from a single background thread.

The run's recorder actor owns the only :class:`MlflowRun` of a training run; workers never
talk to MLflow. Every call only queues a record (`records`: one small class per kind, each
delivering itself); the thread delivers them in order. When the server cannot be reached,
training goes on: records stay queued and are retried with backoff, one warning is raised
(not a stream of tracebacks), and at the end whatever could not be delivered is written to a
JSON file next to the run's other output.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import first_line
from ..hooks import set_env_defaults
from ..secrets import mask, mask_text
from .records import (
    Artifact,
    Checkpoint,
    DropCheckpoint,
    End,
    Inputs,
    Metrics,
    Model,
    Params,
    Record,
    Register,
    Start,
    Tags,
)
from .sqlite_store import mlflow_client
from .store import chosen_tracking_uri, enter_working_directory, open_run, run_url

# The longest the delivery thread waits for `release` (the run's first step) before it starts.
HOLD_S = 20.0


@dataclass(frozen=True)
class TrackingSettings:
    """Where and as what a run is recorded in MLflow: what the driver hands the recorder."""

    tracking_uri: str | None  # None: MLflow's default store, resolved where the run is logged (`MlflowRun`)
    experiment: str
    run_name: str
    unlogged_path: Path  # what could not be delivered, at the end
    tags: dict = field(default_factory=dict)  # the job's, the run's source and user (`mlflow.source.name`, ...)
    resume_run_id: str | None = None  # the MLflow run a resumed (or restarted) run goes on with
    inputs: list[dict] = field(default_factory=list)  # the datasets trained on, as mlflow.log_input records them
    used: dict = field(default_factory=dict)  # train: keys the job left out, as the run used them (params)
    started_at: float | None = None  # unix time the command started: the run's start in MLflow's Overview


class MlflowRun:
    """The run's MLflow run: calls queue `Record`s, one thread delivers them in order (the module doc)."""

    def __init__(
        self,
        settings: TrackingSettings,
        notify: Callable[[str], None],
        on_started: Callable[[], None] = lambda: None,
    ):
        set_env_defaults("mlflow")  # the recorder's process: MLflow's own retries would hold up the queue
        if settings.tracking_uri is None:  # the driver had none: a cluster's MLFLOW_TRACKING_URI here must not choose
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        self._tracking_uri, self.experiment, self.run_name = (
            settings.tracking_uri,
            settings.experiment,
            settings.run_name,
        )
        self._started_at = settings.started_at
        self.run_id: str | None = settings.resume_run_id
        self.unlogged_path = settings.unlogged_path
        self.experiment_id: str | None = None
        self.notify = notify  # one line for the console (the recorder's warning)
        self._on_started = on_started  # the run's id exists from now on: the recorder's journal keeps it
        self._queue: deque = deque()
        self._cond = threading.Condition()
        self._started = threading.Event()
        self._released = threading.Event()  # see `release`
        self._closing = False
        self._failing_since: float | None = None
        self.last_error: str | None = None  # why the newest failed delivery failed (kept with what is left)
        self._working_directory = os.getcwd()
        self.logged_steps: dict[str, int] = {}  # a resumed run's last step of each metric: not logged twice
        self._thread = threading.Thread(target=self._deliver, name="rayparallel-mlflow", daemon=True)
        self._queue.append(Start())
        if settings.tags:
            self.set_tags(settings.tags)
        if settings.inputs:  # the datasets trained on, as mlflow.log_input records them (MLflow keeps one per digest)
            self._queue.append(Inputs(settings.inputs))
        self._thread.start()

    @property
    def tracking_uri(self) -> str:
        if self._tracking_uri is None:  # MLflow's default store, in this process's folder (the driver's)
            self._tracking_uri = chosen_tracking_uri(None)  # imports MLflow: not before it is needed
        return self._tracking_uri

    # -- queueing (never blocks on the network) -------------------------------------------
    def log_params(self, params: dict) -> None:
        self._put(Params(params))

    def set_tags(self, tags: dict) -> None:
        self._put(Tags({k: str(v) for k, v in tags.items()}))

    def log_metrics(self, metrics: dict, step: int, at: float | None = None) -> None:
        """`at`: the unix time the figures were taken (default now)."""
        values = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        self._put(Metrics(values, step, int((at or time.time()) * 1000)))

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        self._put(Artifact(path, artifact_path))

    def log_model(
        self,
        build: Callable[[], Any],
        *,
        name: str = "model",
        step: int = 0,
        registered_model_name: str | None = None,
        alias: str | None = None,
    ) -> None:
        """A model built at delivery (never on the caller's thread), logged and maybe registered."""
        self._put(Model(build, name, step, registered_model_name, alias))

    def log_checkpoint(self, file: str, build: Callable[[], Any] | None, step: int) -> None:
        """The weight file `file` as a logged model (replacing one of the same file); `build` returns
        None when the file is gone by then (`keep` dropped it)."""
        self._put(Checkpoint(file, build, step))

    def drop_checkpoint(self, file: str) -> None:
        """The weight file `file` was deleted: so is its logged model (the Models tab matches the folder)."""
        self._put(DropCheckpoint(file))

    def register_checkpoint(self, file: str, name: str, alias: str | None) -> None:
        """The logged model of `file` registered as `name`, that version pointed at by `alias`."""
        self._put(Register(file, name, alias))

    def release(self) -> None:
        """Deliver from now on. Until then (at most `HOLD_S`) the thread waits, so that MLflow's
        import and the run's creation (seconds of CPU) do not compete with the workers' start-up."""
        self._released.set()

    def wait_started(self, timeout: float) -> bool:
        return self._started.wait(timeout)

    def url(self) -> str | None:
        if self.run_id and self.experiment_id:
            return run_url(self.tracking_uri, self.experiment_id, self.run_id)
        return None

    def finish(self, status: str, timeout: float) -> list[str]:
        """End the run as `status`; returns what could not be delivered within `timeout`."""
        self._put(End(status))
        self.release()
        deadline = time.monotonic() + timeout
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            while self._queue and time.monotonic() < deadline:
                self._cond.wait(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            left = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        return self._save_unlogged(left) if left else []

    # -- delivery thread ---------------------------------------------------------------
    def _put(self, record: Record) -> None:
        with self._cond:
            self._queue.append(record)
            self._cond.notify_all()

    def _deliver(self) -> None:
        self._released.wait(HOLD_S)
        backoff = 1.0
        while True:
            with self._cond:
                while not self._queue:
                    if self._closing:
                        return
                    self._cond.wait()
                record = self._queue[0]
            try:
                enter_working_directory(self._working_directory)
                record.deliver(self, mlflow_client(self.tracking_uri))
            except Exception as exc:  # the server is down or refused: keep it queued, retry later
                self._failed(record, exc)
                with self._cond:
                    self._cond.wait(timeout=backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            if self._failing_since is not None:
                self.notify(f"MLflow: reachable again at {mask_text(self.tracking_uri)}; buffered records delivered")
                self._failing_since = None
            backoff = 1.0
            with self._cond:
                if self._queue and self._queue[0] is record:
                    self._queue.popleft()
                self._cond.notify_all()

    def _failed(self, record: Record, exc: Exception) -> None:
        """Why the newest delivery failed, kept; the first failure of a stretch said once."""
        line = first_line(exc, 200)
        self.last_error = mask_text(f"{record.kind}: {type(exc).__name__}: {line}")
        if self._failing_since is None:
            self._failing_since = time.monotonic()
            self.notify(
                mask_text(
                    f"MLflow: cannot log to {self.tracking_uri} ({type(exc).__name__}: {line}); "
                    "training goes on, metrics are kept and retried"
                )
            )

    def open(self, client: Any) -> None:
        """`Start`'s delivery: the run created, or the resumed one reopened with the steps it has."""
        resumed = self.run_id is not None
        self.experiment_id, self.run_id = open_run(
            client, self.tracking_uri, self.experiment, self.run_name, self.run_id, self._started_at
        )
        if resumed:  # the same run goes on; epochs it has already are not logged twice
            self.logged_steps = {
                key: max(m.step for m in client.get_metric_history(self.run_id, key))
                for key in client.get_run(self.run_id).data.metrics
            }
        self._started.set()
        self._on_started()

    def _save_unlogged(self, left: list[Record]) -> list[str]:
        records = [record.unlogged() for record in left]
        unlogged = {
            "tracking_uri": self.tracking_uri,
            "run_id": self.run_id,
            "last_error": self.last_error,
            "records": records,
        }
        self.unlogged_path.parent.mkdir(parents=True, exist_ok=True)
        self.unlogged_path.write_text(json.dumps(mask(unlogged), indent=2, default=str))
        return sorted({record.kind for record in left})

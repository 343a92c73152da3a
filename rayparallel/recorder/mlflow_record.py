"""The run's MLflow record as the recorder keeps it: what to log at each moment of the run.

Every call only queues records for :class:`MlflowRun`'s delivery thread, so a slow or absent
server never holds up training.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..result import describe_stop
from ..secrets import mask_text
from ..tracking.mlflow_run import MlflowRun, TrackingSettings
from ..tracking.params import run_params, worker_tags

if TYPE_CHECKING:
    from ..spec import JobSpec


class MlflowRecord:
    def __init__(
        self,
        spec: JobSpec,
        tracking: TrackingSettings,
        warn: Callable[[str], None],
        on_started: Callable[[], None],
    ):
        self._settings = spec.mlflow
        self._run = MlflowRun(tracking, notify=warn, on_started=on_started)
        self._run.log_params({**run_params(spec), **tracking.used})
        self._announced = False
        self._unsaved: list[str] = []

    @property
    def run_id(self) -> str | None:
        """None until the MLflow run exists (its delivery thread creates or reopens it)."""
        return self._run.run_id

    def first_step_done(self) -> None:
        """The MLflow run is created now (see `MlflowRun.release`)."""
        self._run.release()

    def workers_changed(self, world: int, global_step: int) -> None:
        self._run.log_metrics({"num_workers": world}, step=global_step)

    def group_complete(self, workers: Iterable[dict]) -> None:
        self._run.set_tags(worker_tags(workers))

    def step_loss(self, loss: float, global_step: int) -> None:
        if self._settings.log_step_loss:
            self._run.log_metrics({"step_loss": loss}, step=global_step)

    def epoch(self, epoch: int, logs: dict) -> None:
        self._run.log_metrics(logs, step=epoch)

    def unsaved(self, file: str) -> None:
        """A weight file that could not be written, named in the run's tags beside the others."""
        self._unsaved.append(file)
        self._run.set_tags({"rayparallel.unsaved_checkpoints": ", ".join(self._unsaved)})

    def files(self, *paths: Path, folder: str | None = None) -> None:
        for path in paths:
            self._run.log_artifact(str(path), folder)

    def info(self, timeout: float) -> dict:
        """The MLflow run once it exists (waits up to `timeout`)."""
        started = self._run.wait_started(timeout)
        return {
            "run_id": self._run.run_id,
            "url": self._run.url(),
            "started": started,
            "tracking_uri": mask_text(self._run.tracking_uri),
            "experiment": self._run.experiment,
        }

    def announcement(self) -> dict | None:
        """The run's info the first time it is asked for after the MLflow run exists, else None."""
        if self._announced or not self._run.wait_started(0):
            return None
        self._announced = True
        return self.info(0)

    def finish(
        self, status: str, files: list[str], stopped: dict | None, final_model: Callable[[int], Any] | None
    ) -> dict:
        """The run's last files and (when it finished) the final model, then the end as `status`."""
        if stopped:
            self._run.set_tags({"rayparallel.stopped_early": describe_stop(stopped)})
        for path in files:
            self._run.log_artifact(path)
        if final_model is not None and status == "FINISHED":
            batch_size = self._settings.model_batch_size
            self._run.log_model(lambda: final_model(batch_size), self._settings.register_model)
        unlogged = self._run.finish(status, self._settings.flush_timeout_s)
        path, why = (str(self._run.unlogged_path), self._run.last_error) if unlogged else (None, None)
        return dict(self.info(0), unlogged=unlogged, unlogged_path=path, unlogged_error=why)

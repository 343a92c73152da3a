"""The run's MLflow record as the recorder keeps it: what to log at each moment of the run.

Every call only queues records for :class:`MlflowRun`'s delivery thread, so a slow or absent
server never holds up training.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..result import WorkerInfo, describe_stop
from ..secrets import mask_text
from ..tracking.mlflow_run import MlflowRun, TrackingSettings
from ..tracking.params import run_params, worker_tags
from ..tracking.store import SYSTEM_PREFIX

if TYPE_CHECKING:
    import keras

    from ..checkpoint.policy import Saved
    from ..spec import JobSpec

    ModelOf = Callable[[str, int], "keras.Model | None"]  # a weight file of the folder rebuilt at a batch size


class MlflowRecord:
    def __init__(
        self,
        spec: JobSpec,
        tracking: TrackingSettings,
        warn: Callable[[str], None],
        on_started: Callable[[], None],
    ):
        self._settings = spec.mlflow
        self._per_epoch = spec.checkpoint.save_freq == "epoch"  # a checkpoint's figures are its epoch's
        self._run = MlflowRun(tracking, notify=warn, on_started=on_started)
        # An epoch's checkpoint is logged after its figures (MLflow links the figures at the model's step,
        # and the end of the epoch and the file's write reach the recorder on two threads in either order)
        self._lock = threading.Lock()
        self._epochs_logged = 0
        self._waiting: list[tuple[int, Callable[[], None]]] = []
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

    def group_complete(self, workers: Iterable[WorkerInfo]) -> None:
        self._run.set_tags(worker_tags(workers))

    def step_loss(self, loss: float, global_step: int) -> None:
        if self._settings.log_step_loss:
            self._run.log_metrics({"step_loss": loss}, step=global_step)

    def system(self, node: str, metrics: dict, step: int, at: float) -> None:
        """A node's system metrics sample (`worker.system_metrics`), as MLflow names a node's."""
        self._run.log_metrics({f"{SYSTEM_PREFIX}{node}/{key}": value for key, value in metrics.items()}, step, at)

    def epoch(self, epoch: int, logs: dict) -> None:
        self._run.log_metrics(logs, step=epoch)
        with self._lock:
            self._epochs_logged = max(self._epochs_logged, epoch)
            ready = [log for after, log in self._waiting if after <= epoch]
            self._waiting = [(after, log) for after, log in self._waiting if after > epoch]
        for log in ready:
            log()

    def checkpoint(self, saved: Saved, deleted: list[str], model_of: ModelOf) -> None:
        """With `mlflow.log_checkpoints`: the written file as a logged model at its epoch (or global step,
        for saves every N steps), the files `keep` deleted removed from the run's models."""
        if not self._settings.log_checkpoints:
            return
        for file in deleted:
            self._run.drop_checkpoint(file)
        batch_size = self._settings.model_batch_size
        step = saved.epoch if self._per_epoch else saved.step

        def log() -> None:
            self._run.log_checkpoint(saved.file, lambda: model_of(saved.file, batch_size), step)

        with self._lock:
            if self._per_epoch and saved.epoch > self._epochs_logged:
                self._waiting.append((saved.epoch, log))
                return
        log()

    def unsaved(self, file: str) -> None:
        """A weight file that could not be written, named in the run's tags beside the others."""
        self._unsaved.append(file)
        self._run.set_tags({"rayparallel.unsaved_checkpoints": ", ".join(self._unsaved)})

    def files(self, *paths: Path, folder: str | None = None) -> None:
        for path in paths:
            self._run.log_artifact(str(path), folder)

    def _log_final(self, final_model: Callable[[int], Any], best: Saved | None, model_of: ModelOf) -> None:
        """The final model as the run's `model`; registered: the best checkpoint by the monitor (the final
        model when none has the monitor's figure), under `register_alias`."""
        settings, batch_size = self._settings, self._settings.model_batch_size
        name, alias = settings.register_model, settings.register_alias
        if not name or best is None:
            self._run.log_model(lambda: final_model(batch_size), registered_model_name=name, alias=alias)
            return
        self._run.log_model(lambda: final_model(batch_size))
        if settings.log_checkpoints:
            self._run.register_checkpoint(best.file, name, alias)
        else:
            build = lambda: model_of(best.file, batch_size)  # noqa: E731
            self._run.log_model(build, name="best", step=best.epoch, registered_model_name=name, alias=alias)

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
        self,
        status: str,
        files: list[str],
        stopped: dict | None,
        final_model: Callable[[int], Any] | None,
        best: Saved | None,
        model_of: ModelOf,
    ) -> dict:
        """The run's last files and (when it finished) the final model and the best checkpoint registered,
        then the end as `status`."""
        if stopped:
            self._run.set_tags({"rayparallel.stopped_early": describe_stop(stopped)})
        for path in files:
            self._run.log_artifact(path)
        with self._lock:  # an epoch whose figures never came (a failed run): its file is logged all the same
            waiting, self._waiting = self._waiting, []
        for _, log in waiting:
            log()
        if final_model is not None and status == "FINISHED":
            self._log_final(final_model, best, model_of)
        unlogged = self._run.finish(status, self._settings.flush_timeout_s)
        path, why = (str(self._run.unlogged_path), self._run.last_error) if unlogged else (None, None)
        return dict(self.info(0), unlogged=unlogged, unlogged_path=path, unlogged_error=why)

"""The run's recorder: the one process that writes the run's files and owns its MLflow run.

Rank 0 hands it save points with the base model's weights (NumPy arrays through Ray's
object store), resume points inside epochs and the global logs of each epoch; every rank of
every worker group registers itself and asks it for the point to resume from; the driver
drains its progress events and reads the summary at the end. This class is a thin shell:
each job is a part's (who trains: :class:`WorkerRegistry`; early stops: :class:`StopArbiter`;
the console's events and the history: :mod:`.events`; files: :class:`CheckpointWriter` and
`resume_state`; MLflow: :class:`MlflowRecord`). Writes run in the actor's own `io` thread, in
order, while training goes on; progress and history calls use another thread so the console
stays live during a write. It is pinned to the driver's node and works in the driver's
folder, so the paths it writes (and MLflow's default sqlite store) are the driver's.

When its process dies, Ray starts it again (`RECORDER_RESTARTS`) and retries the calls it was
in: the new one reads back what the old one acknowledged (:mod:`.journal`, the manifest) and
goes on with the same MLflow run, logging again what that run lacks.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from ..checkpoint import resume_state
from ..checkpoint.policy import Saved
from ..checkpoint.writer import CheckpointWriter
from ..files import WriteError, free_space
from ..hooks import set_env_defaults
from ..result import RunSummary, WorkerInfo
from ..spec import JobSpec
from ..spec.references import add_search_path
from .events import (
    CheckpointWritten,
    EpochEnded,
    EpochHistory,
    Event,
    EventLog,
    PhaseReached,
    Progress,
    Resized,
    RunWarning,
    TrackingStarted,
    warning_key,
)
from .journal import RecorderJournal
from .mlflow_record import MlflowRecord
from .registry import WorkerRegistry
from .stops import StopArbiter

if TYPE_CHECKING:
    import numpy as np

    from ..tracking.mlflow_run import TrackingSettings


# How often Ray starts the recorder again after its process died; then the run fails with one line.
RECORDER_RESTARTS = 3


class RunRecorder:
    writer_class = CheckpointWriter  # a test swaps in a slow disk here

    def __init__(
        self,
        spec: JobSpec,
        checkpoint_dir: str,
        search_path: list[str],
        journal: str,
        tracking: TrackingSettings | None = None,
        run_folder: str | None = None,
    ):
        set_env_defaults("tensorflow")
        if search_path and os.path.isdir(search_path[0]):
            os.chdir(search_path[0])
        add_search_path(search_path)
        self._spec = spec
        self._writer = self.writer_class(spec, Path(checkpoint_dir))
        self._writer.prepare()
        self._run_folder = Path(run_folder) if run_folder else None  # Ray's run folder, when on a file system
        self._events = EventLog()
        self._data_warnings: set[str] = set()  # Ray Data's warnings shown, by `warning_key`
        self._history = EpochHistory()
        self._registry = WorkerRegistry(spec.batch_split)
        self._stops = StopArbiter(spec.train.epochs)
        self._startup: dict[str, float] = {}  # phase -> unix time, the first time it is reached
        # the files the folder's manifest lists are this run's: a resumed run's, or a restarted
        # recorder's (a fresh run's earlier files were set aside before it started)
        self._files_listed = self._writer.restore()
        self._journal = RecorderJournal(Path(journal))
        restarted = ray.get_runtime_context().was_current_actor_reconstructed
        acknowledged = self._journal.read() if restarted else None
        if acknowledged and tracking and acknowledged["mlflow_run_id"]:
            tracking = replace(tracking, resume_run_id=acknowledged["mlflow_run_id"])  # the same MLflow run
        self._mlflow: MlflowRecord | None = None
        if tracking:
            # the run's id is journaled as soon as it exists (the delivery thread creates the run after the
            # first step, maybe after epoch 1 on a slow machine): a recorder restarted later reopens it
            self._mlflow = MlflowRecord(spec, tracking, self._warn, on_started=self._record_journal)
        if acknowledged:
            self._carry_on(acknowledged)
            if self._mlflow and "first_step_done" in self._startup:
                self._mlflow.first_step_done()
        self._startup.setdefault("recorder_ready", time.time())  # up beside the worker group, not before it
        self._record_journal()  # at once: a restart must never read an earlier run's journal

    # -- from the workers -------------------------------------------------------------
    def register_worker(self, info: WorkerInfo) -> None:
        """Every rank of every worker group; a group of another size than the last is a resize."""
        resize, changed, complete = self._registry.register(info)
        self._record_journal()
        if resize:
            self._events.add(Resized(resize))
        if changed and self._mlflow:
            self._mlflow.workers_changed(info.world, info.global_step)
        if complete and self._mlflow:
            self._mlflow.group_complete(self._registry.workers())

    def note_failure(self, rank: int, reason: str) -> None:
        """A worker's own word on why it is about to fail (its step watchdog expired); the first stands."""
        self._registry.note_failure(rank, reason)

    def data_warning(self, text: str) -> None:
        """A worker's Ray Data warning (`data.ray_data_warnings`): on the console once, whichever worker sent it."""
        key = warning_key(text)
        if key not in self._data_warnings:
            self._data_warnings.add(key)
            self._warn(text)

    def system_metrics(self, node: str, metrics: dict, step: int, at: float) -> None:
        """A sample of a node's system metrics (`worker.system_metrics.NodeSampler`), for the MLflow run."""
        if self._mlflow:
            self._mlflow.system(node, metrics, step, at)

    def worker_pids(self, node_id: str) -> list[int]:
        """The processes of the registered workers on a node, lowest rank first (the one that samples it)."""
        return [w.pid for w in self._registry.workers() if w.node_id == node_id]  # workers() by rank

    def failure(self) -> str | None:
        return self._registry.failure

    def update_worker(self, rank: int, **end: Any) -> None:
        """A registered worker's figures at its end (its final weights' digest, memory, input waits)."""
        self._registry.update(rank, **end)
        self._record_journal()

    def log_progress(
        self, epoch: int, step: int, steps: int, loss: float, samples_per_s: float, seconds: float = 0.0
    ) -> None:
        """Rank 0's view of the running epoch: `seconds` since it began (for the console's ETA)."""
        self._events.add(Progress(epoch, step, steps, loss, samples_per_s, seconds))
        if self._mlflow:
            self._mlflow.step_loss(loss, global_step=(epoch - 1) * steps + step)

    def end_epoch(self, epoch: int, logs: dict, seconds: float) -> None:
        new = self._history.record(epoch, logs)  # re-run after a restart: identical figures, logged once
        self._record_journal()  # before MLflow's queue: a restarted recorder logs what that run lacks
        self._events.add(EpochEnded(epoch, dict(logs), seconds))
        if self._mlflow and new:
            self._mlflow.epoch(epoch, logs)

    def restore_history(self, history: list[dict]) -> None:
        """Epochs completed before a restart (from the resume checkpoint), logged once."""
        self._history.restore(history)

    def stop_after(self, epoch: int, reason: str | None = None) -> str | None:
        """Whether the run ends after `epoch`, and why (see :class:`StopArbiter`)."""
        answer = self._stops.after(epoch, reason)
        self._record_journal()
        return answer

    def mark_phase(self, phase: str, at: float) -> None:
        """Rank 0 reached a start-up phase (rayparallel.startup.PHASES) at unix time `at`."""
        self._startup.setdefault(phase, at)
        self._events.add(PhaseReached(phase))
        if phase == "first_step_done":
            self._registry.first_step_done(at)
            if self._mlflow:
                self._mlflow.first_step_done()
        self._record_journal()

    def best_value(self) -> float | None:
        """The monitor's best among saved files, so a restarted rank 0 keeps `save_best_only` right."""
        return self._writer.retention.best_value()

    @ray.method(concurrency_group="io")
    def save_checkpoint(self, weights: list[np.ndarray], saved: Saved) -> str | None:
        """The epoch's weight file; one that cannot be written (a full disk) is a warning and the
        run goes on: the earlier files and the manifest stay as they were, the next save tries again."""
        try:
            path, deleted = self._writer.save(weights, saved)
        except WriteError as exc:
            self._warn(f"epoch {saved.epoch}: {saved.file} not saved: {exc}; {free_space(self._writer.folder)}")
            if self._mlflow:
                self._mlflow.unsaved(saved.file)
            return None
        self._events.add(CheckpointWritten(saved.epoch, str(path)))
        self._log_files(path)
        if self._mlflow:
            self._mlflow.checkpoint(saved, deleted, self._writer.model_of)
        return str(path)

    @ray.method(concurrency_group="io")
    def save_final_weights(self, weights: list[np.ndarray], saved: Saved) -> str:
        path = self._writer.save_final(weights, saved)
        self._log_files(path)
        return str(path)

    @ray.method(concurrency_group="io")
    def save_resume_point(self, arrays: dict[str, np.ndarray], meta: dict) -> str:
        keep = self._spec.run.checkpoints_to_keep
        return str(resume_state.write_point_keeping(self._run_folder, arrays, meta, keep))

    @ray.method(concurrency_group="io")
    def resume_point(self) -> str | None:
        """The newest intact point in Ray's run folder, once pending writes are done; the same for every rank."""
        if self._run_folder is None:
            return None
        folder, _ = resume_state.newest_intact(resume_state.points(self._run_folder))
        return str(folder) if folder else None

    def run_folder(self) -> str | None:
        return str(self._run_folder) if self._run_folder else None

    # -- from the driver ----------------------------------------------------------------
    @ray.method(concurrency_group="io")
    def writes_done(self) -> None:
        """Returns once every save handed over before this call is written (the io group runs in order)."""

    def request_stop(self, reason: str) -> None:
        """End the run as finished after the epoch in progress; the first reason given stands."""
        self._stops.request(reason)

    def tracking_info(self, timeout: float) -> dict | None:
        """The MLflow run once it exists (waits up to `timeout`); None when tracking is off."""
        return self._mlflow.info(timeout) if self._mlflow else None

    def finish(self, status: str, files: list[str]) -> dict | None:
        """Log the run's last files and the final model, end the run as `status`."""
        if not self._mlflow:
            return None
        final_model = self._writer.final_model if self._writer.final_weights is not None else None
        best = self._writer.retention.best_entry()
        return self._mlflow.finish(status, files, self._stops.stopped, final_model, best, self._writer.model_of)

    def ping(self) -> bool:
        return True

    def announce(self, event: Event) -> None:
        """An event for the driver from a process that has no other way to it (Ray Train's controller)."""
        self._events.add(event)

    def drain(self) -> list[Event]:
        """The events since the last call; first, once, `TrackingStarted` when the MLflow run exists."""
        announced = self._mlflow.announcement() if self._mlflow else None
        if announced:
            self._record_journal()  # the MLflow run's id, for a restart to go on with
        events = self._events.drain()
        return [TrackingStarted(announced), *events] if announced else events

    def summary(self) -> RunSummary:
        writer = self._writer
        return RunSummary(
            history=self._history.as_list(),
            final_weights=str(writer.folder / writer.final.file) if writer.final else None,
            checkpoint_dir=str(writer.folder),
            checkpoints=[str(writer.folder / s.file) for s in writer.retention.saved],
            workers=self._registry.workers(),
            first_step_at=self._startup.get("first_step_done"),
            startup_marks=dict(self._startup),
            resizes=list(self._registry.resizes),
            stopped=self._stops.stopped,
        )

    # -- internals ----------------------------------------------------------------------
    def _warn(self, text: str) -> None:
        self._events.add(RunWarning(text))

    def _record_journal(self) -> None:
        had_error = self._journal.error
        written = self._journal.write(
            {
                "history": self._history.as_list(),
                "registry": self._registry.state(),
                "stops": self._stops.state(),
                "startup": self._startup,
                "mlflow_run_id": self._mlflow.run_id if self._mlflow else None,
            }
        )
        if not written and not had_error:  # once, until it can be written again
            self._warn(f"{self._journal.path} not saved: {self._journal.error}; a restarted recorder would know less")

    def _carry_on(self, acknowledged: dict) -> None:
        """After a restart: what the recorder before this one acknowledged, and MLflow's missing epochs."""
        self._history.restore(acknowledged["history"])
        self._registry.restore(acknowledged["registry"])
        self._stops.restore(acknowledged["stops"])
        self._startup.update(acknowledged["startup"])
        history = self._history.as_list()
        if self._mlflow:
            for epoch, logs in enumerate(history, start=1):
                self._mlflow.epoch(epoch, logs)  # the run skips the steps it has
        self._warn(
            f"the run's recorder was started again after its process was lost; it goes on from what it had "
            f"recorded ({len(history)} epochs, {self._files_listed} weight files)"
        )

    def _log_files(self, weights_file: Path) -> None:
        if self._mlflow:
            self._mlflow.files(weights_file, self._writer.manifest_path, folder="checkpoints")


RecorderActor = ray.remote(num_cpus=0, concurrency_groups={"io": 1})(RunRecorder)


def recorder_name(ray_run_name: str) -> str:
    """The live run's recorder is a named actor, so a sweep's scheduler (and a test) can find it."""
    return f"rayparallel:{ray_run_name}"

"""The run's recorder: the one process that writes the run's files and owns its MLflow run.

Rank 0 hands it save points with the base model's weights (NumPy arrays through Ray's
object store), resume points inside epochs and the global logs of each epoch; every rank of
every worker group registers itself (a group of another size is a resize) and asks it for
the point to resume from; the driver drains its progress events and reads the summary at
the end. Checkpoint files are
the :class:`CheckpointWriter`'s job, MLflow the :class:`MlflowRun`'s; this class only routes
and remembers. Writes run in the actor's own `io` thread, in order, while training goes on;
progress and history calls use another thread so the console stays live during a write.
It is pinned to the driver's node and works in the driver's folder, so the paths it writes
(and MLflow's default sqlite store) are the driver's. Tracking calls only queue records for
the MLflow thread, so a slow or absent server never holds up training.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from ..checkpoint import resume_state
from ..checkpoint.policy import Saved
from ..checkpoint.writer import CheckpointWriter
from ..result import describe_stop
from ..secrets import mask_text
from ..spec import JobSpec
from ..spec.references import add_search_path
from ..tracking.mlflow_run import MlflowRun
from ..tracking.params import run_params, worker_tags

if TYPE_CHECKING:
    import numpy as np


class RunRecorder:
    writer_class = CheckpointWriter  # a test swaps in a slow disk here

    def __init__(
        self,
        spec: JobSpec,
        checkpoint_dir: str,
        search_path: list[str],
        tracking: dict | None = None,
        run_folder: str | None = None,
    ):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        if search_path and os.path.isdir(search_path[0]):
            os.chdir(search_path[0])
        add_search_path(search_path)
        self._spec = spec
        self._writer = self.writer_class(spec, Path(checkpoint_dir))
        self._run_folder = Path(run_folder) if run_folder else None  # Ray's run folder, when on a file system
        self._lock = threading.Lock()
        self._events: list[dict] = []
        self._history: dict[int, dict] = {}
        self._workers: dict[int, dict] = {}
        self._startup: dict[str, float] = {}  # phase -> unix time, the first time it is reached
        self._world: int | None = None  # the live worker group's size
        self._resizes: list[dict] = []
        self._stop_reason: str | None = None  # asked for by the driver (a Tune scheduler's decision)
        self._stop_answers: dict[int, str | None] = {}  # epoch -> what every rank was told
        self._stopped: dict | None = None  # the epoch the run ended after, and why
        self._failure: str | None = None  # why the live worker group failed, as a worker saw it
        self._tracking: MlflowRun | None = None
        self._announced = False  # the driver was told the MLflow run exists
        if tracking:
            self._tracking = MlflowRun(notify=self._warn, **tracking)
            self._tracking.log_params(run_params(spec))

    # -- from the workers -------------------------------------------------------------
    def register_worker(self, info: dict) -> None:
        """Every rank of every worker group; a group of another size than the last is a resize."""
        world = info["world"]
        with self._lock:
            changed = world != self._world
            if changed and self._world is not None:
                resize = {
                    "at": time.time(),
                    "from": self._world,
                    "to": world,
                    "epoch": info["resumed_from_epoch"] + 1,
                    "step": info["resumed_from_step"],
                    "batch_from": self._spec.batch_split(self._world),
                    "batch_to": self._spec.batch_split(world),
                    "first_step_at": None,  # when the new group's rank 0 finished its first step
                }
                self._resizes.append(resize)
                self._events.append({"kind": "resize", "resize": resize})
            if changed:
                self._world = world
                self._workers = {rank: w for rank, w in self._workers.items() if rank < world}
            self._workers[info["rank"]] = info
            self._failure = None  # a new group: an earlier one's failure is not this one's
            complete = len(self._workers) == world
        if changed and self._tracking:
            self._tracking.log_metrics({"num_workers": world}, step=info["global_step"])
        if complete and self._tracking:
            self._tracking.set_tags(worker_tags(self._workers.values()))

    def note_failure(self, rank: int, reason: str) -> None:
        """A worker's own word on why it is about to fail (its step watchdog expired); the first stands."""
        with self._lock:
            self._failure = self._failure or f"rank {rank}: {reason}"

    def failure(self) -> str | None:
        return self._failure

    def update_worker(self, rank: int, info: dict) -> None:
        """More about a registered worker (its final weights' digest)."""
        with self._lock:
            self._workers.setdefault(rank, {"rank": rank}).update(info)

    def log_progress(
        self, epoch: int, step: int, steps: int, loss: float, samples_per_s: float, seconds: float = 0.0
    ) -> None:
        """Rank 0's view of the running epoch: `seconds` since it began (for the console's ETA)."""
        with self._lock:
            self._events.append(
                {
                    "kind": "progress",
                    "epoch": epoch,
                    "step": step,
                    "steps": steps,
                    "loss": loss,
                    "samples_per_s": samples_per_s,
                    "seconds": seconds,
                }
            )
        if self._tracking and self._spec.mlflow.log_step_loss:
            self._tracking.log_metrics({"step_loss": loss}, step=(epoch - 1) * steps + step)

    def end_epoch(self, epoch: int, logs: dict, seconds: float) -> None:
        with self._lock:
            repeated = epoch in self._history  # re-run after a restart: identical figures
            self._history[epoch] = dict(logs)
            self._events.append({"kind": "epoch", "epoch": epoch, "logs": dict(logs), "seconds": seconds})
        if self._tracking and not repeated:
            self._tracking.log_metrics(logs, step=epoch)

    def restore_history(self, history: list[dict]) -> None:
        """Epochs completed before a restart (from the resume checkpoint), logged once."""
        with self._lock:
            for epoch, logs in enumerate(history, start=1):
                self._history.setdefault(epoch, dict(logs))

    def stop_after(self, epoch: int, reason: str | None = None) -> str | None:
        """Whether the run ends after `epoch`, and why: a callback's `reason` (the same on every
        rank) or the driver's request. Decided at the first rank's question, so every rank gets
        the same answer and all leave the loop after the same epoch."""
        with self._lock:
            if epoch not in self._stop_answers:  # after the last epoch a stop changes nothing
                wanted = reason or self._stop_reason
                self._stop_answers[epoch] = wanted if epoch < self._spec.train.epochs else None
                if self._stop_answers[epoch] and self._stopped is None:
                    self._stopped = {"epoch": epoch, "reason": self._stop_answers[epoch]}
            return self._stop_answers[epoch]

    def mark_phase(self, phase: str, at: float) -> None:
        """Rank 0 reached a start-up phase (rayparallel.startup.PHASES) at unix time `at`."""
        with self._lock:
            self._startup.setdefault(phase, at)
            if phase == "first_step_done" and self._resizes and self._resizes[-1]["first_step_at"] is None:
                self._resizes[-1]["first_step_at"] = at

    def best_value(self) -> float | None:
        """The monitor's best among saved files, so a restarted rank 0 keeps `save_best_only` right."""
        return self._writer.retention.best_value()

    @ray.method(concurrency_group="io")
    def save_checkpoint(self, weights: list[np.ndarray], point: Saved) -> str:
        path = self._writer.save(weights, point)
        with self._lock:
            self._events.append({"kind": "checkpoint", "epoch": point.epoch, "file": str(path)})
        self._track_files(path)
        return str(path)

    @ray.method(concurrency_group="io")
    def save_final_weights(self, weights: list[np.ndarray], point: Saved) -> str:
        path = self._writer.save_final(weights, point)
        self._track_files(path)
        return str(path)

    @ray.method(concurrency_group="io")
    def save_resume_point(self, arrays: dict[str, np.ndarray], meta: dict) -> str:
        """A point inside an epoch, beside Ray's epoch ends; the oldest beyond `checkpoints_to_keep` go."""
        folder = resume_state.write_state_atomically(
            self._run_folder, resume_state.position_name(meta["epoch"], meta["step"]), arrays, meta
        )
        inside = sorted(f for f in resume_state.points(self._run_folder) if "-step-" in f.name)
        for old in inside[: -self._spec.run.checkpoints_to_keep]:
            shutil.rmtree(old, ignore_errors=True)
        return str(folder)

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
        with self._lock:
            self._stop_reason = self._stop_reason or reason

    def tracking_info(self, timeout: float) -> dict | None:
        """The MLflow run once it exists (waits up to `timeout`); None when tracking is off."""
        if not self._tracking:
            return None
        started = self._tracking.wait_started(timeout)
        return {
            "run_id": self._tracking.run_id,
            "url": self._tracking.url(),
            "started": started,
            "tracking_uri": mask_text(self._tracking.tracking_uri),
            "experiment": self._tracking.experiment,
        }

    def finish(self, status: str, files: list[str]) -> dict | None:
        """Log the run's last files and the final model, end the run as `status`."""
        if not self._tracking:
            return None
        if self._stopped:
            self._tracking.set_tags({"rayparallel.stopped_early": describe_stop(self._stopped)})
        for path in files:
            self._tracking.log_artifact(path)
        if self._writer.final_weights is not None and status == "FINISHED":
            batch_size = self._spec.mlflow.model_batch_size
            self._tracking.log_model(lambda: self._writer.final_model(batch_size), self._spec.mlflow.register_model)
        unlogged = self._tracking.finish(status, self._spec.mlflow.flush_timeout_s)
        info = self.tracking_info(0)
        path, why = (str(self._tracking.unlogged_path), self._tracking.last_error) if unlogged else (None, None)
        info.update(unlogged=unlogged, unlogged_path=path, unlogged_error=why)
        return info

    def ping(self) -> bool:
        return True

    def drain(self) -> list[dict]:
        """The events since the last call; first, once, `mlflow` when the MLflow run exists."""
        announce = self._tracking is not None and not self._announced and self._tracking.wait_started(0)
        with self._lock:
            events, self._events = self._events, []
        if announce:
            self._announced = True
            events.insert(0, {"kind": "mlflow", "info": self.tracking_info(0)})
        return events

    def summary(self) -> dict[str, Any]:
        writer = self._writer
        with self._lock:
            return {
                "history": [self._history[e] for e in sorted(self._history)],
                "final_weights": str(writer.folder / writer.final.file) if writer.final else None,
                "checkpoint_dir": str(writer.folder),
                "checkpoints": [str(writer.folder / s.file) for s in writer.retention.saved],
                "workers": [self._workers[r] for r in sorted(self._workers)],
                "first_step_at": self._startup.get("first_step_done"),
                "startup_marks": dict(self._startup),
                "resizes": list(self._resizes),
                "stopped": self._stopped,
            }

    # -- internals ----------------------------------------------------------------------
    def _warn(self, text: str) -> None:
        with self._lock:
            self._events.append({"kind": "warning", "text": text})

    def _track_files(self, weights_file: Path) -> None:
        if self._tracking:
            self._tracking.log_artifact(str(weights_file), "checkpoints")
            self._tracking.log_artifact(str(self._writer.manifest_path), "checkpoints")


RecorderActor = ray.remote(num_cpus=0, concurrency_groups={"io": 1})(RunRecorder)


def recorder_name(ray_run_name: str) -> str:
    """The live run's recorder is a named actor, so a sweep's scheduler (and a test) can find it."""
    return f"rayparallel:{ray_run_name}"

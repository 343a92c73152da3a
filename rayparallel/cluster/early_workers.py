"""The run's own worker group, started while the driver still checks the job: a sooner cold start.

A run's first step waits for its workers: Ray Train's controller and the worker processes
start, and each worker imports TensorFlow (seconds of CPU each). Started after the driver's
checks, that wait follows them; started as soon as Ray is up, it runs beside them. The group
is the run's own Ray Train run (its name, storage, scaling and restarts, as `launch` would
start it), but its workers wait for the run's worker-loop config, which exists only once the
checks passed and the recorder started: they take it from a `RunQueue`, as shared workers do
(`shared_workers.serve_runs`), and a restarted group takes the same config again.

A bad job must still leave nothing behind: when the checks fail (or Ctrl-C comes) before the
run starts, the group is ended and what this start wrote is removed (the output folder when it
was new, the lock file, Ray Train's folder of the run). Order matters: ensure the folder is
writable, take its lock (a second run into a live run's folder starts no Ray Train run
there), then start the group.

Only a fresh run on local storage whose data is not Ray Data starts early: a Ray Data job's
datasets come from its checks, and a resumed run's Ray Train folder holds its checkpoints.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import ray

from ..files import ensure_writable
from .abort import abort_training
from .run_state import LOCK_FILE, folder_held, read_run_state
from .shared_workers import SharedRun, fit_in_thread, new_queue, serve_runs

if TYPE_CHECKING:
    from ray.actor import ActorHandle

    from .run_state import RunPlan
    from .shared_workers import SharedWorkers


class EarlyWorkers:
    """The run's Ray Train run, started now; `run(config)` hands its workers the run (once)."""

    def __init__(self, plan: RunPlan):
        from .abort import ControllerAnnounced
        from .backend import TensorflowBackendConfig, make_run_config, make_scaling_config, trainer_class

        spec, state = plan.spec, plan.state
        self._queue, self._outcome = new_queue(), {}
        trainer = trainer_class()(
            serve_runs,
            backend_config=TensorflowBackendConfig(),
            train_loop_config={"queue": self._queue},
            scaling_config=make_scaling_config(spec),
            # its handle to the queue (the recorder starts later), for an abort (`SharedRun.controller`)
            run_config=make_run_config(
                spec, state.ray_run_name, state.storage_path, [ControllerAnnounced(self._queue)]
            ),
        )
        self._thread = fit_in_thread(trainer, self._outcome, "train_driver", *["elastic_driver"] * spec.scaling.elastic)

    def run(self, train_loop_config: dict) -> SharedRun:
        """The run for `launch`: handed to the workers, and the group's end after it."""
        for config in (train_loop_config, None):  # one after the other: an async actor's calls may overtake
            ray.get(self._queue.put.remote(config))
        return SharedRun(self._join, self._controller)

    def end(self) -> None:
        """After the run; or, the run not handed (its checks failed, Ctrl-C), its workers stop, however
        far they got. Then its queue goes (a process of its own)."""
        if self._thread.is_alive():
            self._queue.put.remote(None)  # workers already waiting for the run return
            abort_training(self._announced_controller(), self._thread)  # a group still starting stops
        ray.kill(self._queue)

    def _announced_controller(self) -> ActorHandle | None:
        """The controller, once it announced itself (a second or two after the start), or None when the
        group ended first."""
        while self._thread.is_alive():
            controller = self._controller()
            if controller is not None:
                return controller
            time.sleep(0.1)
        return None

    def _join(self) -> None:
        self._thread.join()
        if "error" in self._outcome:
            raise self._outcome["error"]

    def _controller(self) -> ActorHandle | None:
        return ray.get(self._queue.controller.remote())


def starts_early(plan: RunPlan) -> bool:
    """Whether the run's group may start before its checks' verdict (see the module doc)."""
    spec = plan.spec
    return plan.point is None and spec.data.dataset is None and "://" not in plan.state.storage_path


@contextlib.contextmanager
def started_early(
    plan: RunPlan, output_dir: Path, workers: SharedWorkers | None, checks_failed: bool, marks: dict[str, float]
) -> Iterator[SharedWorkers | EarlyWorkers | None]:
    """The group the run goes to: `workers` (a shared group) when given, else its own started now
    when it may (`starts_early`; not when the checks already failed), else None: `launch` starts it.
    The output folder is held from here to the block's end; see the module doc for what a failure
    before the run's start removes."""
    if workers is not None or checks_failed or not starts_early(plan):
        yield workers
        return
    run_folder = Path(plan.state.storage_path).resolve() / plan.state.ray_run_name
    new = [path for path in (_first_missing(output_dir), output_dir / LOCK_FILE, _first_missing(run_folder)) if path]
    ensure_writable(output_dir, "--output-dir")
    with folder_held(output_dir, plan.spec.name):
        group = None
        try:
            group = EarlyWorkers(plan)
            marks["workers_requested"] = time.time()
            yield group
        except BaseException:
            if group is not None:
                group.end()  # first: its controller writes into the run's folder until it ends
            started = read_run_state(output_dir)
            if started is None or started.ray_run_name != plan.state.ray_run_name:  # the run wrote nothing
                _remove(new)
            raise
        finally:
            if group is not None:
                group.end()


def _first_missing(path: Path) -> Path | None:
    """The outermost folder of `path` that does not exist yet (what making it creates), or None."""
    missing = None
    for folder in [path, *path.parents]:
        if folder.exists():
            return missing
        missing = folder
    return missing


def _remove(paths: list[Path]) -> None:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

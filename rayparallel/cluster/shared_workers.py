"""One Ray Train worker group for several runs in turn: many short runs from one process.

Every run starts five processes (its recorder, Ray Train's controller and synchronization
actor, the workers), and on a small machine their imports are most of a short run:
TensorFlow with Keras takes about 10 s of CPU in each new process, Ray Train 2.4 s.
`SharedWorkers` keeps one worker group up and runs each job's worker loop on it in turn;
everything else of a run (its checks, recorder, files, MLflow run, result) is its own, as
for any run. Between runs each worker clears Keras' session; each run builds its own
strategy, replica and optimizer, as a run does in a new process, and no worker starts a
collective before every worker has made the run's strategy (the barrier in `worker/loop.py`).

What a shared group cannot do is refused in one line (`check`): another worker count or
resources, Ray Data (a group's datasets are fixed when it starts), elastic scaling, resume
points (each run's epochs would be named alike in the group's one Ray Train run), restarts
after a failure (Ray Train would restart the group, not the run). A run that fails ends the
group (a failed collective leaves TensorFlow unusable in its processes), and so does an
abort (Ctrl-C: the workers stop mid-run); the next run starts a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import ray

from ..console import plural
from ..errors import RayParallelError

if TYPE_CHECKING:
    from ray.actor import ActorHandle

    from ..recorder.events import ControllerStarted
    from ..spec import JobSpec
    from .run_state import ResumePoint


@ray.remote(num_cpus=0)
class RunQueue:
    """The runs handed to the group, in order; every worker takes each one and says when it is done."""

    def __init__(self):
        self.configs: list[dict | None] = []
        self.finished: dict[int, set[int]] = {}
        self.arrived: set[int] = set()  # the ranks whose worker process runs: the group holds its resources
        self.changed = asyncio.Condition()
        self._controller: ActorHandle | None = None

    async def put(self, config: dict | None) -> int:
        async with self.changed:
            self.configs.append(config)
            self.changed.notify_all()
            return len(self.configs) - 1

    def arrive(self, rank: int) -> None:
        self.arrived.add(rank)

    def placed(self) -> int:
        """How many of the group's workers have started (each holds its share of the cluster from then on)."""
        return len(self.arrived)

    async def take(self, index: int) -> dict | None:
        async with self.changed:
            await self.changed.wait_for(lambda: len(self.configs) > index)
            return self.configs[index]

    async def done(self, index: int, rank: int) -> None:
        async with self.changed:
            self.finished.setdefault(index, set()).add(rank)
            self.changed.notify_all()

    def announce(self, event: ControllerStarted) -> None:
        """The group's Ray Train controller (`ControllerAnnounced`), which `controller` hands to an abort."""
        self._controller = event.handle

    def controller(self) -> ActorHandle | None:
        return self._controller

    async def wait_done(self, index: int, workers: int, timeout_s: float) -> bool:
        """Whether every worker finished run `index` within `timeout_s` (the caller polls)."""
        async with self.changed:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(
                    self.changed.wait_for(lambda: len(self.finished.get(index, ())) == workers), timeout_s
                )
            return len(self.finished.get(index, ())) == workers


def new_queue() -> ActorHandle:
    """A `RunQueue` on the driver's node, where the runs' recorders are: a queue on another node that
    is lost would take the group's runs with it."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return RunQueue.options(scheduling_strategy=here).remote()


def serve_runs(config: dict) -> None:
    """The group's train function: each worker runs the handed runs' worker loops, one after the other.

    TensorFlow is imported first, while the driver still checks the first run's job (or the
    user's cells run): rank 0 tells the first run's recorder when that happened."""
    entered = time.time()
    import ray.train

    queue, rank, index = config["queue"], ray.train.get_context().get_world_rank(), 0
    queue.arrive.remote(rank)
    import keras

    from ..worker.loop import train_loop_per_worker

    started = {"workers_started": entered, "tensorflow_imported": time.time()}
    while (run := ray.get(queue.take.remote(index))) is not None:
        if index == 0 and rank == 0:  # before the run's own marks: the recorder keeps a phase's first
            for phase, at in started.items():
                run["actor"].mark_phase.remote(phase, at)
        train_loop_per_worker(run)  # an error ends the group: Ray Train reports it as a run's error
        keras.backend.clear_session()
        ray.get(queue.done.remote(index, rank))
        index += 1


class SharedWorkers:
    """A worker group of `num_workers` kept up for the runs given to `rayparallel.cluster.run.run_job(...,
    workers=...)`: the runs whose `scaling` asks for these workers (`use_gpu`, `resources_per_worker`);
    `close()` ends it. `held_per_worker`: what each worker holds while it waits, when not what the jobs ask
    (the tests' group holds half a CPU). Its Ray Train run keeps no checkpoints (the runs keep theirs)."""

    def __init__(
        self,
        num_workers: int,
        storage_path: str,
        resources_per_worker: dict | None = None,
        use_gpu: bool = False,
        held_per_worker: dict | None = None,
    ):
        self.num_workers, self.storage_path, self.use_gpu = num_workers, storage_path, use_gpu
        self.resources_per_worker = resources_per_worker or {}  # as the jobs ask (scaling.resources_per_worker)
        self.held_per_worker = held_per_worker or resources_per_worker  # None: Ray Train's default
        self._queue = None
        self._thread: threading.Thread | None = None
        self._outcome: dict = {}
        self._placed = False
        self.started_at = float("inf")  # when `start` started it (unix time)

    @classmethod
    def for_job(cls, spec: JobSpec, storage_path: str) -> SharedWorkers:
        """A group shaped for the job's `scaling`."""
        scaling = spec.scaling
        return cls(scaling.num_workers, storage_path, scaling.resources_per_worker or None, scaling.use_gpu)

    @property
    def described(self) -> str:
        """`2 workers`, `2 workers: a GPU each`, `2 workers: a GPU each, {'CPU': 2} each`."""
        each = ["a GPU each"] * self.use_gpu + [f"{self.resources_per_worker} each"] * bool(self.resources_per_worker)
        return plural(self.num_workers, "worker") + (f": {', '.join(each)}" if each else "")

    @property
    def holds(self) -> dict[str, float]:
        """What the group's workers hold of the cluster, together (Ray Train's default: a CPU each)."""
        from .connect import need_of

        return {key: amount * self.num_workers for key, amount in need_of(self.held_per_worker, self.use_gpu).items()}

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def placed(self) -> bool:
        """Whether every worker has started: from then on the group holds what `holds` says."""
        if not self._placed and self.alive:
            self._placed = ray.get(self._queue.placed.remote()) == self.num_workers
        return self._placed

    def refusal(self, spec: JobSpec) -> str | None:
        """Why the job cannot run on these workers as on a group of its own, in one line; None when it can."""
        scaling = spec.scaling
        found = {
            "scaling.num_workers": (scaling.num_workers, self.num_workers),
            "scaling.elastic": (scaling.elastic, False),
            "scaling.use_gpu": (scaling.use_gpu, self.use_gpu),
            "scaling.resources_per_worker": (scaling.resources_per_worker or {}, self.resources_per_worker),
            "data.dataset": (spec.data.dataset, None),
            "run.resume_every_n_steps": (spec.run.resume_every_n_steps, None),
            "failure.max_failures": (spec.failure.max_failures, 0),
        }
        for key, (received, expected) in found.items():
            if received != expected:
                return f"{key}: expected {expected!r} on shared workers, received {received!r}"
        return None

    def check(self, spec: JobSpec, point: ResumePoint | None) -> None:
        """`refusal` as an error; `point`: where the run would resume (a shared group starts runs fresh)."""
        if point is not None:
            raise RayParallelError(
                f"--resume: expected a fresh run on shared workers, received a resume after {point.position}"
            )
        reason = self.refusal(spec)
        if reason:
            raise RayParallelError(reason)

    def run(self, train_loop_config: dict) -> SharedRun:
        """One run's worker loops on the group (started now when none is up); `fit()` runs them."""
        if not self.alive:
            self.start()
        config = dict(train_loop_config, resume_points=False)
        return SharedRun(functools.partial(self._train, config), lambda: ray.get(self._queue.controller.remote()))

    def _train(self, config: dict) -> None:
        """Hand the run to every worker, and wait (polling whether the group still lives) until all are done."""
        index = ray.get(self._queue.put.remote(config))
        while not ray.get(self._queue.wait_done.remote(index, self.num_workers, 1.0)):
            if not self._thread.is_alive():
                raise self._outcome.get("error") or RuntimeError("the shared worker group ended")

    def close(self) -> None:
        """Let the workers finish the run in hand, then end the group (its processes and their resources)."""
        if self.alive and ray.is_initialized():
            ray.get(self._queue.put.remote(None))
            self._thread.join(timeout=120)
        self._thread = None

    def start(self) -> None:
        """Start the group now (its workers import TensorFlow while the driver goes on); `run` waits for it."""
        from ray.train import CheckpointConfig, RunConfig, ScalingConfig

        from ..hooks import env_defaults
        from .abort import ControllerAnnounced
        from .backend import TensorflowBackendConfig, trainer_class

        self._queue, self._outcome, self._placed, self.started_at = new_queue(), {}, False, time.time()
        trainer = trainer_class()(
            serve_runs,
            backend_config=TensorflowBackendConfig(),
            train_loop_config={"queue": self._queue},
            scaling_config=ScalingConfig(
                num_workers=self.num_workers, use_gpu=self.use_gpu, resources_per_worker=self.held_per_worker
            ),
            run_config=RunConfig(
                name=f"rayparallel-shared-{uuid.uuid4().hex[:8]}",
                storage_path=self.storage_path,
                checkpoint_config=CheckpointConfig(num_to_keep=None),
                callbacks=[ControllerAnnounced(self._queue)],  # its handle, for an abort (`SharedRun.controller`)
            ),
        )
        outcome = self._outcome

        def fit() -> None:
            # Ray Train's controller reads the driver's environment when it starts, inside fit()
            with env_defaults("train_driver"):
                try:
                    trainer.fit()
                except BaseException as exc:  # handed to the run in progress
                    outcome["error"] = exc

        self._thread = threading.Thread(target=fit, name="rayparallel-shared-workers", daemon=True)
        self._thread.start()


@dataclass(frozen=True)
class SharedRun:
    """One run on shared workers, shaped as Ray Train's trainer for `launch`: `fit()` blocks until its
    worker loops end, and raises what Ray Train raised when one failed; `controller()` is the group's
    Ray Train controller (None before it started), which an abort ends with the group."""

    fit: Callable[[], None]
    controller: Callable[[], ActorHandle | None]

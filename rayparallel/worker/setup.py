"""A worker's start-up, phase by phase: strategy, data, replica, steps, epochs, restore, register.

Order matters: the strategy is created before any other TensorFlow op (MWMS requires it), the
replica and optimizer are built inside its scope, and the optimizer's all-reduce wrappers go on
in the order their comments give. `loop.WorkerRun` then runs the epochs on what it built.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from ..checkpoint.client import CheckpointClient
from ..checkpoint.policy import SaveDecision
from ..data.feed import DataSource, open_feed
from ..model import build_model
from ..result import WorkerInfo
from ..spec import JobSpec
from ..spec.schema import rank_rows
from . import compile_settings, outputs, own_step, replica, resume
from .batch_norm import BatchNormSync
from .cadence import ProgressCadence
from .callbacks import Callbacks, make_callbacks
from .memory import MemoryWatch
from .step import EpochLogs, ReplicaSteps, Steps
from .sync import (
    Reducer,
    StepWatchdog,
    average_over_workers,
    clip_after_all_reduce,
    compress_gradients,
    configure_threads,
    make_strategy,
    sum_shared_slices,
)
from .system_metrics import NodeSampler

if TYPE_CHECKING:
    from ray.actor import ActorHandle


class WorkerSetup:
    """One worker's start-up, in phases whose order matters (each phase's docstring says why)."""

    def __init__(
        self, spec: JobSpec, actor: ActorHandle, output_dir: str, source: DataSource, resume_points: bool = True
    ):
        """`resume_points=False`: epochs hand Ray Train no checkpoint (a run on shared workers)."""
        import ray.train

        context = ray.train.get_context()
        self.rank, self.world = context.get_world_rank(), context.get_world_size()
        self.spec, self.actor, self.resume_points = spec, actor, resume_points
        self._start_strategy()
        self._open_data(source)
        self._build_replica()
        self._build_steps()
        self._prepare_epochs(output_dir)
        self._restore()
        self._register()
        self.sampler = self._sample_system_metrics()

    def _start_strategy(self) -> None:
        """First of all TensorFlow: MultiWorkerMirroredStrategy must precede any other TF op."""
        import ray.train.collective

        spec = self.spec
        self._mark("workers_started")
        configure_threads(spec.scaling.resources_per_worker.get("CPU", 1))  # imports TensorFlow
        self._mark("tensorflow_imported")
        self.strategy = make_strategy(spec.scaling.use_gpu)
        # Every rank has (re)enabled TensorFlow's collectives before any rank starts one. A process that
        # ran a run before (shared workers) still serves its previous strategy's collectives until it makes
        # this one: a faster peer's first collective would meet that run's shapes there, or wait forever
        ray.train.collective.barrier()
        self.watchdog = StepWatchdog(
            spec.run.collective_timeout_s, lambda reason: self.actor.note_failure.remote(self.rank, reason)
        )
        self._mark("strategy_ready")

    def _open_data(self, source: DataSource) -> None:
        """The probe builds (batch-shaped variables) before the seed, so the replica starts as in one
        process; memory is measured from before any data."""
        import keras

        spec = self.spec
        sizes = spec.worker_batch_sizes(self.world)  # an elastic run's world differs from start to start
        self.batch_local = replica.batch_dependent_variables(spec.model, sizes, spec.train.dtype_policy)
        keras.utils.set_random_seed(spec.train.seed)
        self.global_batch, self.per_worker = spec.train.global_batch_size, sizes[self.rank]
        self.memory = MemoryWatch()
        self.reducer = Reducer(self.strategy)
        self.feed = open_feed(source, spec, self.rank, self.world, self.reducer.gather)
        self._mark("data_loaded")

    def _build_replica(self) -> None:
        """The replica, its optimizer and compile's loss and metrics inside the strategy's scope; then the
        optimizer's all-reduce wrappers, in the order the comments give."""
        spec = self.spec
        with self.strategy.scope(), replica.kept_local(self.batch_local):
            self.model = build_model(spec.model, self.per_worker, spec.train.dtype_policy)
            train = compile_settings.resolve(spec.train, self.model, check=False)  # the driver checked
            self.own = own_step.overridden(self.model)
            self.optimizer = compile_settings.make_optimizer(train.optimizer)
            self.output_names = names = outputs.output_names(self.model)
            self.sample_y = outputs.targets_by_output(self.feed.sample_y, names, "train")
            # every step reads compile's loss and metrics (a model's own also self.optimizer): built before its trace
            compile_settings.compile_model(self.model, self.optimizer, train)
            self.model._symbolic_build(
                data_batch=outputs.first_rows((self.feed.sample_x, self.sample_y), self.per_worker)
            )
            self.optimizer.build(self.model.trainable_variables)  # not lazily inside the compiled step
        compile_settings.accumulate_schedule(self.optimizer, spec.train.gradient_accumulation_steps)
        sum_shared_slices(self.optimizer)  # first: compression casts, then averages, then clips what it sums
        compress_gradients(self.optimizer, spec.train.gradient_compression)
        average_over_workers(self.optimizer, self.world)  # before: clipping acts on the mean
        clip_after_all_reduce(self.optimizer)  # after: clipping acts on the summed, cast-back gradient
        replica.seed_per_rank(self.model, spec.train.seed, self.rank)
        self.batch_norm = BatchNormSync(self.model, spec.train.batch_norm, self.world)  # before the step's trace
        self._mark("replica_built")

    def _build_steps(self) -> None:
        """The compiled steps (ours, or the model's own) and the figures they give."""
        spec = self.spec
        self.steps: ReplicaSteps
        if self.own:
            self.steps = own_step.OwnSteps(self.strategy, self.model)
            self.epoch_logs = own_step.OwnStepLogs(self.steps, self.reducer, self.rank, self.world)
            return
        self.steps = Steps(
            self.strategy,
            self.model,
            self.optimizer,
            replica.use_jit(spec.train.jit_compile, self.model),
            spec.train.loss_scale,
            spec.train.gradient_accumulation_steps,
        )
        self.epoch_logs = EpochLogs(self.steps, self.reducer, self.rank, self.world)

    def _prepare_epochs(self, output_dir: str) -> None:
        spec = self.spec
        self.stateful = replica.stateful_layers(self.model)
        rows = rank_rows(self.global_batch, self.world, self.rank)
        self.epoch_state = resume.EpochState(self.steps, self.reducer, self.stateful, rows, self.global_batch)
        self.steps_per_epoch = self.feed.steps
        self.cadence = ProgressCadence(self.steps_per_epoch, spec.train.progress_every_n_steps)
        self.decision = SaveDecision(spec.checkpoint)
        made = make_callbacks(spec.train.callbacks, self.rank, output_dir)
        params = {"epochs": spec.train.epochs, "steps": self.steps_per_epoch, "verbose": 0}
        self.callbacks = Callbacks(made, self.model, self.optimizer, params)
        self.client = CheckpointClient(self.actor) if self.rank == 0 else None

    def _restore(self) -> None:
        """Local or mounted storage: the recorder names the newest intact point (epoch ends and the
        steps between), after its pending writes, so every rank restores the same one."""
        import ray
        import ray.train

        actor, local = self.actor, self.spec.run.local_storage
        self.run_folder = ray.get(actor.run_folder.remote()) if local else None
        found = ray.get(actor.resume_point.remote()) if local else None
        point = resume.read_point(found, None if local else ray.train.get_checkpoint()) if self.resume_points else None
        arrays, meta = point or ({}, {"epoch": 0, "history": []})
        if point:
            resume.restore(arrays, meta, self.strategy, self.model, self.optimizer)
        self.start_epoch, self.start_step = meta["epoch"], meta.get("step", 0)
        self.resume_arrays = arrays if self.start_step else None  # the running epoch, loaded once it starts
        self.history: list[dict] = meta["history"]
        if point and self.rank == 0:
            ray.get(actor.restore_history.remote(self.history))
        self.decision.best = ray.get(actor.best_value.remote())

    def _register(self) -> None:
        import ray

        self.actor.register_worker.remote(
            WorkerInfo(
                rank=self.rank,
                world=self.world,
                node_id=ray.get_runtime_context().get_node_id(),
                pid=os.getpid(),
                gpu_ids=[str(g) for g in ray.get_gpu_ids()],
                batch_shape=replica.batch_shapes(self.model),
                resumed_from_epoch=self.start_epoch,
                resumed_from_step=self.start_step,
                global_step=self.start_epoch * self.steps_per_epoch + self.start_step,
                memory=self.memory.megabytes(),
            )
        )

    def _sample_system_metrics(self) -> NodeSampler | None:
        """Last, once training is about to start: the node's lowest rank samples it for MLflow."""
        import ray

        interval = self.spec.mlflow.system_metrics_interval_s
        if not (self.spec.mlflow.enabled and interval):
            return None
        actor, node_id = self.actor, ray.get_runtime_context().get_node_id()
        node = node_id[:8]  # as the console's placement line names it

        def send(metrics: dict, step: int, at: float) -> None:
            actor.system_metrics.remote(node, metrics, step, at)

        def worker_pids() -> list[int]:
            return ray.get(actor.worker_pids.remote(node_id), timeout=5)

        return NodeSampler(interval, send, worker_pids).start()

    def _mark(self, phase: str) -> None:
        """Rank 0 tells the recorder when a start-up phase ended (rayparallel.startup)."""
        if self.rank == 0:
            self.actor.mark_phase.remote(phase, time.time())

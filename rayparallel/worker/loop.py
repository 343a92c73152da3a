"""The loop every Ray Train worker runs: build the replica, feed its rows, sync, report.

Order matters: the strategy is created before any other TensorFlow op (MWMS requires
it), the replica and optimizer are built inside its scope, and every rank takes part in
every collective (steps, progress reductions, epoch logs, weight reads) the same number
of times, otherwise the collectives hang. Decisions that gate a collective (progress
steps, checkpoint saves) are computed identically on every rank from global figures.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..checkpoint.client import CheckpointClient
from ..checkpoint.policy import FINAL, Saved, SaveDecision
from ..checkpoint.resume_state import position_name, unused_name
from ..data.feed import DataSource, open_feed
from ..data.ray_data_warnings import ray_data_warnings_sent
from ..errors import NonFiniteLossError
from ..logs import LOSS_SCALE, OWN_KEYS
from ..model import build_model
from ..result import WorkerInfo
from ..spec import JobSpec
from ..spec.references import add_search_path
from ..spec.schema import rank_rows
from . import compile_objects, compiled, outputs, own_step, replica, resume
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


def train_loop_per_worker(config: dict) -> None:
    """Entry point handed to Ray Train (`DataParallelTrainer(train_loop_per_worker=...)`)."""
    add_search_path(config["search_path"])
    spec, actor = config["spec"], config["actor"]
    with contextlib.ExitStack() as stack:
        if spec.data.dataset is not None:  # Ray Data's warnings (a starved read) reach the console
            stack.enter_context(ray_data_warnings_sent(actor.data_warning.remote))
        WorkerRun(spec, actor, config["output_dir"], config["source"], config.get("resume_points", True)).fit()


class WorkerRun:
    """One worker's run, built in phases whose order matters (each phase's docstring says why)."""

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
            train = compiled.resolve(spec.train, self.model, check=False)  # the driver checked
            self.own = own_step.overridden(self.model)
            self.optimizer = compile_objects.make_optimizer(train.optimizer)
            self.output_names = names = outputs.output_names(self.model)
            self.sample_y = outputs.targets_by_output(self.feed.sample_y, names, "train")
            # every step reads compile's loss and metrics (a model's own also self.optimizer): built before its trace
            compiled.compile_model(self.model, self.optimizer, train)
            self.model._symbolic_build(
                data_batch=outputs.first_rows((self.feed.sample_x, self.sample_y), self.per_worker)
            )
            self.optimizer.build(self.model.trainable_variables)  # not lazily inside the compiled step
        compile_objects.accumulate_schedule(self.optimizer, spec.train.gradient_accumulation_steps)
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

    def fit(self) -> None:
        try:
            self._fit()
        except BaseException:
            self.watchdog.disarm()  # unwinding: the watchdog need not end the process
            if self.client is not None:  # hand over saves already made: they belong to good epochs
                self.client.flush(raise_errors=False)
            raise
        finally:
            if self.sampler is not None:
                self.sampler.stop()

    def _fit(self) -> None:
        import ray
        import ray.train

        logs: dict = {}
        self.callbacks.on_train_begin()
        for epoch in range(self.start_epoch + 1, self.spec.train.epochs + 1):
            self.callbacks.on_epoch_begin(epoch)
            started = time.perf_counter()
            skip = self.start_step if epoch == self.start_epoch + 1 else 0  # resumed inside this epoch
            logs = self.train_epoch(epoch, skip)
            self._check_finite(epoch)
            self.batch_norm.agree(self.reducer)  # before validation, which normalizes with them
            seconds = time.perf_counter() - started
            logs["samples_per_s"] = self._rows_trained(skip) / seconds
            if self.steps.loss_scale is not None:
                logs[LOSS_SCALE] = float(self.steps.loss_scale.value.numpy())
            logs["input_wait_fraction"] = min(1.0, self.feed.wait_s / seconds)
            if self.feed.val_steps:
                logs.update(self.evaluate())
            stop = self._callbacks_epoch_end(epoch, logs)
            self.history.append(logs)
            if self.rank == 0:
                self.actor.end_epoch.remote(epoch, logs, seconds)
            weights = resume.snapshot(self.model.weights)
            optimizer_values = resume.snapshot(self.optimizer.variables)
            if self.spec.checkpoint.save_freq == "epoch":
                self.save(weights, epoch, epoch * self.steps_per_epoch, self.steps_per_epoch, logs)
            checkpoint = None
            if self.rank == 0 and self.resume_points:
                meta = {"epoch": epoch, "history": self.history}
                checkpoint = resume.to_checkpoint(weights, optimizer_values, meta)
            ray.train.report(
                dict(logs, epoch=epoch),
                checkpoint=checkpoint,
                checkpoint_dir_name=self._point_name(epoch),
                delete_local_checkpoint_after_upload=checkpoint is not None,
            )
            if ray.get(self.actor.stop_after.remote(epoch, stop)):  # the same answer on every rank
                break

        self.watchdog.disarm()
        # as fit, before on_train_end: an optimizer with use_ema leaves the moving averages in the model
        self.optimizer.finalize_variable_values(self.model.trainable_variables)
        self.callbacks.on_train_end(dict(logs))  # EarlyStopping(restore_best_weights) restores here
        weights = self.model.get_weights()  # every rank reads, see resume.snapshot
        # replicas in step hold identical weights: result.json shows each rank's digest
        ray.get(
            self.actor.update_worker.remote(
                self.rank,
                final_weights_sha256=resume.digest(weights),
                memory=self.memory.megabytes(),
                epoch_start_wait_s=self.feed.epoch_start_waits,
            )
        )
        if self.rank == 0:
            self.client.flush()
            epochs = len(self.history)  # train.epochs, or fewer when the run was stopped early
            final = Saved(file=FINAL, epoch=epochs, step=epochs * self.steps_per_epoch, logs=logs)
            ray.get(self.actor.save_final_weights.remote(weights, final))

    def train_epoch(self, epoch: int, skip: int = 0) -> dict:
        """One epoch; `skip` steps of it were done before a restart (their state is in `resume_arrays`)."""
        spec, steps_per_epoch = self.spec, self.steps_per_epoch
        replica.reset_states(self.stateful)
        self.steps.reset()
        if skip:
            self.epoch_state.load(self.resume_arrays, skip, self.rank)
        self.cadence.start_epoch()
        save_every = spec.checkpoint.save_freq if isinstance(spec.checkpoint.save_freq, int) else 0
        resume_every = spec.run.resume_every_n_steps or 0
        started = time.perf_counter()
        self.feed.wait_s = 0.0
        first = epoch == self.start_epoch + 1
        for step, (x, y, w) in enumerate(self.feed.train(epoch), start=1):
            if step <= skip:
                continue
            y = outputs.targets_by_output(y, self.output_names, "train")
            global_step = (epoch - 1) * steps_per_epoch + step
            train_step, rows = self.steps.step(global_step), self.feed.batch_at(step, self.global_batch)
            if first and step == skip + 1:
                train_step.get_concrete_function(x, y, w, rows)  # trace apart from the run, to time both
                self._mark("first_step_traced")
            train_step(x, y, w, rows)
            self.watchdog.beat()  # armed from the first finished step: tracing is not timed
            if first and step == skip + 1:
                self._mark("first_step_done")
            if self.cadence.due(step):
                seconds = time.perf_counter() - started
                done = self.feed.rows_through(step, self.global_batch)
                loss = self.epoch_logs.running_loss(done, seconds)  # a collective: every rank calls it
                self.cadence.observe(self.epoch_logs.rank0_seconds, step)
                self._check_finite(epoch)
                if self.rank == 0:
                    self.actor.log_progress.remote(epoch, step, steps_per_epoch, loss, done / seconds, seconds)
                self.callbacks.on_train_batch_end(step, {"loss": loss})
            if save_every and global_step % save_every == 0:
                running = {"loss": self.epoch_logs.running_loss(self.feed.rows_through(step, self.global_batch))}
                self.batch_norm.agree(self.reducer)
                self.save(resume.snapshot(self.model.weights), epoch, global_step, step, running)
            if resume_every and global_step % resume_every == 0 and step < steps_per_epoch:  # ends: Ray's
                self.save_resume_point(epoch, step)
        return self.epoch_logs.collect(self.feed.rows_through(steps_per_epoch, self.global_batch))

    def _rows_trained(self, skip: int) -> int:
        """The global rows of this epoch's steps past the `skip` done before a restart."""
        return self.feed.rows_through(self.steps_per_epoch, self.global_batch) - skip * self.global_batch

    def _callbacks_epoch_end(self, epoch: int, logs: dict) -> str | None:
        """The callbacks see the epoch's global logs with Keras' keys, and may add to them
        (ReduceLROnPlateau: learning_rate); returns why a callback stopped training, if one did."""
        keras_logs = {k: v for k, v in logs.items() if k not in OWN_KEYS}
        self.callbacks.on_epoch_end(epoch, keras_logs)
        logs.update(keras_logs)
        reason = self.callbacks.stop_reason
        if self.spec.train.callbacks:  # a writer runs on rank 0 only and may stop: every rank must hear of it
            (stopped,) = self.reducer.sum([np.array([1.0 if reason else 0.0])])
            if stopped[0] and not reason:
                reason = "a callback on rank 0 stopped training"
        return reason

    def save_resume_point(self, epoch: int, step: int) -> None:
        """Every rank snapshots and gathers (collectives); rank 0 hands the point to the recorder."""
        self.batch_norm.agree(self.reducer)
        weights = resume.snapshot(self.model.weights)
        optimizer_values = resume.snapshot(self.optimizer.variables)
        running = self.epoch_state.gather()
        if self.client is not None:
            meta = dict(
                epoch=epoch - 1, step=step, history=list(self.history), **resume.counts(weights, optimizer_values)
            )
            self.client.save_resume_point(resume.state_arrays(weights, optimizer_values, running), meta)

    def _point_name(self, epoch: int) -> str:
        """Ray's folder for an epoch end: never a name a damaged point still holds (Ray deletes by name)."""
        name = position_name(epoch)
        return unused_name(Path(self.run_folder), name) if self.run_folder else name

    def _mark(self, phase: str) -> None:
        """Rank 0 tells the recorder when a start-up phase ended (rayparallel.startup)."""
        if self.rank == 0:
            self.actor.mark_phase.remote(phase, time.time())

    def _check_finite(self, epoch: int) -> None:
        """Every rank sees the same reduced figures, so all stop together, before any save; with
        Keras' TerminateOnNaN the run ends as finished after the epoch instead, as `fit` does."""
        step = self.epoch_logs.nonfinite_step
        if step and self.spec.train.on_nan == "stop" and self.callbacks.ends_on_nan:
            self.callbacks.on_train_batch_end(step, {"loss": float("nan")})  # ends the run after this epoch
        elif step and self.spec.train.on_nan == "stop":
            raise NonFiniteLossError(
                f"train.on_nan: expected finite losses, received NaN/inf at epoch {epoch}, step {step}; stopped "
                f"before saving (the newest checkpoint is from epoch {epoch - 1}). Lower the learning rate, "
                "check the data (data.check_finite: true), or set train.on_nan: ignore"
            )

    def evaluate(self) -> dict:
        """Validation on every worker's own rows; states reset before and after."""
        replica.reset_states(self.stateful)
        self.steps.reset()
        for step, (x, y, w) in enumerate(self.feed.val(), start=1):
            rows = self.feed.batch_at(step, self.global_batch, val=True)
            self.steps.eval_step(x, outputs.targets_by_output(y, self.output_names, "val"), w, rows)
            self.watchdog.beat()
        replica.reset_states(self.stateful)
        rows = self.feed.rows_through(self.feed.val_steps, self.global_batch, val=True)
        return self.epoch_logs.collect(rows, prefix="val_")

    def save(self, weights: list, epoch: int, step: int, batch: int, logs: dict) -> None:
        """Same decision on every rank (global logs); only rank 0 ships the weights."""
        saved = self.decision.to_save(epoch, step, batch, logs)
        if saved is not None and self.client is not None:
            self.client.save(weights, saved)

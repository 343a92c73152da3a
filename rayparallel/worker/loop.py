"""The loop every Ray Train worker runs once its start-up (`setup`) is done: feed its rows, sync, report.

Order matters: every rank takes part in every collective (steps, progress reductions, epoch
logs, weight reads) the same number of times, otherwise the collectives hang. Decisions that
gate a collective (progress steps, checkpoint saves) are computed identically on every rank
from global figures.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..checkpoint.policy import FINAL, Saved
from ..checkpoint.resume_state import position_name, unused_name
from ..data.ray_data_warnings import ray_data_warnings_sent
from ..errors import NonFiniteLossError
from ..logs import LOSS_SCALE, OWN_KEYS
from ..spec.references import add_search_path
from . import outputs, replica, resume
from .setup import WorkerSetup

if TYPE_CHECKING:
    pass


def train_loop_per_worker(config: dict) -> None:
    """Entry point handed to Ray Train (`DataParallelTrainer(train_loop_per_worker=...)`)."""
    add_search_path(config["search_path"])
    spec, actor = config["spec"], config["actor"]
    with contextlib.ExitStack() as stack:
        if spec.data.dataset is not None:  # Ray Data's warnings (a starved read) reach the console
            stack.enter_context(ray_data_warnings_sent(actor.data_warning.remote))
        WorkerRun(spec, actor, config["output_dir"], config["source"], config.get("resume_points", True)).fit()


class WorkerRun(WorkerSetup):
    """One worker's run once its start-up is done (`WorkerSetup`): the epochs, their saves and reports."""

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

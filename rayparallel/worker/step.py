"""One training step and one evaluation step, run on this worker's rows inside `strategy.run`.

The loss and the metrics are Keras' own: the model's `compute_loss` (compile's loss, loss weights
and per-output losses, masks, sample weights, each loss's reduction, the regularizers) and
`compute_metrics` (`metrics`, `weighted_metrics`), traced under `global_batch_losses`, so each
worker's loss is what one process computes over the *global* batch's divisors, and the optimizer
averages the workers' gradients (`sync.average_over_workers`): the gradient one device would
compute for the whole global batch. Metric states accumulate locally and are summed over workers
only when logs are needed (see :class:`EpochLogs`).

Options for GPU workers: `jit_compile` runs forward and backward as one XLA program (the
gradient all-reduce and the update stay outside it); `LossScale` is dynamic loss scaling
for `mixed_float16`, decided on global figures so every worker skips the same steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..hooks import hook
from .loss_reduction import global_batch_losses
from .sync import Reducer, step_inputs

if TYPE_CHECKING:
    import keras
    import tensorflow as tf


def on_replicas(strategy: tf.distribute.Strategy, replica_step: Any) -> Any:
    """`replica_step(x, y, w, global_batch)` compiled to run on every worker's rows, its Keras losses traced as
    one process computes them over the step's global batch (`global_batch_losses`): the one contract of every
    step. The compiled function is called as `(x, y, w, global_batch)`: a Python int, so a shorter last batch
    is traced apart (a worker's rows alone cannot tell it: 16 rows on 3 workers are 6, 5, 5 and 15 are 5, 5, 5)."""
    import tensorflow as tf

    def traced(x, y, w, global_batch):
        rows = int(tf.nest.flatten(y)[0].shape[0])  # this worker's, known when the step is traced
        with global_batch_losses(global_batch, rows, strategy.num_replicas_in_sync), step_inputs(x, y, w):
            return replica_step(x, y, w, global_batch)

    return tf.function(lambda x, y, w, global_batch: strategy.run(traced, args=(x, y, w, global_batch)))


class ReplicaSteps:
    """What the loop, `EpochLogs` and resume points read of any kind of step (`Steps`, `own_step.OwnSteps`).

    `train_step` and `eval_step` are compiled (`on_replicas`) and called as `(x, y, w, global_batch)`;
    `step(global_step)` names the one for a training step. The counters live in the replica's variables so
    the compiled steps update them: `steps_run` this epoch, `first_nonfinite` (the 1-based step of the
    first non-finite loss, 0: none), and `loss_total`, this worker's share of the loss summed over the
    global batches' rows (0 where the model's own step keeps its loss in its logs).
    """

    loss_scale: LossScale | None = None
    train_step: Any
    eval_step: Any

    def __init__(self, model: keras.Model):
        import tensorflow as tf

        self.model = model
        self.metrics = model.metrics  # built: the worker ran Keras' symbolic build before
        self.loss_total = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.steps_run = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.first_nonfinite = tf.Variable(0, dtype=tf.int64, trainable=False)

    def step(self, global_step: int) -> Any:
        """The compiled step for this global step (1-based)."""
        return self.train_step

    def _count(self, loss: tf.Tensor) -> None:
        """In the compiled step: one more step run, and the first whose loss is not finite."""
        import tensorflow as tf

        self.steps_run.assign_add(1)
        first = tf.logical_and(tf.logical_not(tf.math.is_finite(loss)), tf.equal(self.first_nonfinite, 0))
        self.first_nonfinite.assign(tf.where(first, self.steps_run, self.first_nonfinite))

    def reset(self) -> None:
        self.loss_total.assign(0.0)
        self.steps_run.assign(0)
        self.first_nonfinite.assign(0)
        self.model.reset_metrics()


class Steps(ReplicaSteps):
    """Keras' loss and metrics in rayparallel's compiled steps (the module doc): updates, accumulation, loss
    scaling; `loss_total` weighs each batch's loss by its rows, as Keras' loss tracker does."""

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        jit_compile: bool = False,
        initial_loss_scale: float | None = None,
        accumulation_steps: int = 1,
    ):
        import tensorflow as tf

        super().__init__(model)
        self.loss_scale = LossScale(initial_loss_scale) if initial_loss_scale is not None else None
        self.optimizer = optimizer
        self.replicas, self.accumulation_steps = strategy.num_replicas_in_sync, accumulation_steps
        # gradient accumulation: k-1 steps add their gradients here (no collective), the k-th applies
        # the mean of all k, as Keras' optimizer with gradient_accumulation_steps=k does in one process
        self.accumulated = (
            [tf.Variable(tf.zeros_like(v), trainable=False) for v in model.trainable_variables]
            if accumulation_steps > 1
            else []
        )
        self._forward_backward = (
            tf.function(self._gradients, jit_compile=True) if jit_compile else self._gradients
        )  # XLA: forward and backward; the gradient all-reduce and the update stay outside it

        # `w`: None or the sample (or class) weights, as `fit` passes them to compute_loss and compute_metrics
        self.train_step = on_replicas(strategy, self._train_replica)
        self.accumulate_step = on_replicas(strategy, self._accumulate_replica)
        self.eval_step = on_replicas(strategy, self._eval_replica)

    def _loss(self, x: Any, y: Any, y_pred: Any, w: Any, training: bool) -> tf.Tensor:
        return self.model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=w, training=training)

    def _gradients(self, x: Any, y: Any, w: Any) -> tuple:
        import tensorflow as tf

        with tf.GradientTape() as tape:
            y_pred = self.model(x, training=True)
            loss = self._loss(x, y, y_pred, w, training=True)
            scaled = loss * self.loss_scale.value if self.loss_scale is not None else loss
        return loss, y_pred, tape.gradient(scaled, self.model.trainable_variables)

    def _accumulate_replica(self, x: Any, y: Any, w: Any, global_batch: int) -> None:
        loss, y_pred, grads = self._forward_backward(x, y, w)
        for total, grad in zip(self.accumulated, grads, strict=True):
            total.assign_add(grad)
        self._after_step(loss, x, y, y_pred, w, global_batch)

    def _train_replica(self, x: Any, y: Any, w: Any, global_batch: int) -> None:
        import tensorflow as tf

        loss, y_pred, grads = self._forward_backward(x, y, w)
        variables = self.model.trainable_variables
        if self.accumulated:
            steps = self.accumulation_steps
            grads = [(total + grad) / steps for total, grad in zip(self.accumulated, grads, strict=True)]
            for total in self.accumulated:
                total.assign(tf.zeros_like(total))
        if self.loss_scale is not None:
            self.loss_scale.apply(self.optimizer, grads, variables)
        else:
            self.optimizer.apply_gradients(zip(grads, variables, strict=True))
        self._after_step(loss, x, y, y_pred, w, global_batch)

    def _eval_replica(self, x: Any, y: Any, w: Any, global_batch: int) -> None:
        y_pred = self.model(x, training=False)
        self._record(self._loss(x, y, y_pred, w, training=False), x, y, y_pred, w, global_batch)

    def step(self, global_step: int) -> Any:
        """The compiled step for this global step (1-based): an update, or an accumulation."""
        return self.train_step if global_step % self.accumulation_steps == 0 else self.accumulate_step

    def _after_step(self, loss: tf.Tensor, x: Any, y: Any, y_pred: Any, w: Any, global_batch: int) -> None:
        self._record(loss, x, y, y_pred, w, global_batch)
        self._count(loss)

    def _record(self, loss: tf.Tensor, x: Any, y: Any, y_pred: Any, w: Any, global_batch: int) -> None:
        """This worker's share of the global loss (its loss is the global one's estimate times the workers)
        weighted by the step's global rows, and the model's metrics, updated as Keras' own step updates them."""
        import tensorflow as tf

        self.loss_total.assign_add(tf.cast(loss, tf.float64) * (global_batch / self.replicas))
        self.model.compute_metrics(x, y, y_pred, sample_weight=w)


class LossScale:
    """Dynamic loss scaling (Keras' `LossScaleOptimizer` rules) that stays in step across workers.

    Keras' own wrapper checks each worker's local gradients, so one worker could skip a step
    that another applies, and their all-reduces would no longer pair up. Here the count of
    workers with non-finite gradients is summed first; all skip, or all apply.
    """

    def __init__(self, initial: float, growth_steps: int = 2000):
        import tensorflow as tf

        self.value = tf.Variable(initial, dtype=tf.float32, trainable=False)
        self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.growth_steps = growth_steps

    def apply(self, optimizer: keras.optimizers.Optimizer, scaled_grads: list, variables: list) -> None:
        import tensorflow as tf

        grads = [g / tf.cast(self.value, g.dtype) for g in scaled_grads]
        local_bad = tf.cast(
            tf.logical_not(tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])), tf.float32
        )
        bad = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, local_bad)

        def skip():
            self.value.assign(self.value * 0.5)
            self.good_steps.assign(0)

        def update(grads):
            optimizer.apply_gradients(zip(grads, variables, strict=True))
            grow = self.good_steps + 1 >= self.growth_steps
            self.value.assign(tf.where(grow, self.value * 2.0, self.value))
            self.good_steps.assign(tf.where(grow, tf.constant(0, tf.int64), self.good_steps + 1))

        if hook("no_merge_call")():
            tf.cond(bad > 0, skip, lambda: update(grads))
            return

        def in_cross_replica_context(distribution, grads, bad):
            # the optimizer's update calls merge_call, which a cond in replica context cannot hold
            bad = distribution.experimental_local_results(bad)[0]
            tf.cond(bad > 0, skip, lambda: distribution.extended.call_for_each_replica(update, args=(grads,)))

        tf.distribute.get_replica_context().merge_call(in_cross_replica_context, args=(grads, bad))


class EpochLogs:
    """Global loss and metrics: local states summed over all workers, then Keras' `result()`.

    Each reduction also gathers every rank's first non-finite training step, so all ranks
    learn of a NaN at the same point and stop together (`nonfinite_step`, 0 when none), and
    rank 0's time in the epoch (`rank0_seconds`), so all ranks pace their pauses alike.
    """

    def __init__(self, steps: ReplicaSteps, reducer: Reducer, rank: int, world: int):
        self._steps, self._reducer = steps, reducer
        self._rank, self._world = rank, world
        self.nonfinite_step = 0
        self.rank0_seconds = 0.0

    def running_loss(self, rows_done: int, seconds: float = 0.0) -> float:
        """The mean loss so far this epoch over its `rows_done` global rows; `seconds` is this rank's time in it."""
        total, _ = self._reduce([], seconds)
        return total / max(rows_done, 1)

    def collect(self, rows_done: int, prefix: str = "") -> dict[str, float]:
        """The loss (each step's weighted by its global rows, as Keras' loss tracker weighs it) and the model's
        metrics (Keras' names: `<output>_loss`, `<output>_<metric>` with several outputs), over the whole
        global batch of every step."""
        metrics = self._steps.metrics
        variables = [v for m in metrics for v in m.variables]
        total, summed = self._reduce([v.numpy() for v in variables])
        for variable, value in zip(variables, summed, strict=True):
            variable.assign(np.asarray(value).astype(variable.dtype))
        logs, _ = metric_results(metrics)
        logs["loss"] = total / max(rows_done, 1)  # Keras' loss tracker is not fed: `loss_total` holds it
        return {prefix + key: value for key, value in logs.items()}

    def _reduce(self, arrays: list, seconds: float = 0.0) -> tuple[float, list]:
        slots = np.zeros(self._world)
        slots[self._rank] = self._steps.first_nonfinite.numpy()
        own_seconds = seconds if self._rank == 0 else 0.0
        total, slots, rank0_seconds, *summed = self._reducer.sum(
            [self._steps.loss_total.numpy(), slots, own_seconds] + arrays
        )
        bad = [int(s) for s in slots if s > 0]
        self.nonfinite_step = min(bad) if bad else 0
        self.rank0_seconds = float(rank0_seconds)
        return float(total), summed


def metric_results(metrics: list[keras.metrics.Metric]) -> tuple[dict[str, float], set[str]]:
    """The results as `Model.get_metrics_result` names them (compile's metrics by their keys), and the keys
    of metrics some step fed (summed states not all zero); a metric never built has no result."""
    results, updated = {}, set()
    for metric in metrics:
        try:
            result = metric.result()
        except ValueError:  # Keras: "Cannot get result() since the metric has not yet been built"
            continue
        named = result if isinstance(result, dict) else {metric.name: result}
        results.update({key: float(np.asarray(value)) for key, value in named.items()})
        if any(np.any(np.asarray(v.numpy()) != 0) for v in metric.variables):
            updated.update(named)
    return results, updated

"""A model's own `train_step`, `test_step` or `compute_metrics`, run on every worker as one process runs it.

Each worker calls the model's step on its rows as `Steps` calls the model's loss: Keras'
per-replica loss scaling off (`global_batch_losses`), and the optimizer averages the gradients
over the workers (`sync.average_over_workers`). Keras' losses in the step divide by the global batch's divisors
(a padding mask's kept tokens counted over all workers: `loss_reduction`); for them, and for
any other mean over the batch's rows (`ops.mean`) with equal shards, the average of the
workers' gradients is the gradient of the global batch, and the model's trackers see the values they would
see in one process; Keras' own contract (losses scaled by 1/N, gradients summed) gives the
same gradients but trackers fed the scaled loss report 1/N of it. The trackers' states are
summed over the workers whenever figures are needed, so the logs are global figures,
weighted as the trackers weigh them (rows, not a mean of per-worker means). Logs whose keys are
not exactly the metrics' results are taken as `fit` takes them: a fed metric's result, any other
log (a raw loss tensor) the value of the epoch's last step, averaged over the workers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ModelError, first_line
from .step import EpochLogs, ReplicaSteps, metric_results, on_replicas

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from ..spec import JobSpec

# The steps a Keras model may override that rayparallel then runs as the model's own (`OwnSteps`)
OWN_STEPS = ("train_step", "test_step", "compute_metrics")
# Called by `Steps` as Keras' own train_step calls it: the model's override, or Keras' compile loss
OWN_LOSS = ("compute_loss",)


def overridden(model: keras.Model, names: tuple[str, ...] = OWN_STEPS) -> list[str]:
    import keras

    return [name for name in names if getattr(type(model), name, None) is not getattr(keras.Model, name)]


def check_job(spec: JobSpec, model: keras.Model) -> None:
    """What of rayparallel's own step machinery a model's step cannot use: refused, never ignored. A model's
    own `compute_loss` runs in rayparallel's step (all of it applies), but its means over rows are its own.
    Sample and class weights reach a model's own step as `fit` passes them (`packed`)."""
    steps, loss = overridden(model), overridden(model, OWN_LOSS)
    if not (steps or loss):
        return
    train = spec.train
    refused = [
        (train.gradient_accumulation_steps > 1, "train.gradient_accumulation_steps", "1"),
        (train.dtype_policy == "mixed_float16", "train.dtype_policy", "float32 or mixed_bfloat16 (no loss scaling)"),
        (train.jit_compile is True, "train.jit_compile", "auto or false"),
    ]
    uneven = (len(set(spec.possible_batch_sizes)) > 1, "scaling.num_workers", "a divisor of train.global_batch_size")
    for refuse, key, wanted in (refused if steps else []) + [uneven]:  # only compute_loss: the rest is our step
        if refuse:
            raise ModelError(
                f"{key}: expected {wanted} for a model with its own {', '.join(steps or loss)} (its step cannot "
                f"apply rayparallel's version of it exactly), received {_setting(spec, key)}"
            )


def packed(x: Any, y: Any, w: Any) -> tuple:
    """A step's `data` as `fit` hands it over: `(x, y)`, or `(x, y, sample_weight)` when there are weights
    (`keras.utils.unpack_x_y_sample_weight` reads either)."""
    return (x, y) if w is None else (x, y, w)


def _setting(spec: JobSpec, key: str) -> Any:
    if key == "scaling.num_workers":
        return f"{spec.scaling.num_workers} (uneven shards: a mean of per-worker means is not the global mean)"
    return getattr(spec.train, key.split(".")[1])


def trial_step(model: keras.Model, data: tuple, val_data: tuple | None, own: bool) -> tuple[list[str], list[str]]:
    """The model's steps once, in the driver, on one worker's rows (`data`, as Keras names a step's
    argument, `packed`): the history keys they give. Without a step of its own, `Steps` computes Keras' loss and
    metrics as its `test_step` does: that one, which makes no update, gives the keys."""
    keys = _logs_keys(model, "train_step" if own else "test_step", data)
    val_keys = [f"val_{k}" for k in _logs_keys(model, "test_step", val_data)] if val_data is not None else []
    return keys, val_keys


def _logs_keys(model: keras.Model, step: str, data: tuple) -> list[str]:
    model.reset_metrics()
    try:
        logs = getattr(model, step)(data)
    except Exception as exc:  # the user's code: any error, named with its first line
        raise ModelError(
            f"model.{step}: expected a step that runs on a batch of {'(x, y, sample_weight)' if len(data) == 3 else '(x, y)'}, "
            f"received {type(exc).__name__}: "
            f"{first_line(exc)}"
        ) from None
    if not isinstance(logs, dict) or not logs:
        raise ModelError(f"model.{step}: expected a dict of logs (as Keras' own step returns), received {logs!r}")
    bad = [key for key, value in logs.items() if np.ndim(np.asarray(value)) != 0]
    if bad:
        raise ModelError(f"model.{step}: expected scalar logs, received non-scalar values for {bad}")
    model.reset_metrics()
    return list(logs)


class OwnSteps(ReplicaSteps):
    """The model's steps inside `strategy.run`; figures from its metrics and its logs (`OwnStepLogs`)."""

    def __init__(self, strategy: tf.distribute.Strategy, model: keras.Model):
        super().__init__(model)
        self.strategy = strategy

        def train_replica(x, y, w, global_batch):
            logs = model.train_step(packed(x, y, w))
            if "loss" in logs:
                self._count(logs["loss"])
            else:
                self.steps_run.assign_add(1)
            return _scalars(logs)

        def eval_replica(x, y, w, global_batch):
            return _scalars(model.test_step(packed(x, y, w)))

        self.train_step = KeepsLast(on_replicas(strategy, train_replica))
        self.eval_step = KeepsLast(on_replicas(strategy, eval_replica))


def _scalars(logs: dict) -> dict:
    import tensorflow as tf

    return {key: tf.cast(tf.reshape(value, ()), tf.float64) for key, value in logs.items()}


class KeepsLast:
    """A compiled step that keeps the logs it returned last (this worker's values of its last step)."""

    def __init__(self, function: Any):
        self.function, self.last = function, {}

    def get_concrete_function(self, *args: Any) -> Any:
        return self.function.get_concrete_function(*args)

    def __call__(self, *args: Any) -> None:
        self.last = self.function(*args)


class OwnStepLogs(EpochLogs):
    """The model's logs made global: a metric's result from its states summed over all workers, any
    other log (a raw loss tensor) the workers' mean of their last step's value, as `fit` keeps the last."""

    def running_loss(self, rows_done: int, seconds: float = 0.0) -> float:
        return self._global_logs(self._steps.train_step.last, seconds).get("loss", float("nan"))

    def collect(self, rows_done: int, prefix: str = "") -> dict[str, float]:
        step = self._steps.eval_step if prefix else self._steps.train_step
        return {prefix + key: value for key, value in self._global_logs(step.last).items()}

    def _global_logs(self, last: dict, seconds: float = 0.0) -> dict[str, float]:
        """The local states come back afterwards: the epoch goes on, and a later sum must not count twice.

        Every rank reduces the same arrays (its metric states and its last logs, whatever they are), so
        which logs count as metric results is decided on the summed states, alike on every rank.
        """
        metrics = self._steps.metrics
        variables = [v for m in metrics for v in m.variables]
        local = [np.asarray(v.numpy()) for v in variables]
        own = self._steps.strategy.experimental_local_results
        values = np.asarray([float(own(value)[0]) for value in last.values()])
        _, summed = self._reduce(local + [values], seconds)
        means = dict(zip(last, np.asarray(summed[-1]) / self._world, strict=True))
        for variable, value in zip(variables, summed, strict=False):
            variable.assign(np.asarray(value).astype(variable.dtype))
        results, updated = metric_results(metrics)
        for variable, value in zip(variables, local, strict=True):
            variable.assign(value)
        if set(last) == set(results):  # fit's rule (`_get_metrics_result_or_logs`): the metrics' results
            return {key: results[key] for key in last}
        return {key: results[key] if key in updated else float(means[key]) for key in last}

"""The optimizer, loss and metrics `compile` would give this worker's replica, from the job's names.

The optimizer is the step's. Loss and metrics are resolved the way `Model.compile` resolves
their names, to refuse a wrong one in one line before training (`outputs.check_settings`);
the model's own `compile` then computes them (`step`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import DataError, SpecError, first_line
from .loss_reduction import keras_loss

if TYPE_CHECKING:
    import keras
    import numpy as np


def make_optimizer(identifier: str | dict) -> keras.optimizers.Optimizer:
    import keras

    identifier = _with_schedule(identifier)
    try:
        return keras.optimizers.get(identifier)
    except (ValueError, TypeError) as exc:
        raise SpecError(
            f"train.optimizer: expected a Keras optimizer name or {{class_name, config}}, received {identifier!r} ({exc})"
        ) from None


def accumulate_schedule(optimizer: keras.optimizers.Optimizer, steps: int) -> None:
    """With gradient accumulation, Keras' optimizer counts Adam's steps per update but feeds its
    learning-rate schedule the count of batches; ours counts updates, so the schedule is asked
    for the batch count of each update (update u is batch u*k + k-1), as Keras asks it."""
    import keras

    schedule = optimizer._learning_rate
    if steps <= 1 or not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
        return

    class PerBatch(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, update):
            return schedule(update * steps + steps - 1)

        def get_config(self):
            return {"schedule": keras.optimizers.schedules.serialize(schedule), "steps": steps}

    optimizer._learning_rate = PerBatch()


def _with_schedule(identifier: str | dict) -> str | dict:
    """`learning_rate: {class_name: CosineDecay, config: {...}}` as users write it, made the
    `keras.optimizers.schedules` object Keras' optimizer config needs (it only finds its own
    classes there when the dict also names their module)."""
    import keras

    rate = identifier.get("config", {}).get("learning_rate") if isinstance(identifier, dict) else None
    if not isinstance(rate, dict):
        return identifier
    try:
        schedule = keras.optimizers.schedules.deserialize(rate)
        if not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
            raise ValueError(f"not a class of keras.optimizers.schedules: {rate.get('class_name')!r}")
    except (ValueError, TypeError) as exc:
        first = first_line(exc)
        raise SpecError(
            "train.optimizer.config.learning_rate: expected a number or a keras.optimizers.schedules class as "
            f"{{class_name, config}} (CosineDecay, ExponentialDecay, ...), received {rate!r} ({first})"
        ) from None
    return {**identifier, "config": {**identifier["config"], "learning_rate": schedule}}


def make_loss(identifier: str | dict) -> keras.losses.Loss:
    """The Keras `Loss` `compile` makes of a name, a {class_name, config} or a live object."""
    try:
        loss = keras_loss(identifier)
    except (ValueError, TypeError) as exc:
        raise SpecError(
            f"train.loss: expected a Keras loss name or {{class_name, config}}, received {identifier!r} ({exc})"
        ) from None
    if loss is None:
        raise SpecError(f"train.loss: expected a Keras loss name or {{class_name, config}}, received {identifier!r}")
    return loss


_ACCURACY = ("accuracy", "acc")


def check_targets(loss: str | dict, y: np.ndarray, output_shape: tuple, output: str = "") -> None:
    """Targets must have the model output's shape for the loss: Keras would broadcast a (b, 5)
    target against a (b, 1) output and train on something else without a word."""
    name = loss if isinstance(loss, str) else loss.get("class_name", "") if isinstance(loss, dict) else ""
    name = name.lower().replace("_", "")
    if not name or name not in _KNOWN_LOSSES:
        return  # a user's loss decides for itself
    target, out = tuple(y.shape[1:]), tuple(output_shape[1:])
    if "sparse" in name:  # integer labels: the output has one more axis (the classes)
        fits = target in (out[:-1], out[:-1] + (1,))
        wanted = f"{out[:-1]} (class indices)"
    else:
        fits = target == out or target + (1,) == out
        wanted = str(out)
    if not fits:
        which = f"[{output!r}]" if output else ""
        raise DataError(
            f"data.loader: expected y_train{which} rows of shape {wanted} to match the model's output {out} for the "
            f"loss {name!r}, received rows of shape {target}"
        )


_KNOWN_LOSSES = {
    "meansquarederror",
    "mse",
    "meanabsoluteerror",
    "mae",
    "huber",
    "logcosh",
    "meansquaredlogarithmicerror",
    "msle",
    "meanabsolutepercentageerror",
    "mape",
    "binarycrossentropy",
    "categoricalcrossentropy",
    "sparsecategoricalcrossentropy",
    "binaryfocalcrossentropy",
    "categoricalfocalcrossentropy",
    "kldivergence",
    "kld",
    "poisson",
    "cosinesimilarity",
    "hinge",
    "squaredhinge",
}


def make_metrics(
    identifiers: list, loss: str | dict, y_example: np.ndarray, output_shape: tuple
) -> list[keras.metrics.Metric]:
    """Keras metric objects, named as `compile(metrics=...)` names them in the history."""
    import keras

    metrics = []
    for identifier in identifiers:
        if isinstance(identifier, str) and identifier in _ACCURACY:
            metrics.append(_accuracy(identifier, loss, y_example, output_shape))
            continue
        try:
            metric = keras.metrics.get(identifier)
        except (ValueError, TypeError) as exc:
            raise SpecError(
                f"train.metrics: expected Keras metric names or {{class_name, config}}, received {identifier!r} ({exc})"
            ) from None
        if not isinstance(metric, keras.metrics.Metric):
            metric = keras.metrics.MeanMetricWrapper(metric, name=getattr(metric, "__name__", str(identifier)))
        if isinstance(identifier, str) and metric.name != identifier:
            metric = type(metric)(name=identifier)  # history keys as compile names them: "mae"
        metrics.append(metric)
    names = [m.name for m in metrics]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise SpecError(f"train.metrics: expected distinct metric names, received {sorted(duplicates)} more than once")
    return metrics


def _accuracy(name: str, loss: str | dict, y_example: np.ndarray, output_shape: tuple) -> keras.metrics.Metric:
    """The accuracy Keras' compile picks for this loss and these shapes."""
    import keras

    loss_name = loss if isinstance(loss, str) else str(loss.get("class_name", "")) if isinstance(loss, dict) else ""
    loss_name = loss_name.lower().replace("_", "")
    if "binary" in loss_name or output_shape[-1] == 1:
        return keras.metrics.BinaryAccuracy(name=name)
    if "sparse" in loss_name or y_example.ndim < len(output_shape) or y_example.shape[-1] == 1:
        return keras.metrics.SparseCategoricalAccuracy(name=name)
    return keras.metrics.CategoricalAccuracy(name=name)

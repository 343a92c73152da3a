"""The pieces `compile` would have given this worker's replica: optimizer, loss, metrics.

The replica itself is built by `rayparallel.model.build_model` with the per-worker batch,
inside the strategy's scope. Loss and metrics are resolved the way `Model.compile` resolves their
names, so history keys match what Keras users see from `fit`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import SpecError

if TYPE_CHECKING:
    import keras
    import numpy as np


def use_jit(setting: bool | str, model: keras.Model) -> bool:
    """`train.jit_compile`: "auto" is Keras' own rule: XLA on GPU workers when every layer supports it
    (on CPUs XLA made this machine's VGG step 35% slower)."""
    import tensorflow as tf

    if setting != "auto":
        return bool(setting)
    layers_ok = all(getattr(layer, "supports_jit", True) for layer in model._flatten_layers())
    return bool(tf.config.list_physical_devices("GPU")) and layers_ok


def batch_shapes(model: keras.Model) -> list[list]:
    """The input shapes the replica was built with, as plain lists for result.json."""
    return [list(t.shape) for t in model.inputs]


def stateful_layers(model: keras.Model) -> list[keras.layers.Layer]:
    return [layer for layer in model._flatten_layers() if getattr(layer, "stateful", False)]


def reset_states(layers: list[keras.layers.Layer]) -> None:
    for layer in layers:
        layer.reset_state()


def make_optimizer(identifier: str | dict) -> keras.optimizers.Optimizer:
    import keras

    try:
        return keras.optimizers.get(identifier)
    except (ValueError, TypeError) as exc:
        raise SpecError(
            f"train.optimizer: expected a Keras optimizer name or {{class_name, config}}, received {identifier!r} ({exc})"
        ) from None


def per_sample_loss(identifier: str | dict) -> Callable:
    """A function (y_true, y_pred) -> one loss value per row, before any batch reduction."""
    import keras
    from keras import ops

    try:
        loss = keras.losses.get(identifier)
    except (ValueError, TypeError) as exc:
        raise SpecError(
            f"train.loss: expected a Keras loss name or {{class_name, config}}, received {identifier!r} ({exc})"
        ) from None
    if loss is None:
        raise SpecError(f"train.loss: expected a Keras loss name or {{class_name, config}}, received {identifier!r}")
    elementwise = loss.call if isinstance(loss, keras.losses.Loss) else loss

    def rows(y_true, y_pred):
        values = elementwise(y_true, ops.cast(y_pred, "float32"))
        if len(values.shape) > 1:
            values = ops.mean(ops.reshape(values, (ops.shape(values)[0], -1)), axis=1)
        return values

    return rows


_ACCURACY = ("accuracy", "acc")


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

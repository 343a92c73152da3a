"""A model's outputs and what `compile` gives each: its loss, loss weight and metrics, checked.

One output is the common case (`loss: mse`, `metrics: [mae]`, history keys `loss`, `mae`).
With several, the job keys `train.loss`, `train.loss_weights` and `train.metrics` by output
name as `compile` does, the targets are a dict keyed by output name (or a tuple in output
order), and the history uses Keras' names: `loss` (the weighted sum), `<output>_loss`,
`<output>_<metric>`. Keras' `compile` computes them all (`step`); here the job's settings are
checked first, so a wrong one is refused in one line before training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import DataError, SpecError, describe
from . import compile_objects

if TYPE_CHECKING:
    import keras

    from ..spec import TrainSpec


def output_names(model: keras.Model) -> list[str]:
    return list(model.output_names)


def per_output(value: Any) -> bool:
    """A dict keyed by output name, not a Keras identifier such as {class_name, config}."""
    return isinstance(value, dict) and "class_name" not in value


def targets_by_output(y: Any, names: list[str], split: str) -> Any:
    """The loader's targets in output order: one array for one output, else a tuple."""
    if len(names) == 1 and not isinstance(y, (dict, tuple)):
        return y
    if isinstance(y, dict):
        if set(y) != set(names):
            raise DataError(
                f"data.loader: expected y_{split} keyed by the model's outputs {names}, received keys {sorted(y)}"
            )
        y = tuple(y[name] for name in names)
    if not isinstance(y, tuple) or len(y) != len(names):
        raise DataError(
            f"data.loader: expected y_{split} as a dict keyed by output name (or a tuple in output order) for a "
            f"model with outputs {names}, received {describe(y)}"
        )
    return y if len(names) > 1 else y[0]


def check_settings(train: TrainSpec, model: keras.Model, y: Any) -> None:
    """Each output's loss, weight and metrics, checked against the targets `y` (in output order): keys by
    output name, names Keras resolves, targets of the output's shape, one history key per metric."""
    names = output_names(model)
    ys = list(y) if len(names) > 1 else [y]
    shapes = [tuple(output.shape) for output in model.outputs]
    losses = _by_output(train.loss, names, "train.loss", required=True)
    _weights(train.loss_weights, names)  # checked: compile takes them as given
    metrics = _by_output(train.metrics, names, "train.metrics", required=False, default=[])
    weighted = _by_output(train.weighted_metrics, names, "train.weighted_metrics", required=False, default=[])
    for name, y_k, shape in zip(names, ys, shapes, strict=True):
        compile_objects.check_targets(losses[name], y_k, shape, name if len(names) > 1 else "")
        prefix = f"{name}_" if len(names) > 1 else ""
        made, made_weighted = (
            [(prefix + m.name, m) for m in compile_objects.make_metrics(given[name] or [], losses[name], y_k, shape)]
            for given in (metrics, weighted)
        )
        shared = sorted({n for n, _ in made} & {n for n, _ in made_weighted})
        if shared:
            raise SpecError(
                f"train.weighted_metrics: expected names apart from train.metrics' (they share one history), "
                f"received {shared} in both"
            )
        compile_objects.make_loss(losses[name])


def first_rows(structure: Any, rows: int) -> Any:
    """The first `rows` rows of arrays nested as `fit` takes them (dicts, tuples); text as TensorFlow strings
    (Keras' symbolic build knows no NumPy object dtype)."""
    import keras
    import numpy as np
    import tensorflow as tf

    def first(array: Any) -> Any:
        array = np.asarray(array)[:rows]
        return tf.constant(array) if array.dtype.kind in "OSU" else array

    return keras.tree.map_structure(first, structure)


def _by_output(value: Any, names: list[str], key: str, required: bool, default: Any = None) -> dict[str, Any]:
    if not per_output(value):
        return dict.fromkeys(names, value)  # one loss (or one metrics list) for every output, as compile does
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise SpecError(f"{key}: expected keys among the model's outputs {names}, received {unknown}")
    missing = [name for name in names if name not in value]
    if required and missing:
        raise SpecError(f"{key}: expected a loss for every output {names}, received none for {missing}")
    return {name: value.get(name, default) for name in names}


def _weights(value: Any, names: list[str]) -> dict[str, float]:
    if value is None:
        return dict.fromkeys(names, 1.0)
    if isinstance(value, list):
        if len(value) != len(names):
            raise SpecError(
                f"train.loss_weights: expected one weight per output {names}, received {len(value)} ({value})"
            )
        return dict(zip(names, map(float, value), strict=True))
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise SpecError(f"train.loss_weights: expected keys among the model's outputs {names}, received {unknown}")
        return {name: float(value.get(name, 1.0)) for name in names}
    raise SpecError(f"train.loss_weights: expected a dict keyed by output name or a list, received {describe(value)}")

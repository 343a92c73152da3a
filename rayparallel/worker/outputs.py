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

from ..errors import DataError, describe

if TYPE_CHECKING:
    import keras


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

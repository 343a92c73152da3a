"""`rayparallel.fit`'s loaders: the arrays (or PyDatasets) it was given, returned as a loader returns
them, or the functions that build its tf.data pipelines.

The driver calls `InMemoryData` once and puts the arrays in Ray's object store, where the
workers of a node read them without a copy (`launch.shared_with_workers`); a PyDataset goes to
the batch server. Pickled with the spec (to the workers, the recorder), it carries none of them:
the arrays are never sent once per task. A tf.data pipeline cannot be sent to another process at
all, so `fit` takes the function that builds it (`DatasetFunctions`), and every worker builds it
as a job's loader would, as tf.distribute's `dataset_fn` is used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import DataError, describe, first_line


def fit_loader(
    x: Any, y: Any, validation_data: Any, sample_weight: Any, validation_split: float = 0.0
) -> Callable[[], dict[str, Any]]:
    """The job's `data.loader` for `model.fit`'s data arguments."""
    from .keras_inputs import is_dataset

    if validation_split and validation_data is None:  # as fit: validation_data wins over validation_split
        if (callable(x) and not is_dataset(x)) or is_dataset(x):
            raise DataError(
                f"validation_split: expected arrays x (fit splits only arrays), received {describe(x)}; pass "
                "validation_data instead"
            )
        (x, y, sample_weight), validation_data = split_off_validation((x, y, sample_weight), validation_split)
    if callable(x) and not is_dataset(x):
        return DatasetFunctions(x, y, validation_data, sample_weight)
    return InMemoryData(fit_data(x, y, validation_data, sample_weight))


def split_off_validation(arrays: tuple, validation_split: float) -> tuple[tuple, tuple]:
    """`fit(validation_split=...)`'s split, by Keras' own function: the last fraction of the rows (before any
    shuffle) is the validation data. Returns the training arrays and `validation_data`."""
    from ..hooks import hook

    if (
        isinstance(validation_split, bool)
        or not isinstance(validation_split, (int, float))
        or not 0 < validation_split < 1
    ):
        raise DataError(f"validation_split: expected a fraction between 0 and 1, received {validation_split!r}")
    try:
        train, val = hook("keras_train_validation_split")(arrays, validation_split=validation_split)
    except ValueError as exc:  # Keras: too few rows for the split
        raise DataError(
            f"validation_split: expected rows on both sides of the split, received {first_line(exc)}"
        ) from None
    return train, tuple(a for a in val if a is not None)


class DatasetFunctions:
    """A loader over functions that return `fit`'s datasets (tf.data or PyDataset), called where it runs."""

    def __init__(self, x: Callable[[], Any], y: Any, validation_data: Any, sample_weight: Any):
        for key, value in (("y", y), ("sample_weight", sample_weight)):
            if value is not None:
                raise DataError(
                    f"{key}: expected None with a function x (its dataset's batches hold it), received {describe(value)}"
                )
        if validation_data is not None and not callable(validation_data):
            raise DataError(
                "validation_data: expected a function that returns the validation dataset beside a function x, "
                f"received {describe(validation_data)}"
            )
        self._x, self._validation = x, validation_data

    def __call__(self) -> dict[str, Any]:
        out = {"x_train": self._built("x", self._x)}
        if self._validation is not None:
            out["x_val"] = self._built("validation_data", self._validation)
        return out

    @staticmethod
    def _built(key: str, function: Callable[[], Any]) -> Any:
        from .keras_inputs import is_dataset

        dataset = function()
        if not is_dataset(dataset):
            raise DataError(
                f"{key}: expected a function that returns a tf.data.Dataset or a keras.utils.PyDataset, "
                f"received one that returned {describe(dataset)}"
            )
        return dataset


class InMemoryData:
    """A loader over data held by the process that called `rayparallel.fit`."""

    def __init__(self, out: dict[str, Any] | None):
        self._out = out

    def __call__(self) -> dict[str, Any]:
        if self._out is None:
            raise DataError(
                "data.loader: expected rayparallel.fit's data in the process that called fit, received a copy "
                "without it (a pickled InMemoryData carries no arrays)"
            )
        return self._out

    def __reduce__(self) -> tuple:
        return (InMemoryData, (None,))

    def __deepcopy__(self, memo: dict) -> InMemoryData:
        return self  # `JobSpec.to_dict` copies the spec: the arrays stay one


def fit_data(x: Any, y: Any, validation_data: Any, sample_weight: Any) -> dict[str, Any]:
    """`model.fit`'s data arguments as a loader's dict (`x_train`, `y_train`, `x_val`, ...)."""
    from .keras_inputs import is_dataset, is_tf_data

    for key, value in (("x", x), ("validation_data", validation_data)):
        if is_tf_data(value):
            raise DataError(
                f"{key}: expected arrays, a keras.utils.PyDataset or the function that returns the tf.data.Dataset "
                f"({key}=make_dataset: each worker builds it), received a tf.data.Dataset (a pipeline cannot be "
                "sent to another process)"
            )
    if is_dataset(x):
        if y is not None or sample_weight is not None:
            raise DataError("y: expected None with a PyDataset x (its batches hold the targets), as fit says")
        out: dict[str, Any] = {"x_train": x}
    else:
        if y is None:
            raise DataError(f"y: expected the targets of x's rows, received None beside x of {_rows(x)} rows")
        if _rows(x) != _rows(y):
            raise DataError(f"y: expected as many rows as x ({_rows(x)}), received {_rows(y)}")
        out = {"x_train": x, "y_train": y}
        if sample_weight is not None:
            out["sample_weight_train"] = sample_weight
    if validation_data is None:
        return out
    if is_dataset(validation_data):
        return {**out, "x_val": validation_data}
    if not isinstance(validation_data, tuple) or len(validation_data) not in (2, 3):
        raise DataError(
            "validation_data: expected (x_val, y_val), (x_val, y_val, sample_weight_val) or a PyDataset, "
            f"received {type(validation_data).__name__}"
        )
    out.update(x_val=validation_data[0], y_val=validation_data[1])
    if len(validation_data) == 3:
        out["sample_weight_val"] = validation_data[2]
    return out


def _rows(value: Any) -> int:
    """Rows of an array, or of the first array of a tuple, list or dict of them (the loader's checks say more)."""
    first = value
    while isinstance(first, (tuple, list, dict)) and first:
        first = next(iter(first.values())) if isinstance(first, dict) else first[0]
    if not hasattr(first, "__len__") or isinstance(first, (str, bytes)):
        raise DataError(
            f"x: expected arrays (or a tuple or dict of them) as fit takes them, received {describe(value)}"
        )
    return len(first)

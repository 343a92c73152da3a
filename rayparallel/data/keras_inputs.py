"""A loader's `tf.data.Dataset` or `keras.utils.PyDataset`, fed as `fit(x=dataset)` feeds it.

The dataset's batches are the global batches (a user who calls `fit(ds)` batched it with
the global batch). Every worker reads them in the dataset's own order and trains on its
contiguous slice of each (`rank_rows`), so any worker count trains `fit`'s model, stateful
streams included. A final short batch is dropped on every worker alike. A PyDataset's
batches are loaded once for all workers (`batch_server`); a `tf.data` pipeline runs on every
worker, as tf.distribute's DATA auto-shard does; a loader with a `shard` argument may build
each worker's own pipeline at the per-worker batch instead (the fast path: then every row
of its batches is the worker's).

As in `fit`, with `train.steps_per_epoch` the dataset is read on across epochs (an infinite
`repeat()` needs it); without it, each epoch reads the dataset from its start.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DataError, SpecError, describe, first_line
from .batch_server import pass_read, served


@dataclass
class Split:
    """One split's dataset and how many global batches an epoch (or a validation) takes of it."""

    dataset: Any  # None where a batch server holds it
    steps: int
    length: int | None  # batches in the dataset; None: unknown or infinite
    first: tuple  # (x, y, w or None) of its first batch, as NumPy
    read_on: bool  # train.steps_per_epoch given: the next epoch goes on where this one stopped


@dataclass
class KerasInput:
    train: Split
    val: Split | None


def is_dataset(value: Any) -> bool:
    """A `tf.data.Dataset` or a `keras.utils.PyDataset` (`Sequence`), without importing either."""
    tf, keras = sys.modules.get("tensorflow"), sys.modules.get("keras")
    return bool(
        (tf is not None and isinstance(value, tf.data.Dataset))
        or (keras is not None and isinstance(value, keras.utils.PyDataset))
    )


def open_input(out: dict, batch_size: int, steps_per_epoch: int | None, validation_steps: int | None) -> KerasInput:
    """The loader's datasets, checked on their first (and last) batch, never read whole."""
    for name in ("y_train", "y_val", "sample_weight_train", "sample_weight_val"):
        if out.get(name) is not None:
            raise DataError(
                f"data.loader: expected no {name} beside a dataset x_{name.rpartition('_')[2]} (its elements are "
                f"(x, y[, sample_weight]), as fit takes them), received {name}"
            )
    train = _split(out["x_train"], "train", batch_size, steps_per_epoch, "steps_per_epoch")
    val = None
    if out.get("x_val") is not None:
        if not is_dataset(out["x_val"]):
            raise DataError(f"data.loader: expected x_val as a dataset like x_train, received {describe(out['x_val'])}")
        val = _split(out["x_val"], "val", batch_size, validation_steps, "validation_steps")
    elif validation_steps is not None:
        raise SpecError(f"train.validation_steps: expected validation data (x_val), received {validation_steps}")
    return KerasInput(train, val)


def _split(dataset: Any, name: str, batch_size: int, given: int | None, key: str) -> Split:
    length = _length(dataset)
    if length == 0:
        raise DataError(f"data.loader: expected x_{name} with at least one batch, received an empty {_kind(dataset)}")
    first = _element(dataset, 0, name)
    rows = _rows(first)
    if rows != batch_size:
        raise DataError(
            f"data.loader: expected x_{name} batched with the global batch size {batch_size} (train."
            f"global_batch_size), received batches of {rows} rows"
        )
    if given is not None:
        if length is not None and given > length:
            raise SpecError(f"train.{key}: expected at most the {length} batches of x_{name}, received {given}")
        return Split(dataset, given, length, first, read_on=True)
    if length is None:
        raise SpecError(
            f"train.{key}: expected a number of steps for x_{name}, a {_kind(dataset)} of unknown or infinite "
            "length (as fit needs), received none"
        )
    steps = length - (length > 1 and _rows(_element(dataset, length - 1, name)) < batch_size)  # a short last one
    return Split(dataset, steps, length, first, read_on=False)


def _kind(dataset: Any) -> str:
    return "tf.data.Dataset" if is_tf_data(dataset) else type(dataset).__name__


def is_tf_data(dataset: Any) -> bool:
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(dataset, tf.data.Dataset)


def _length(dataset: Any) -> int | None:
    """Batches in the dataset; None: unknown or infinite."""
    if is_tf_data(dataset):
        cardinality = int(dataset.cardinality())
        return cardinality if cardinality >= 0 else None
    return len(dataset) if getattr(dataset, "num_batches", 1) is not None else None


def _element(dataset: Any, index: int, name: str) -> tuple:
    """Batch `index`, as (x, y, w or None) of NumPy arrays."""
    try:
        if is_tf_data(dataset):
            element = next(iter(dataset.skip(index).take(1).as_numpy_iterator()))
        else:
            element = dataset[index]
    except Exception as exc:  # the user's pipeline or __getitem__: named with its first line
        raise DataError(
            f"data.loader: expected x_{name} to give batch {index}, received {type(exc).__name__}: {first_line(exc)}"
        ) from None
    return unpacked(element, name)


def unpacked(element: Any, name: str) -> tuple:
    if not isinstance(element, (tuple, list)) or len(element) not in (2, 3):
        raise DataError(
            f"data.loader: expected x_{name} elements (x, y) or (x, y, sample_weight), as fit takes them, "
            f"received {describe(element)}"
        )
    import keras

    x, y, *w = (keras.tree.map_structure(np.asarray, part) for part in element)
    return x, y, (w[0] if w else None)


def _rows(batch: tuple) -> int:
    import keras

    return int(np.shape(keras.tree.flatten(batch[1])[0])[0])


def global_batches(
    split: Split, name: str, first_pass: int = 0, seed: list[int] | None = None, server=None, workers: int = 1
) -> Iterator[tuple]:
    """The dataset's batches from its start, forever when it is read on across epochs (`read_on`).

    A PyDataset's batches come from the `server` (`batch_server`), if there is one, else from the
    dataset itself; with a `seed` in an order drawn from it and the pass, the same on every
    worker, as `fit(shuffle=True)` shuffles a PyDataset's batches (a tf.data pipeline shuffles
    itself, if it does: `fit` leaves its order alone).
    """
    if is_tf_data(split.dataset):
        while True:
            for element in split.dataset.as_numpy_iterator():
                yield unpacked(element, name)
            if not split.read_on:
                return
    keys = batch_keys(name, split.length, first_pass, split.read_on, seed)
    if server is not None:
        elements = served(server, keys, workers)
    else:
        elements = (_local(split.dataset, key) for key in keys)
    for element in elements:
        yield unpacked(element, name)


def batch_keys(name: str, length: int | None, first_pass: int, read_on: bool, seed: list[int] | None) -> Iterator:
    """(split, pass, batch index, last of its pass) of each batch to read, in reading order."""
    for passes in itertools.count(first_pass):
        order = range(length) if length is not None else itertools.count()
        if seed is not None and length is not None:
            order = np.random.default_rng([*seed, passes]).permutation(length)
        for position, index in enumerate(order):
            yield name, passes, int(index), length is not None and position == length - 1
        if not read_on:
            return


def _local(dataset: Any, key: tuple) -> Any:
    element = dataset[key[2]]
    pass_read(dataset, key)
    return element


def epoch_batches(batches: Iterator[tuple], steps: int, batch_size: int) -> Iterator[tuple]:
    """The next `steps` full batches of `batches`: a short one is passed over (every worker sees it alike)."""
    full = (batch for batch in batches if _rows(batch) == batch_size)
    return itertools.islice(full, steps)

"""Stateful streams, exactly: one Ray task per worker carries its streams' states in time order.

Worker r owns the contiguous streams `[start, stop)` (as in training, `rank_rows`). It builds
the model for a group of its streams (all of them, or `predict.batch_size` at a time), and
for each window t predicts row j of the batch from stream j's window t: a stateful layer's
row j state is stream j's alone, so the states carried from call to call are the streams'
own. Each group starts from zero states (or from the states at the end of the training rows,
`--continue-states`). Rows a group lacks (a shorter stream, the last group's spare rows) are
filled with a copy of a real row and their outputs dropped: rows never mix.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..data.shards import leaves
from .batches import built_model, padded
from .output import named_outputs, output_table

if TYPE_CHECKING:
    import ray.data

    from ..spec import ModelSpec

CHUNK_ROWS = 16384  # predictions per table the task yields: the driver writes (and counts) them as they come


def loader_windows(rows: int, streams: int, start: int, stop: int) -> np.ndarray:
    """`index[t, j]`: the row of window t of stream `start + j`, in a loader's layout (row t*S + i).

    >>> loader_windows(rows=6, streams=3, start=1, stop=3).tolist()
    [[1, 2], [4, 5]]
    """
    return np.arange(rows).reshape(rows // streams, streams)[:, start:stop]


def dataset_windows(stream: np.ndarray, t: np.ndarray, start: int, stop: int) -> np.ndarray:
    """`index[t, j]` of a dataset's rows (their `stream` and `t` columns); -1 where a stream has no window t.

    >>> dataset_windows(np.array([1, 2, 1]), np.array([1, 0, 0]), start=1, stop=3).tolist()
    [[2, 1], [0, -1]]
    """
    from ..errors import DataError

    index = np.full((int(t.max()) + 1 if len(t) else 0, stop - start), -1)
    if len(t) and t.min() < 0:
        raise DataError(f"data.predict_dataset: expected t >= 0, received t={int(t.min())}")
    if len(set(zip(stream.tolist(), t.tolist(), strict=True))) < len(t):
        raise DataError("data.predict_dataset: expected one row per (stream, t), received a repeated pair")
    index[t, stream - start] = np.arange(len(t))
    return index


def predict_streams(
    recipe: ModelSpec,
    weights: list[np.ndarray],
    search_path: list[str],
    owned: tuple[int, int, int],
    group_size: int,
    x: Any = None,
    warmup: Any = None,
    dataset: ray.data.Dataset | None = None,
    x_names: Any = None,
) -> Iterator[Any]:
    """Arrow tables (`stream`, `t`, the outputs) of this worker's streams `owned` = (start, stop, of all),
    group after group.

    From `x` (a loader's arrays, shared through the object store; `warmup`, its x_train, first
    with --continue-states), or from `dataset`: this worker's streams of a Ray Data dataset,
    read here whole (its share of the rows only).
    """
    from ..worker.replica import reset_states, stateful_layers

    start, stop, streams = owned
    if dataset is not None:
        x, index = read_streams(dataset, x_names, start, stop)
    else:
        index = loader_windows(_rows(x), streams, start, stop)
    warmup_index = loader_windows(_rows(warmup), streams, start, stop) if warmup is not None else None
    model = built_model(recipe, weights, search_path, group_size)
    layers = stateful_layers(model)
    for first in range(0, stop - start, group_size):
        group = np.arange(first, min(first + group_size, stop - start))
        reset_states(layers)
        if warmup is not None:
            for rows in warmup_index[:, group]:
                model.predict_on_batch(padded(warmup, rows, group_size))
        yield from _group(model, x, index[:, group], start + group, group_size)


def read_streams(dataset: ray.data.Dataset, x_names: Any, start: int, stop: int) -> tuple[Any, np.ndarray]:
    """This worker's rows of `dataset` (already its streams only) as features and `index[t, j]`."""
    from ..data.datasets import features

    parts = list(dataset.iter_batches(batch_size=None, batch_format="numpy"))
    if not parts:
        return None, np.full((0, stop - start), -1)
    columns = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    index = dataset_windows(columns["stream"].astype("int64"), columns["t"].astype("int64"), start, stop)
    return features(columns, x_names), index


def _group(model: Any, x: Any, index: np.ndarray, streams: np.ndarray, group_size: int) -> Iterator[Any]:
    keys: dict[str, list] = {"stream": [], "t": []}
    outputs: dict[str, list] = {}
    held = 0
    for t, rows in enumerate(index):
        present = rows >= 0
        if not present.any():
            continue
        predicted = named_outputs(model, model.predict_on_batch(padded(x, rows, group_size)))
        keys["stream"].append(streams[present])
        keys["t"].append(np.full(int(present.sum()), t))
        for name, values in predicted.items():
            outputs.setdefault(name, []).append(values[: len(rows)][present])
        held += int(present.sum())
        if held >= CHUNK_ROWS:
            yield _table(keys, outputs)
            keys, outputs, held = {"stream": [], "t": []}, {}, 0
    if held:
        yield _table(keys, outputs)


def _rows(x: Any) -> int:
    return len(leaves(x)[0][1])


def _table(keys: dict[str, list], outputs: dict[str, list]) -> Any:
    return output_table(
        {k: np.concatenate(v).astype("int64") for k, v in keys.items()},
        {k: np.concatenate(v) for k, v in outputs.items()},
    )

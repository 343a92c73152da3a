"""Which rows each worker trains on, step by step.

Global batch t holds rows `order[t*B:(t+1)*B]`; worker r takes its slice `[start, stop)`
of it (`spec.rank_rows`: B/N rows, one more for the first B % N ranks). With
`layout: streams` the order is the identity, so row i of every global batch is stream i and
worker r always owns streams `[start, stop)`. With
`layout: shuffle` the order is a permutation drawn from `(seed, epoch)`, the same on every
worker. Every worker runs the same number of steps. The rows past the last full batch form a
last, shorter global batch, split across the workers as any batch is (as `fit` trains on
them), unless the model's batch is fixed (stateful layers): then they are left out.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DataError, describe
from ..spec import DataSpec, Shard
from ..spec.references import reference_name, resolve
from ..spec.schema import rank_rows


@dataclass
class Split:
    """One split (train or validation): `x` is an array, a tuple or a dict of arrays; `w` one
    weight per row (the loader's sample weights, or `train.class_weight` by label), if any."""

    x: Any
    y: Any  # an array, or one per output (a dict by output name, a tuple in output order)
    w: np.ndarray | None = None

    @property
    def rows(self) -> int:
        return len(leaves(self.y)[0][1])


@dataclass
class Data:
    train: Split
    val: Split | None
    baselines: dict


def rank_aware(spec: DataSpec) -> bool:
    """A loader with a `shard` argument returns one worker's rows (and is called by every worker)."""
    return "shard" in inspect.signature(resolve(spec.loader, "data.loader")).parameters


def load_data(
    spec: DataSpec, global_batch_size: int, class_weight: dict | None = None, shard: Shard | None = None
) -> Data:
    """Call the loader (for one worker's `shard`, if given) and check that its arrays can feed full batches."""
    out = call_loader(spec, global_batch_size, shard)
    if shard is not None:
        global_batch_size = shard.batch_size  # its rows feed this worker's batches only
    return checked_arrays(out, spec, global_batch_size, class_weight)


def call_loader(spec: DataSpec, global_batch_size: int, shard: Shard | None = None) -> Any:
    """The loader's output, as it returned it (for one worker's `shard`, if given)."""
    loader = resolve(spec.loader, "data.loader")
    kwargs = dict(spec.kwargs)
    if "global_batch_size" in inspect.signature(loader).parameters:
        kwargs.setdefault("global_batch_size", global_batch_size)
    if shard is not None:
        kwargs["shard"] = shard
    return loader(**kwargs)


def checked_arrays(out: Any, spec: DataSpec, global_batch_size: int, class_weight: dict | None) -> Data:
    """A loader's arrays, checked to feed full batches, with one weight per row where weights are given."""
    if not isinstance(out, dict) or "x_train" not in out or "y_train" not in out:
        got = sorted(out) if isinstance(out, dict) else describe(out)
        raise DataError(
            "data.loader: expected a dict with x_train, y_train[, x_val, y_val] (or x_train[, x_val] as datasets), "
            f"received {got}"
        )
    if ("x_val" in out) != ("y_val" in out):
        raise DataError("data.loader: expected both x_val and y_val or neither, received only one of them")
    train = _split(out["x_train"], out["y_train"], "train", global_batch_size, spec.check_finite)
    train.w = _weights(out.get("sample_weight_train"), train, "train")
    if class_weight is not None:
        if not isinstance(train.y, np.ndarray):  # as Keras' fit refuses it
            raise DataError(
                "train.class_weight: expected a model with one output (one y_train array), received several"
            )
        if train.w is not None:  # as Keras' fit refuses both
            raise DataError(
                "train.class_weight: expected class weights or the loader's sample_weight_train, not both, received both"
            )
        train.w = class_weights(train.y, class_weight)
    val = None
    if out.get("x_val") is not None:
        val = _split(out["x_val"], out["y_val"], "val", global_batch_size, spec.check_finite)
        val.w = _weights(out.get("sample_weight_val"), val, "val")
    return Data(train=train, val=val, baselines=dict(out.get("baselines") or {}))


def describe_arrays(spec: DataSpec, data: Data) -> dict:
    """What MLflow records of a loader's data (`mlflow.log_input`): source, schema, digest, rows."""
    import hashlib

    source = reference_name(spec.loader)
    digest = hashlib.sha256(repr([source, spec.kwargs]).encode())
    schema = {}
    for prefix, values in (("x", data.train.x), ("y", data.train.y)):
        for key, array in leaves(values):
            schema[prefix + key] = [str(array.dtype), list(array.shape[1:])]
            digest.update(np.ascontiguousarray(array[:: max(1, len(array) // 64)]).tobytes())  # 64 rows spread out
    return {
        "name": f"train: {source}",
        "context": "training",
        "source": source,
        "schema": schema,
        "rows": data.train.rows,
        "digest": digest.hexdigest()[:10],
    }


def _split(x: Any, y: Any, name: str, global_batch_size: int, check_finite: bool) -> Split:
    x = as_arrays(x, f"x_{name}")
    y = as_arrays(y, f"y_{name}")
    lengths = {f"x_{name}{key}": len(a) for key, a in leaves(x)}
    lengths.update({f"y_{name}{key}": len(a) for key, a in leaves(y)})
    if len(set(lengths.values())) > 1:
        shown = ", ".join(f"{k}={v}" for k, v in lengths.items())
        raise DataError(f"data.loader: expected x_{name} and y_{name} with the same number of rows, received {shown}")
    rows = len(leaves(y)[0][1])
    if rows < global_batch_size:
        raise DataError(
            f"data.loader: expected at least one global batch ({global_batch_size} rows) in {name}, "
            f"received {rows} rows"
        )
    if check_finite:
        labelled = [(f"x_{name}{key}", a) for key, a in leaves(x)] + [(f"y_{name}{key}", a) for key, a in leaves(y)]
        for label, array in labelled:
            if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
                bad = int(np.argwhere(~np.isfinite(array))[0][0])
                raise DataError(f"data.loader: expected finite values in {label}, received NaN/inf at row {bad}")
    return Split(x=x, y=y)


def _weights(weights: Any, split: Split, name: str) -> np.ndarray | None:
    if weights is None:
        return None
    array = np.asarray(weights, dtype="float32")
    if array.ndim == 0 or array.shape[0] != split.rows:
        raise DataError(
            f"data.loader: expected sample_weight_{name} with one weight per row of y_{name} (shape ({split.rows},), or "
            f"({split.rows}, timesteps) per token), received shape {array.shape}"
        )
    return array


def class_weights(y: np.ndarray, class_weight: dict) -> np.ndarray:
    """One weight per row from its label, as Keras' `fit(class_weight=...)` makes them
    (one-hot targets by argmax; labels without a weight get 1.0)."""
    labels = y
    if labels.ndim > 2 or (labels.ndim == 2 and labels.shape[1] == 0):
        raise DataError(
            f"train.class_weight: expected class labels (n,) or one-hot targets (n, classes), received y_train rows "
            f"of shape {labels.shape[1:]}"
        )
    if labels.ndim == 2:
        labels = np.argmax(labels, axis=-1) if labels.shape[1] != 1 else labels[:, 0]
    labels = np.round(labels).astype("int64")
    classes = y.shape[1] if y.ndim == 2 and y.shape[1] > 1 else int(labels.max()) + 1
    outside = [k for k in class_weight if not isinstance(k, int) or not 0 <= k < classes]
    if outside:
        raise DataError(
            f"train.class_weight: expected keys among the labels 0..{classes - 1}, received {sorted(map(str, outside))}"
        )
    return np.array([class_weight.get(int(label), 1.0) for label in labels], dtype="float32")


def as_arrays(value: Any, label: str) -> Any:
    if isinstance(value, dict):
        return {k: as_arrays(v, f"{label}[{k!r}]") for k, v in value.items()}
    if isinstance(value, tuple):  # multi-input model: one array per input
        return tuple(as_arrays(v, f"{label}[{i}]") for i, v in enumerate(value))
    array = np.asarray(value)
    if array.ndim == 0:
        raise DataError(f"data.loader: expected {label} to be an array of rows, received {describe(value)}")
    return array


def leaves(x: Any) -> list[tuple[str, np.ndarray]]:
    if isinstance(x, dict):
        return [(f"[{k!r}]", v) for k, v in x.items()]
    if isinstance(x, tuple):
        return [(f"[{i}]", v) for i, v in enumerate(x)]
    return [("", x)]


def take(x: Any, rows: Any) -> Any:
    """Rows `rows` (an index array or a slice) of every array in `x` (array, tuple or dict)."""
    if isinstance(x, dict):
        return {k: v[rows] for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(v[rows] for v in x)
    return x[rows]


def batches(split: Split, step_rows: Iterator[np.ndarray]) -> Iterator[tuple[Any, np.ndarray, np.ndarray | None]]:
    """This worker's batches, one per array of row indices of `step_rows` (see `worker_steps`), in step order.

    One small gather per step, fed straight to the compiled step: the arrays stay where they
    are (read-only in Ray's object store, shared by the node's workers), so a worker holds a
    batch, not its share of the epoch. No tf.data pipeline: on a busy CPU its background
    threads (prefetch, autotune) wait for a time slice and stall the step, which halved
    2-worker throughput in some epochs here (benchmarks/RESULTS.md).
    """
    for batch in step_rows:
        w = split.w[batch] if split.w is not None else None  # None: Keras' loss without weights, as fit calls it
        yield take(split.x, batch), take(split.y, batch), w


def steps_per_epoch(rows: int, global_batch_size: int, last_partial: bool = False) -> int:
    """Full global batches, and with `last_partial` one more for the rows past them, if any."""
    return -(-rows // global_batch_size) if last_partial else rows // global_batch_size


def global_batch_at(step: int, rows: int, global_batch_size: int) -> int:
    """The rows of step `step` (1-based) of an epoch of `rows`: the global batch, or the last one's rest.

    >>> [global_batch_at(step, 20, 8) for step in (1, 2, 3)]
    [8, 8, 4]
    """
    return min(global_batch_size, rows - (step - 1) * global_batch_size)


def epoch_order(rows: int, epoch: int, layout: str, seed: int | list[int]) -> np.ndarray:
    """The global row order of one epoch: identity for streams, a seeded permutation otherwise."""
    if layout == "streams":
        return np.arange(rows)
    return np.random.default_rng([*np.atleast_1d(seed).tolist(), epoch]).permutation(rows)


def worker_steps(
    order: np.ndarray, global_batch_size: int, rank: int, num_workers: int, last_partial: bool = False
) -> Iterator[np.ndarray]:
    """This worker's rows of each global batch, step after step: its slice (`rank_rows`) of every full
    batch, and with `last_partial` of the shorter last one (a worker may get no row of it).

    >>> [rows.tolist() for rows in worker_steps(np.arange(11), 4, rank=1, num_workers=2, last_partial=True)]
    [[2, 3], [6, 7], [10]]
    """
    for step in range(1, steps_per_epoch(len(order), global_batch_size, last_partial) + 1):
        first = (step - 1) * global_batch_size
        start, stop = rank_rows(global_batch_at(step, len(order), global_batch_size), num_workers, rank)
        yield order[first + start : first + stop]


def worker_rows(order: np.ndarray, global_batch_size: int, rank: int, num_workers: int) -> np.ndarray:
    """This worker's rows of the full global batches, step after step, as one array.

    >>> worker_rows(np.arange(10), 5, rank=1, num_workers=2).tolist()
    [3, 4, 8, 9]
    """
    return np.concatenate([np.arange(0), *worker_steps(order, global_batch_size, rank, num_workers)])

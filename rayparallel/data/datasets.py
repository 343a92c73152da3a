"""Ray Data input: the driver opens and checks the datasets, Ray Train hands each worker its share.

The driver calls `data.dataset` (a lazy plan: nothing is read yet), checks it against a
sample (its first global batch) and counts its rows, reading only the columns the count
needs. The plan then goes to Ray Train (`DataParallelTrainer(datasets=...)`) with
`RankShards`, which decides what each worker's `ray.train.get_dataset_shard` streams:

- `layout: shuffle`: Ray's own split (`streaming_split(n, equal=True)`) of the plan with its
  block order randomized from the seed; each worker also shuffles a buffer of rows from
  `(seed, epoch, rank)`. Every worker gets the same number of rows, so the same steps.
- `layout: streams`: worker r's plan is the dataset filtered to the streams it owns, with
  Ray Data keeping the file and row order (Ray's split hands blocks to whichever worker is
  free, which would mix streams up). Rows reach a worker only if they are its own. Rows
  stored t-major (all streams at t=0, then t=1, ...) arrive as the steps want them: one plan.
  Rows stored stream-major (each stream's rows in t order, streams one after another, as
  per-sensor files hold them) get one plan per owned stream, read side by side a chunk at a
  time and laid out t-major in the worker: no global sort, a few chunks per stream in memory.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DataError, describe, first_line
from ..hooks import env_defaults
from ..spec import DataSpec
from ..spec.references import resolve
from ..spec.schema import rank_rows

if TYPE_CHECKING:
    import ray.data
    from ray.train import DataConfig

ALTERNATE = "train_even_epochs"  # the training plan again, for every other epoch (`epoch_ahead`)
STREAM_COLUMNS = ("stream", "t")
T_MAJOR, STREAM_MAJOR = "t-major", "stream-major"  # the two orders `layout: streams` reads rows in
STREAM_CHUNK_ROWS = 64  # stream-major: rows of each stream read at a time
SHUFFLE_BUFFER_BATCHES = 8  # a worker's local shuffle mixes this many of its batches' rows


@dataclass
class DatasetInput:
    """What workers need to read their share: the columns, and the counts the driver made."""

    x: str | list[str]
    y: str | list[str]
    layout: str
    seed: int
    train_rows: int
    val_rows: int | None  # None: no validation dataset
    sample: dict[str, np.ndarray]  # the first global batch of training rows, by column
    stored: dict[str, str] = field(default_factory=dict)  # layout streams: each plan's order, T_MAJOR or STREAM_MAJOR

    def steps(self, rows: int | None, global_batch_size: int) -> int:
        return (rows or 0) // global_batch_size


@dataclass
class OpenedDatasets:
    """The driver's view: the lazy datasets for Ray Train, the counts, a sample, what MLflow records."""

    datasets: dict[str, ray.data.Dataset]  # "train", ALTERNATE (and "val")
    input: DatasetInput
    descriptions: list[dict]


def open_datasets(spec: DataSpec, global_batch_size: int, seed: int) -> OpenedDatasets:
    """Call `data.dataset` (and `data.val_dataset`), check them on a sample, count their rows.

    The training plan goes to Ray Train twice, as "train" and ALTERNATE: odd and even epochs.
    """
    lazy, rows, descriptions, sample, stored = {}, {}, [], {}, {}
    for split, ref in (("train", spec.dataset), ("val", spec.val_dataset)):
        if ref is None:
            continue
        key = "data.dataset" if split == "train" else "data.val_dataset"
        dataset = call_dataset(ref, key, spec.kwargs)
        if spec.layout == "streams":  # read files by name, rows as stored: the sample is the first t
            dataset.context.execution_options.preserve_order = True
        schema = _read(dataset.schema, key)
        if schema is None:
            raise DataError(f"{key}: expected rows with columns, received an empty dataset")
        columns = list(schema.names)
        wanted = (
            column_names(spec.x) + column_names(spec.y) + (list(STREAM_COLUMNS) if spec.layout == "streams" else [])
        )
        missing = [c for c in wanted if c not in columns]
        if missing:
            raise DataError(f"{key}: expected columns {missing} (data.x, data.y, layout), received columns {columns}")
        count = _count_streams(dataset, key, global_batch_size) if spec.layout == "streams" else _count(dataset, key)
        if count < global_batch_size:
            got = "an empty dataset" if count == 0 else f"{count} rows"
            raise DataError(f"{key}: expected at least one global batch ({global_batch_size} rows), received {got}")
        first = None
        if split == "train" or spec.layout == "streams":  # other rows are checked by the workers as they read them
            first = _read(lambda d=dataset: d.take_batch(global_batch_size, batch_format="numpy"), key)
        if spec.layout == "streams":
            stored[split] = stored_order(first, key, global_batch_size)
        if split == "train":
            sample = first
            if spec.layout == "shuffle":  # a new order each epoch (Ray reseeds per run)
                lazy[ALTERNATE] = dataset.randomize_block_order(seed=seed + 1)
                dataset = dataset.randomize_block_order(seed=seed)
            else:
                lazy[ALTERNATE], stored[ALTERNATE] = dataset, stored["train"]
        lazy[split], rows[split] = dataset, count
        descriptions.append(_description(split, ref, spec.kwargs, schema, count))
    opened = DatasetInput(spec.x, spec.y, spec.layout, seed, rows["train"], rows.get("val"), sample, stored)
    return OpenedDatasets(lazy, opened, descriptions)


def features(batch: dict[str, np.ndarray], names: str | list[str]) -> Any:
    """The column(s) `names` of a batch: one array, or a tuple of them (several inputs/outputs)."""
    if isinstance(names, str):
        return batch[names]
    return tuple(batch[n] for n in names) if len(names) > 1 else batch[names[0]]


def shard_batches(
    shard: Any, opened: DatasetInput, steps: int, per_worker: int, streams: range, shuffle_seed: int | None
) -> Iterator[tuple[Any, Any, None]]:
    """This worker's `steps` batches of an epoch from its `ray.train.get_dataset_shard` iterator.

    Exactly `steps` batches on every worker, or an error naming the worker: one that ran out
    would leave the others waiting in the step's all-reduce. A list of shards is one per
    stream, stored stream-major (`rank_shards`).
    """
    options = {}
    if shuffle_seed is not None:
        options = dict(local_shuffle_buffer_size=SHUFFLE_BUFFER_BATCHES * per_worker, local_shuffle_seed=shuffle_seed)
    if isinstance(shard, list):
        batches = lockstep(shard)
    else:
        batches = iter(shard.iter_batches(batch_size=per_worker, batch_format="numpy", drop_last=True, **options))
    for step in range(steps):
        batch = next(batches, None)
        if batch is None:
            raise DataError(
                f"data.dataset: expected {steps} batches of {per_worker} rows for the worker of streams/rows "
                f"{streams.start}-{streams.stop - 1}, received {step} (the dataset changed since it was counted?)"
            )
        if opened.layout == "streams":
            _check_step(batch, streams, step)
        yield features(batch, opened.x), features(batch, opened.y), None  # no sample weights
    for _ in batches:  # the rest (under one batch) so Ray's split can start the next epoch
        pass


def rank_shards(layout: str, global_batch_size: int, stored: dict[str, str] | None = None) -> DataConfig:
    """The `dataset_config` for Ray Train: which rows each worker's dataset shard streams.

    `stored` is each split's order (`DatasetInput.stored`): a stream-major split's shard is a
    list of iterators, one per stream the worker owns.
    """
    from ray.data import ExecutionOptions
    from ray.train import DataConfig

    stored = stored or {}

    class RankShards(DataConfig):
        def configure(self, datasets, world_size, worker_handles, worker_node_ids, **kwargs):
            if layout == "shuffle":  # Ray's even split
                return super().configure(datasets, world_size, worker_handles, worker_node_ids, **kwargs)
            shards = []
            for rank in range(world_size):
                start, stop = rank_rows(global_batch_size, world_size, rank)
                shard = {}
                for name, ds in datasets.items():
                    if stored.get(name) == STREAM_MAJOR:
                        shard[name] = [own_streams(ds, s, s + 1).iterator() for s in range(start, stop)]
                    else:
                        shard[name] = own_streams(ds, start, stop).iterator()
                shards.append(shard)
            return shards

    return RankShards(execution_options=ExecutionOptions(preserve_order=layout == "streams"))


def own_streams(dataset: ray.data.Dataset, start: int, stop: int) -> ray.data.Dataset:
    """The rows of streams `[start, stop)`, in the dataset's order (files by name, rows as stored)."""
    from ray.data.expressions import col

    owned = dataset.filter(expr=(col("stream") >= start) & (col("stream") < stop))
    owned.context.execution_options.preserve_order = True
    return owned


def lockstep(streams: list, chunk_rows: int = STREAM_CHUNK_ROWS) -> Iterator[dict[str, np.ndarray]]:
    """Rows of one stream per iterator, as batches of one row per stream: step t holds every stream's t-th row.

    Each stream is read a chunk at a time, so memory holds a few chunks per stream whatever the
    streams' length. The batches are checked by `shard_batches` like t-major ones: a stream
    whose rows are not in t order, or that ends early, is an error there.
    """
    chunks = [iter(s.iter_batches(batch_size=chunk_rows, batch_format="numpy")) for s in streams]
    while True:
        parts = [next(c, None) for c in chunks]
        if any(p is None for p in parts):
            return
        rows = min(len(p["stream"]) for p in parts)  # equal unless a stream is short: its next batch is missing
        stacked = {name: np.stack([p[name][:rows] for p in parts], axis=1) for name in parts[0]}
        for t in range(rows):
            yield {name: column[t] for name, column in stacked.items()}
        if rows < max(len(p["stream"]) for p in parts):
            return


def call_dataset(ref: str, key: str, kwargs: dict) -> ray.data.Dataset:
    import ray.data

    function = resolve(ref, key)
    # Ray's parquet reader keeps the footer-actor count it finds when `read_parquet` is called
    # (hooks.ENV_DEFAULTS["ray_data"]), so the default is in place while the user's function runs
    with env_defaults("ray_data"):
        dataset = _read(lambda: function(**kwargs), key)
    if not isinstance(dataset, ray.data.Dataset):
        raise DataError(f"{key}: expected {ref} to return a ray.data.Dataset, received {describe(dataset)}")
    return dataset


def _read(action: Any, key: str) -> Any:
    """Run a dataset call: an error in the user's plan (a missing path, a bad map) as one line."""
    try:
        return action()
    except DataError:
        raise
    except Exception as exc:  # the user's reader, any error
        cause = exc.__cause__ or exc
        text = first_line(cause) if str(cause).strip() else first_line(exc)
        raise DataError(f"{key}: expected a dataset that reads, received {type(cause).__name__}: {text}") from None


def column_names(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _count(dataset: ray.data.Dataset, key: str) -> int:
    return int(_read(dataset.count, key))


def _count_streams(dataset: ray.data.Dataset, key: str, global_batch_size: int) -> int:
    """One pass over the `stream` and `t` columns only: one stream per row of the global batch, `t` without gaps."""
    # per block, then here: map tasks only (an aggregate's shuffle tasks land in the caller's placement
    # group, and a sweep trial's holds no CPU for them)
    columns = dataset.select_columns(list(STREAM_COLUMNS)).map_batches(
        _block_figures, batch_format="numpy", batch_size=None
    )
    blocks = [row for row in _read(columns.take_all, key) if row["count"]]
    count = sum(int(row["count"]) for row in blocks)
    if count == 0:
        raise DataError(
            f"{key}: expected at least one global batch ({global_batch_size} rows), received an empty dataset"
        )
    counts = {
        name: pick(int(row[name]) for row in blocks)
        for name, pick in (("min_stream", min), ("max_stream", max), ("min_t", min), ("max_t", max))
    }
    low, high = counts["min_stream"], counts["max_stream"]
    if (low, high) != (0, global_batch_size - 1):
        raise DataError(
            f"{key}: expected streams 0..{global_batch_size - 1} (one per row of train.global_batch_size), received "
            f"streams {low}..{high}"
        )
    first_t, last_t = counts["min_t"], counts["max_t"]
    steps = last_t - first_t + 1
    if first_t != 0 or count != global_batch_size * steps:
        raise DataError(
            f"{key}: expected every stream at every t from 0 to {last_t} ({global_batch_size * steps} rows), received "
            f"{count} rows with t from {first_t}: gaps or repeats in t"
        )
    return count


def _block_figures(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One row per block: its row count and the range of its `stream` and `t` columns."""
    stream, t = np.asarray(batch["stream"]), np.asarray(batch["t"])
    if not len(stream):
        return {name: np.zeros(1, np.int64) for name in ("count", "min_stream", "max_stream", "min_t", "max_t")}
    return {
        "count": np.array([len(stream)]),
        "min_stream": np.array([stream.min()]),
        "max_stream": np.array([stream.max()]),
        "min_t": np.array([t.min()]),
        "max_t": np.array([t.max()]),
    }


def stored_order(batch: dict, key: str, global_batch_size: int) -> str:
    """The order of a streams dataset, from its first rows: T_MAJOR, STREAM_MAJOR, or a one-line error."""
    stream, t = np.asarray(batch["stream"]), np.asarray(batch["t"])
    if stream.tolist() == list(range(global_batch_size)) and not t.any():
        return T_MAJOR  # all streams at t=0 first, in stream order
    next_t = (stream[1:] == stream[:-1]) & (t[1:] == t[:-1] + 1)
    next_stream = (stream[1:] == stream[:-1] + 1) & (t[1:] == 0)
    if stream[0] == 0 and t[0] == 0 and (next_t | next_stream).all():
        return STREAM_MAJOR  # stream 0 from t=0, then stream 1 from t=0, ...
    raise DataError(
        f"{key}: expected rows stored t-major (streams 0..{global_batch_size - 1} at t=0, then at t=1, ...; "
        "sort by ['t', 'stream']) or stream-major (stream 0 at t=0, 1, ..., then stream 1, ...; sort by "
        f"['stream', 't']), received first rows with stream {stream.tolist()[:6]} and t {t.tolist()[:6]}"
    )


def _check_step(batch: dict, streams: range, step: int) -> None:
    if batch["stream"].tolist() != list(streams) or (batch["t"] != step).any():
        raise DataError(
            f"data.dataset: expected streams {streams.start}-{streams.stop - 1} at t={step}, received streams "
            f"{batch['stream'].tolist()[:6]} at t {sorted(set(batch['t'].tolist()))[:6]} (rows stored neither "
            "t-major nor stream-major past the first ones?)"
        )


def _description(split: str, ref: str, kwargs: dict, columns: ray.data.Schema, rows: int) -> dict:
    """What MLflow records of the dataset (`mlflow.log_input`): source, schema, digest, rows."""
    schema = {name: str(kind) for name, kind in zip(columns.names, columns.types, strict=True)}
    source = next((str(v) for v in kwargs.values() if isinstance(v, str) and os.path.exists(v)), ref)
    text = json.dumps([ref, kwargs, schema, rows, _files_signature(source)], sort_keys=True, default=str)
    return {
        "name": f"{split}: {ref}",
        "context": "training" if split == "train" else "validation",
        "source": source,
        "schema": schema,
        "rows": rows,
        "digest": hashlib.sha256(text.encode()).hexdigest()[:10],
    }


def _files_signature(path: str) -> list:
    """Names, sizes and modification times under a path: new data, new digest, without reading it."""
    if not os.path.exists(path):
        return []
    if os.path.isfile(path):
        return [path, os.path.getsize(path), os.path.getmtime(path)]
    found = []
    for root, _, files in os.walk(path):
        for name in sorted(files):
            full = os.path.join(root, name)
            found.append([os.path.relpath(full, path), os.path.getsize(full), int(os.path.getmtime(full))])
    return sorted(found)

"""Which rows a prediction is for, found by the driver before anything starts.

The job's own data: the loader's `x_predict` (or `x_val`), else `data.predict_dataset`
(or `data.val_dataset`), a Ray Data function as `data.dataset` is. With `layout: streams` the
rows are windows of streams as training reads them: a loader's row `t * S + i` is window t of
stream i (S, the job's global batch: the loader lays its streams out for it), a dataset's
rows carry `stream` and `t` columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..data.datasets import STREAM_COLUMNS, call_dataset, column_names
from ..data.shards import as_arrays, call_loader, leaves, rank_aware
from ..errors import DataError, RayParallelError, describe
from ..spec.references import reference_name

if TYPE_CHECKING:
    import ray.data

    from ..spec import JobSpec

SPLITS = ("predict", "val")


@dataclass
class Rows:
    """The rows to predict: arrays from the loader, or a Ray Data dataset."""

    source: str  # "jobs.stateful_lstm:load_data x_val", as the console and predict.json say it
    x: Any = None  # an array, a tuple or a dict of arrays (the loader's)
    dataset: ray.data.Dataset | None = None
    keys: list[str] | None = None  # a dataset's columns that key each prediction (not data.x, not data.y)
    streams: int | None = None  # layout streams: how many
    warmup: Any = None  # continue_states: the loader's x_train, on the same streams

    @property
    def count(self) -> int | None:
        return len(leaves(self.x)[0][1]) if self.x is not None else None


def dataset_of(job: JobSpec, split: str) -> Any:
    """The Ray Data function of `split`, if the job has one (then Ray must be up before `find_rows`)."""
    if split not in SPLITS:
        raise RayParallelError(f"--split: expected one of {list(SPLITS)}, received {split!r}")
    return job.data.predict_dataset if split == "predict" else job.data.val_dataset


def find_rows(job: JobSpec, split: str, continue_states: bool, x: Any = None) -> Rows:
    """The rows of `split` ("predict" or "val"), or the arrays `x` given (`rayparallel.fit`'s users),
    checked to fit the job's layout (one line if not)."""
    data = job.data
    if x is not None:
        return _given_rows(job, x, continue_states)
    dataset_ref = dataset_of(job, split)
    if continue_states and (job.data.layout != "streams" or data.loader is None or dataset_ref is not None):
        raise RayParallelError(
            "--continue-states: expected a job with layout streams whose data.loader returns x_train (the states "
            f"come from its end), received layout {job.data.layout} with "
            f"{'data.loader' if data.loader is not None and dataset_ref is None else 'Ray Data'} rows"
        )
    if dataset_ref is not None:
        return _dataset_rows(job, dataset_ref, split)
    if data.loader is None:
        raise RayParallelError(
            f"data.predict_dataset: expected a Ray Data function for --split {split} (the job reads data.dataset), "
            "received none"
        )
    return _loader_rows(job, split, continue_states)


def _loader_rows(job: JobSpec, split: str, continue_states: bool) -> Rows:
    if rank_aware(job.data):
        raise RayParallelError(
            f"data.loader: expected a loader that returns every row (predict calls it once), received "
            f"{reference_name(job.data.loader)} with a shard argument"
        )
    out = call_loader(job.data, job.train.global_batch_size)
    key = f"x_{split}"
    if not isinstance(out, dict) or out.get(key) is None:
        got = sorted(out) if isinstance(out, dict) else describe(out)
        raise DataError(
            f"--split {split}: expected {reference_name(job.data.loader)} to return {key}, received {got}"
            + (" (or --split val)" if split == "predict" else "")
        )
    rows = Rows(f"{reference_name(job.data.loader)} {key}", x=as_arrays(out[key], key))
    if job.data.layout == "streams":
        rows.streams = job.train.global_batch_size
        _check_windows(rows.count, rows.streams, key)
        if continue_states:
            rows.warmup = as_arrays(out["x_train"], "x_train")
            _check_windows(len(leaves(rows.warmup)[0][1]), rows.streams, "x_train")
    return rows


def _given_rows(job: JobSpec, x: Any, continue_states: bool) -> Rows:
    if continue_states:
        raise RayParallelError("--continue-states: expected the job's loader rows, received arrays passed as x")
    rows = Rows("the arrays passed as x", x=as_arrays(x, "x"))
    if job.data.layout == "streams":
        rows.streams = job.train.global_batch_size
        _check_windows(rows.count, rows.streams, "x")
    return rows


def _dataset_rows(job: JobSpec, ref: Any, split: str) -> Rows:
    key = "data.predict_dataset" if split == "predict" else "data.val_dataset"
    dataset = call_dataset(ref, key, job.data.kwargs)
    columns = list(dataset.schema().names)
    features = column_names(job.data.x)
    missing = [c for c in features if c not in columns]
    streams = job.data.layout == "streams"
    if streams:
        missing += [c for c in STREAM_COLUMNS if c not in columns]
    if missing:
        raise DataError(f"{key}: expected columns {missing} (data.x, layout), received columns {columns}")
    rows = Rows(f"{reference_name(ref)} ({key})", dataset=dataset)
    if streams:
        dataset.context.execution_options.preserve_order = True
        rows.keys = list(STREAM_COLUMNS)
        rows.streams = int(dataset.max("stream")) + 1
        return rows
    rows.keys = [c for c in columns if c not in features and c not in column_names(job.data.y)]
    if not rows.keys:
        raise DataError(
            f"{key}: expected a column beside data.x {features} that keys each prediction (an id), "
            f"received only {columns}"
        )
    return rows


def _check_windows(count: int, streams: int, key: str) -> None:
    if count % streams:
        raise DataError(
            f"{key}: expected rows laid out as windows of {streams} streams (train.global_batch_size; row t*{streams}+i "
            f"is window t of stream i), received {count} rows, not a multiple of {streams}"
        )

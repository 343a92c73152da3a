"""Data that does not fit in one worker: Ray Data shards, rank-aware loaders, the shared loader.

A real local Ray (the session's), small parquet files in a temporary folder, real training.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import rayparallel
from rayparallel.cluster.connect import check_capacity
from rayparallel.errors import RayParallelError
from rayparallel.spec import load_spec

from .helpers import final_weights, keras_fit_streams, max_relative_error
from .models import lstm_job, ray_data_job, sine_streams, stateful_lstm, write_rows, write_sine_streams

pytestmark = pytest.mark.slow
# 4 steps an epoch carry the streams' states from step to step; the second epoch's plan starts during the first
TWO_EPOCHS = ("mlflow.enabled=false", "train.epochs=2")


def test_streams_from_ray_data_train_fits_model(ray_address, tmp_path):
    """The loader model's streams from Ray Data on 2 workers, training rows stored stream-major (one file per
    stream), validation rows t-major: the weights of plain Keras `fit` on the loader's arrays to 1e-5, its
    figures every epoch. (Training rows t-major on 2 workers: the cluster test's Ray Data job against the
    in-memory one; the shared in-memory loader: tests/test_keras_inputs.py and the default job; a rank-aware
    loader: tests/test_equivalence.py.)"""
    root = tmp_path / "mixed"
    write_sine_streams(root, 6, stream_major=("train",))
    assert len(list((root / "train").iterdir())) == 6
    model, history = keras_fit_streams(lstm_job("loader", *TWO_EPOCHS))
    spec = ray_data_job("raydata2mixed", root, "scaling.num_workers=2", *TWO_EPOCHS)
    result = rayparallel.train(spec, output_dir=tmp_path / "raydata2mixed", verbose=False)

    error = max_relative_error(final_weights(result.final_weights, stateful_lstm), model.get_weights())
    print(
        f"streams, 2 workers vs Keras fit on the loader's arrays: max relative weight error {error:.2e} ({result.seconds:.1f} s)"
    )
    assert error < 1e-5
    for key, values in history.items():
        assert [logs[key] for logs in result.history] == pytest.approx(values, rel=1e-4, abs=1e-6), key
    assert all(w["memory"]["pss_peak_mb"] >= w["memory"]["pss_before_data_mb"] > 0 for w in result.workers)
    assert [len(w["epoch_start_wait_s"]) for w in result.workers] == [2] * len(result.workers)  # each epoch's
    window = sine_streams(6)["x_train"].shape[1:]
    assert [w["batch_shape"] for w in result.workers] == [[[3, *window]]] * 2


def test_shuffle_from_ray_data_uses_each_row_once_and_finishes_with_uneven_shares(ray_address, tmp_path):
    """101 rows, global batch 8, 2 workers: every epoch 12 steps on each, no row twice, fewer than 8 left
    out, a new order each epoch; and a real 2-worker run of 2 epochs over them finishes."""
    from rayparallel.data.datasets import open_datasets, rank_shards, shard_batches

    write_rows(tmp_path, 101)
    spec = {
        "name": "shuffled",
        "model": {"builder": "tests.models:dense_regressor"},
        "data": {"dataset": "tests.models:parquet_dataset", "kwargs": {"path": str(tmp_path)}, "layout": "shuffle"},
        "train": {"global_batch_size": 8, "epochs": 2, "seed": 1},
        "scaling": {"num_workers": 2},
        "mlflow": {"enabled": False},
    }
    job = load_spec(spec, ["data.y=row"])
    opened = open_datasets(job.data, 8, seed=1)
    assert opened.input.train_rows == 101
    (described,) = opened.descriptions  # what MLflow records
    assert described["rows"] == 101 and "shape=(4,)" in described["schema"]["x"] and "row" in described["schema"]
    assert described["source"] == str(tmp_path) and len(described["digest"]) == 10
    iterators = rank_shards("shuffle", 8).configure(opened.datasets, 2, None, None)
    steps = opened.input.steps(101, 8)
    seen: dict = {}

    def consume(rank: int) -> None:
        for epoch in (1, 2):
            batches = shard_batches(
                iterators[rank]["train"], opened.input, steps, 4, range(0, 4), seed_for(rank, epoch)
            )
            seen[rank, epoch] = [int(r) for _, rows, _ in batches for r in rows]

    def seed_for(rank: int, epoch: int) -> int:
        return 1000 * epoch + rank

    threads = [threading.Thread(target=consume, args=(rank,)) for rank in (0, 1)]
    [t.start() for t in threads]
    [t.join(timeout=120) for t in threads]
    for epoch in (1, 2):
        rows = seen[0, epoch] + seen[1, epoch]
        assert len(seen[0, epoch]) == len(seen[1, epoch]) == steps * 4 == 48
        assert len(set(rows)) == len(rows) and set(rows) <= set(range(101))
        assert 101 - len(rows) < 8
    assert seen[0, 1] + seen[1, 1] != seen[0, 2] + seen[1, 2]

    result = rayparallel.train(spec, output_dir=tmp_path / "run", verbose=False)  # epoch 2 from the other split
    assert len(result.history) == 2 and all(np.isfinite(logs["loss"]) for logs in result.history)
    assert [w["batch_shape"] for w in result.workers] == [[[4, 4]], [[4, 4]]]


def test_bad_ray_data_input_is_one_line_before_training(ray_address, tmp_path):
    root = tmp_path / "streams"
    write_sine_streams(root, 6)
    rows = tmp_path / "rows"
    write_rows(rows, 40)
    cases = [
        (
            ["data.dataset=tests.models:not_a_dataset"],
            "data.dataset: expected tests.models:not_a_dataset to return a ray.data.Dataset",
        ),
        (["data.kwargs.drop=t"], "data.dataset: expected columns ['t']"),
        (["data.x=y"], "data.x: expected rows of shape (5, 2)"),
        (["train.global_batch_size=4"], "data.dataset: expected streams 0..3"),
        (["data.kwargs.limit=20"], "gaps or repeats in t"),
        (["data.kwargs.limit=0"], "received an empty dataset"),
        (["data.kwargs.descending=t"], "expected rows stored t-major (streams 0..5 at t=0, then at t=1, ...; sort"),
        (["data.kwargs.descending=t"], "or stream-major (stream 0 at t=0, 1, ..., then stream 1, ...; sort by"),
        ([f"data.kwargs.path={tmp_path / 'nowhere'}"], "data.dataset: expected a dataset that reads, received"),
        ([f"data.kwargs.path={rows}", "data.val_dataset=null"], "expected columns ['stream', 't']"),
    ]
    with pytest.raises(
        RayParallelError, match=r"expected at least 1 CPU beyond the workers' 4 for Ray Data's read tasks"
    ):
        check_capacity(load_spec(ray_data_job("bad", root, "scaling.num_workers=4")))  # the session's Ray: 4 CPUs
    for overrides, expected in cases:
        with pytest.raises(RayParallelError) as caught:
            rayparallel.validate(ray_data_job("bad", root), overrides)
        message = str(caught.value)
        assert expected in message and "\n" not in message, (overrides, message)

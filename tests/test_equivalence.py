"""N workers train the same model as one worker with the global batch (real Ray, real TF)."""

from __future__ import annotations

import pytest

from tests.models import lstm_job

from .helpers import final_weights, keras_fit_streams, max_relative_error, train_shared

pytestmark = pytest.mark.slow

LSTM = lstm_job("eq-lstm", "scaling.num_workers=1", "train.global_batch_size=16", "mlflow.enabled=false")
CNN = {
    "name": "eq-cnn",
    "model": {"builder": "tests.models:small_cnn"},
    "data": {"loader": "tests.models:blobs", "layout": "shuffle"},
    "train": {
        "global_batch_size": 8,
        "epochs": 2,
        "optimizer": "adam",
        "seed": 5,
        "loss": "sparse_categorical_crossentropy",
        "metrics": [
            "accuracy",
            {"class_name": "MeanIoU", "config": {"num_classes": 3, "sparse_y_pred": False, "name": "miou"}},
        ],
    },
    "scaling": {"num_workers": 1},
    "mlflow": {"enabled": False},
}


def run(shared, spec, tmp_path, workers, *overrides):
    """A run on the session's shared workers where it fits them (`helpers.train_shared`), else its own."""
    name = f"{spec['name']}-{workers}"
    sets = [f"scaling.num_workers={workers}", *overrides]
    return train_shared(shared, spec, sets, output_dir=tmp_path / name, verbose=False)


def test_stateful_lstm_streams_3_workers_train_fits_model(shared_workers, tmp_path):
    """16 streams on 3 workers is 6, 5 and 5: a worker count need not divide the global batch. The 3 workers
    read through a rank-aware loader (each only its own streams): they train the model plain Keras `fit`
    trains on all 16 in one process. (1 worker: tests/test_cluster.py's elastic run; 2 workers on streams:
    the default job through the CLI, tests/test_cli.py, and tests/test_ray_data.py.)"""
    from tests.models import stateful_lstm

    model, history = keras_fit_streams(LSTM)
    rank_aware = dict(LSTM, data={**LSTM["data"], "loader": "tests.models:sine_streams_shard"})
    three = run(shared_workers, rank_aware, tmp_path, 3)
    error = max_relative_error(final_weights(three.final_weights, stateful_lstm), model.get_weights())
    print(f"lstm streams: 3 workers (rank-aware loader) vs Keras fit, max relative weight error {error:.2e}")
    assert error < 1e-5
    assert [w["batch_shape"] for w in sorted(three.workers, key=lambda w: w["rank"])] == [
        [[b, 5, 2]] for b in (6, 5, 5)
    ]
    for key in ("loss", "mae", "val_loss", "val_mae"):  # global figures, not rank 0's share
        assert [epoch[key] for epoch in three.history] == pytest.approx(history[key], rel=1e-4), key
    assert history["loss"][-1] < history["loss"][0]


def test_stateless_cnn_shuffle_2_workers_with_xla_train_the_1_worker_model(shared_workers, tmp_path):
    """The shuffled CNN on 2 workers with `train.jit_compile: true` (XLA, the GPU default) against 1 worker
    without it: the same weights and global figures (a shuffled order is rayparallel's own, so 1 worker is
    the reference here; every other layout has plain Keras `fit` as its oracle)."""
    from tests.models import small_cnn

    one = run(shared_workers, CNN, tmp_path, 1)
    two = run(shared_workers, CNN, tmp_path, 2, "train.jit_compile=true")
    error = max_relative_error(final_weights(two.final_weights, small_cnn), final_weights(one.final_weights, small_cnn))
    print(f"cnn shuffle: 2 workers with XLA vs 1 without, max relative weight error {error:.2e}")
    assert error < 1e-5
    assert set(two.final) >= {"loss", "accuracy", "miou", "val_loss", "val_accuracy", "val_miou"}
    for key in ("loss", "accuracy", "miou", "val_loss", "val_accuracy", "val_miou"):
        assert two.final[key] == pytest.approx(one.final[key], rel=1e-4, abs=1e-6), key
    assert sorted(w["rank"] for w in two.workers) == [0, 1]

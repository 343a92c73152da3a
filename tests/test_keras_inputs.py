"""A loader's `tf.data.Dataset` or `keras.utils.PyDataset` against the oracle: plain Keras `fit`
on the same dataset in this process (same seed and settings), on 2 workers (a worker's share of a
dataset is what is particular here; one worker runs the same loop without the all-reduce)."""

from __future__ import annotations

import collections

import pytest

import rayparallel

from .helpers import final_weights, job, keras_fit_streams, max_relative_error, train_shared

pytestmark = pytest.mark.slow

COMPILE = {"loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"]}
SGD = {"class_name": "SGD", "config": {"learning_rate": 0.1}}


def fit_oracle(dataset, validation=None, epochs=2, **fit_args):
    import keras

    from tests.models import small_cnn

    keras.utils.set_random_seed(4)  # as `job`'s seed
    model = small_cnn(batch_size=8)
    model.compile(optimizer=keras.optimizers.SGD(0.1), **COMPILE)
    history = model.fit(dataset, validation_data=validation, epochs=epochs, verbose=0, **fit_args).history
    return model.get_weights(), history


def check_against(result, weights, history):
    from tests.models import small_cnn

    error = max_relative_error(final_weights(result.final_weights, small_cnn), weights)
    assert error < 1e-5, error
    for key, values in history.items():
        assert [epoch[key] for epoch in result.history] == pytest.approx(values, rel=1e-4, abs=1e-6), key
    return error


def test_tf_data_with_validation_and_an_infinite_one_train_fits_model(shared_workers, tmp_path):
    from tests.models import small_cnn, tf_data_blobs

    data = tf_data_blobs(8)
    weights, history = fit_oracle(data["x_train"], data["x_val"])
    spec = job("tf-data", "small_cnn", "tf_data_blobs", {}, optimizer=SGD, epochs=2, **COMPILE)
    result = train_shared(
        shared_workers, spec, ["scaling.num_workers=2"], output_dir=tmp_path / "finite", verbose=False
    )
    print(f"tf.data, 2 workers vs Keras fit: {check_against(result, weights, history):.2e}")
    # repeat(): read on across epochs, as fit does with steps_per_epoch; through rayparallel.fit, which takes
    # the function that builds the pipeline (a tf.data.Dataset cannot be sent): every worker calls it
    weights, history = fit_oracle(tf_data_blobs(8, repeat=True)["x_train"], epochs=3, steps_per_epoch=5)
    result = rayparallel.fit(
        small_cnn,
        lambda: tf_data_blobs(8, repeat=True)["x_train"],
        batch_size=8,
        epochs=3,
        steps_per_epoch=5,
        train={"optimizer": SGD, "seed": 4, **COMPILE},
        checkpoint={"monitor": "loss"},
        mlflow={"enabled": False},
        output_dir=tmp_path / "repeat",
        verbose=False,
    )
    print(f"tf.data repeat() by rayparallel.fit, 2 workers vs Keras fit: {check_against(result, weights, history):.2e}")


def test_a_pydataset_of_png_files_trains_fits_model(shared_workers, tmp_path):
    from tests.models import CountedImages, write_images

    write_images(tmp_path)
    calls_log = tmp_path / "calls.log"
    weights, history = fit_oracle(CountedImages(str(tmp_path), 8), shuffle=False)  # as layout: streams
    spec = job("pydataset", "small_cnn", "png_images", {"folder": str(tmp_path)}, optimizer=SGD, epochs=2, **COMPILE)
    spec["checkpoint"] = {"monitor": "loss"}
    calls_log.unlink()
    result = train_shared(shared_workers, spec, ["scaling.num_workers=2"], output_dir=tmp_path / "out", verbose=False)
    print(f"PyDataset, 2 workers vs Keras fit: {check_against(result, weights, history):.2e}")
    calls = collections.Counter(int(line) for line in calls_log.read_text().split())
    batches = 64 // 8
    print(f"PyDataset __getitem__ calls per global batch per epoch: {sum(calls.values()) / (2 * batches):.2f}")
    # each batch loaded once per epoch for both workers (the batch server), and the driver's check of the
    # first and last batch
    assert sum(calls.values()) == 2 * batches + 2 and set(calls) == set(range(batches)), calls


def test_a_stateful_lstm_fed_by_timeseries_dataset_from_array_trains_fits_model(shared_workers, tmp_path):
    """Streams built by `timeseries_dataset_from_array`: the same batches as `sine_streams`' arrays, so
    `fit` on those arrays (states reset where rayparallel resets them) is the oracle."""
    import numpy as np

    from tests.models import lstm_job, sine_streams, stateful_lstm, timeseries_streams

    arrays, datasets = sine_streams(6), timeseries_streams(6)
    batches = list(datasets["x_train"].as_numpy_iterator())
    assert np.array_equal(np.concatenate([x for x, _ in batches]), arrays["x_train"])  # row i: stream i
    spec = lstm_job("timeseries", "data.loader=tests.models:timeseries_streams", "train.epochs=3")
    model, history = keras_fit_streams(lstm_job("arrays", "train.epochs=3"))  # fit on sine_streams' arrays
    result = train_shared(shared_workers, spec, ["scaling.num_workers=2"], output_dir=tmp_path / "out", verbose=False)
    error = max_relative_error(final_weights(result.final_weights, stateful_lstm), model.get_weights())
    print(f"timeseries_dataset_from_array streams, 2 workers vs Keras fit: {error:.2e}")
    assert error < 1e-5
    for key, values in history.items():
        assert [epoch[key] for epoch in result.history] == pytest.approx(values, rel=1e-4, abs=1e-6), key

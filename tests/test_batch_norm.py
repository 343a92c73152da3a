"""BatchNormalization on N workers against the oracle, plain Keras `fit` in this process: the
global batch's statistics (`train.batch_norm: global`, the default) train `fit`'s model on any
worker count, uneven shards included; per-worker statistics (`local`) keep the ranks equal."""

from __future__ import annotations

import pytest

from .helpers import final_weights, job, keras_fit, max_relative_error, train_shared

pytestmark = pytest.mark.slow


def test_global_statistics_train_fits_model_on_2_and_3_workers_and_local_ones_keep_ranks_equal(
    shared_workers, tmp_path
):
    """SGD, no bias before BN, two epochs of 12 steps: the moving statistics (in the weights
    compared) and the validation figures (which normalize with them) follow `fit`'s."""
    import keras

    from tests.models import batch_norm_cnn, blobs

    compile_args = {"loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"]}
    spec = job(
        "batch-norm",
        "batch_norm_cnn",
        "blobs",
        {},
        optimizer={"class_name": "SGD", "config": {"learning_rate": 0.1}},
        epochs=2,
        **compile_args,
    )
    model, history = keras_fit(batch_norm_cnn, blobs(), dict(optimizer=keras.optimizers.SGD(0.1), **compile_args), 2)
    for workers, mode in ((2, "global"), (3, "global"), (2, "local")):  # 3: shards of 3, 3 and 2
        sets = [f"scaling.num_workers={workers}", f"train.batch_norm={mode}"]
        result = train_shared(shared_workers, spec, sets, output_dir=tmp_path / f"{mode}-{workers}", verbose=False)
        error = max_relative_error(final_weights(result.final_weights, batch_norm_cnn), model.get_weights())
        print(f"batch_norm {mode}, {workers} workers vs Keras fit: max relative weight error {error:.2e}")
        assert len({w["final_weights_sha256"] for w in result.workers}) == 1, result.workers  # one model
        if mode == "local":
            assert error > 1e-3  # each worker normalized its own rows: not fit's model, but one on every rank
            continue
        assert error < 1e-4
        for key, values in history.items():
            assert [epoch[key] for epoch in result.history] == pytest.approx(values, rel=1e-4, abs=1e-6), key

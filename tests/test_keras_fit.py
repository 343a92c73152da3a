"""rayparallel on 2 workers (and 1 where the two differ in how) against the oracle, plain Keras `fit` in this process, for
what Keras users pass to `compile` and `fit`: schedules, clipping, accumulation, weights."""

from __future__ import annotations

import pytest

from .helpers import final_weights, job, keras_fit, max_relative_error, train_shared

pytestmark = pytest.mark.slow

SCHEDULE = {"initial_learning_rate": 0.0, "decay_steps": 30, "warmup_target": 0.05, "warmup_steps": 6}


def assert_same_as_fit(shared, spec: dict, builder, model, history: dict, tmp_path, label: str, counts=(2,)) -> None:
    """The run on each worker count in `counts` (2: the promise, N workers train what `fit` trains), on the
    session's `shared` workers where it fits them."""
    for workers in counts:
        out = tmp_path / f"{spec['name']}-{workers}"
        result = train_shared(shared, spec, [f"scaling.num_workers={workers}"], output_dir=out, verbose=False)
        error = max_relative_error(final_weights(result.final_weights, builder), model.get_weights())
        print(f"{label}: {workers} workers vs Keras fit, max relative weight error {error:.2e}")
        assert error < 1e-5
        assert len(result.history) == len(history["loss"]) and set(history) <= set(result.history[0])
        for key, values in history.items():
            assert [epoch[key] for epoch in result.history] == pytest.approx(values, rel=1e-4), key


def test_schedule_global_clipnorm_accumulation_and_sample_weights(shared_workers, tmp_path):
    """Keras clips before its all-reduce (each worker's share); rayparallel clips the summed
    gradient, as one device does. Accumulation updates every 2 batches, weights scale each row."""
    import keras

    from tests.models import dense_regressor, linear_rows

    optimizer = {"class_name": "CosineDecay", "config": SCHEDULE}
    spec = job(
        "fit-clip",
        "dense_regressor",
        "linear_rows",
        {"weighted": True},
        optimizer={"class_name": "Adam", "config": {"learning_rate": optimizer, "global_clipnorm": 0.1}},
        metrics=["mae"],
        gradient_accumulation_steps=2,
    )
    schedule = keras.optimizers.schedules.CosineDecay(**SCHEDULE)
    adam = keras.optimizers.Adam(learning_rate=schedule, global_clipnorm=0.1, gradient_accumulation_steps=2)
    data = linear_rows(weighted=True)
    model, history = keras_fit(
        dense_regressor,
        data,
        dict(optimizer=adam, loss="mean_squared_error", metrics=["mae"]),
        sample_weight=data["sample_weight_train"],
    )
    label = "schedule + clip + accumulation + weights"
    assert_same_as_fit(
        shared_workers, spec, dense_regressor, model, history, tmp_path, label, counts=(1, 2)
    )  # clip: where they differ


def test_own_compute_loss_with_accumulation_and_sample_weights(shared_workers, tmp_path):
    """A model's own `compute_loss` runs in rayparallel's step as Keras' train_step calls it: the sample
    weights reach it and accumulation applies (a model's own train_step refuses both)."""
    import keras

    from tests.models import linear_rows, weighted_compute_loss

    spec = job(
        "fit-own-loss",
        "weighted_compute_loss",
        "linear_rows",
        {"weighted": True},
        optimizer={"class_name": "SGD", "config": {"learning_rate": 0.05}},
        metrics=["mae"],
        gradient_accumulation_steps=2,
    )
    data = linear_rows(weighted=True)
    sgd = keras.optimizers.SGD(0.05, gradient_accumulation_steps=2)
    model, history = keras_fit(
        weighted_compute_loss,
        data,
        dict(optimizer=sgd, loss="mean_squared_error", metrics=["mae"]),
        sample_weight=data["sample_weight_train"],
    )
    assert_same_as_fit(shared_workers, spec, weighted_compute_loss, model, history, tmp_path, "own compute_loss")


def test_class_weights_with_weight_decay_and_clipvalue(shared_workers, tmp_path):
    import keras

    from tests.models import blobs, small_cnn

    weights = {0: 1.0, 1: 4.0, 2: 0.5}
    spec = job(
        "fit-class-weight",
        "small_cnn",
        "blobs",
        {},
        optimizer={"class_name": "AdamW", "config": {"learning_rate": 0.01, "weight_decay": 0.05, "clipvalue": 0.5}},
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        class_weight=weights,
    )
    optimizer = keras.optimizers.AdamW(0.01, weight_decay=0.05, clipvalue=0.5)
    compile_args = dict(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model, history = keras_fit(small_cnn, blobs(), compile_args, class_weight=weights)
    assert_same_as_fit(shared_workers, spec, small_cnn, model, history, tmp_path, "class weights, AdamW, clipvalue")


def test_two_outputs_with_losses_weights_and_metrics_per_output(shared_workers, tmp_path):
    import keras

    from tests.models import levels_and_kinds, two_outputs

    losses = {"level": "mean_squared_error", "kind": "sparse_categorical_crossentropy"}
    loss_weights = {"level": 1.0, "kind": 0.5}
    metrics = {"level": ["mae"], "kind": ["accuracy"]}
    spec = job(
        "fit-two-outputs",
        "two_outputs",
        "levels_and_kinds",
        {},
        optimizer={"class_name": "Adam", "config": {"learning_rate": 0.02}},
        loss=losses,
        loss_weights=loss_weights,
        metrics=metrics,
    )
    compile_args = dict(optimizer=keras.optimizers.Adam(0.02), loss=losses, loss_weights=loss_weights, metrics=metrics)
    model, history = keras_fit(two_outputs, levels_and_kinds(), compile_args)
    assert {"loss", "level_loss", "kind_loss", "level_mae", "kind_accuracy", "val_kind_loss"} <= set(history)
    # 3 workers: rows 3, 3 and 2, so each output's loss tracker is fed a weighted share (`global_batch_losses`)
    assert_same_as_fit(shared_workers, spec, two_outputs, model, history, tmp_path, "two outputs", counts=(2, 3))

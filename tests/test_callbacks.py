"""Keras callbacks in rayparallel runs, checked against plain Keras `fit` in this process."""

from __future__ import annotations

import csv
import json
import math

import pytest

from .helpers import final_weights, job, keras_fit, max_relative_error, train_shared

pytestmark = pytest.mark.slow

EARLY = {"monitor": "val_loss", "patience": 2, "min_delta": 0.01, "restore_best_weights": True}
PLATEAU = {"monitor": "val_loss", "factor": 0.5, "patience": 0, "min_delta": 0.02}


def with_callbacks(callbacks: list, epochs: int = 12) -> dict:
    optimizer = {"class_name": "Adam", "config": {"learning_rate": 0.02}}
    return job(
        "callbacks",
        "dense_regressor",
        "linear_rows",
        {},
        epochs=epochs,
        optimizer=optimizer,
        metrics=["mae"],
        callbacks=callbacks,
    )


def test_early_stopping_plateau_and_writers_act_as_in_keras_fit(shared_workers, tmp_path):
    import keras

    from tests.models import dense_regressor, linear_rows

    compile_args = dict(optimizer=keras.optimizers.Adam(0.02), loss="mean_squared_error", metrics=["mae"])
    stoppers = [keras.callbacks.EarlyStopping(**EARLY), keras.callbacks.ReduceLROnPlateau(**PLATEAU)]
    oracle, fit = keras_fit(dense_regressor, linear_rows(), compile_args, epochs=12, callbacks=stoppers)
    assert len(fit["loss"]) < 12 and fit["learning_rate"][-1] < fit["learning_rate"][0]  # both acted
    for workers in (2,):  # against Keras fit on 2 workers; one worker is the same loop without the all-reduce
        out = tmp_path / f"w{workers}"
        spec = with_callbacks(
            [
                {"class_name": "EarlyStopping", "config": EARLY},
                {"class_name": "ReduceLROnPlateau", "config": PLATEAU},
                {"class_name": "CSVLogger", "config": {"filename": "history.csv"}},
                {"class_name": "TensorBoard", "config": {"log_dir": "tensorboard"}},
                {"class": "tests.callbacks:EpochRecorder", "kwargs": {"path": str(out / "epochs.jsonl")}},
                {"class": "tests.callbacks:EveryRankRecorder", "kwargs": {"path": str(out / "every-rank.jsonl")}},
            ]
        )
        result = train_shared(shared_workers, spec, [f"scaling.num_workers={workers}"], output_dir=out, verbose=False)
        error = max_relative_error(final_weights(result.final_weights, dense_regressor), oracle.get_weights())
        print(
            f"EarlyStopping + ReduceLROnPlateau: {workers} workers vs Keras fit, max relative weight error {error:.2e}"
        )
        assert error < 1e-5  # the restored best epoch's weights, as fit restores them
        assert len(result.history) == len(fit["loss"])  # stopped at the same epoch
        assert result.stopped == {"epoch": len(fit["loss"]), "reason": "EarlyStopping stopped training"}
        for key, values in fit.items():
            assert [epoch[key] for epoch in result.history] == pytest.approx(values, rel=1e-4), key
        rows = list(csv.DictReader(open(out / "history.csv")))
        assert [int(r["epoch"]) for r in rows] == list(range(len(fit["loss"])))  # written once, not per worker
        assert [float(r["learning_rate"]) for r in rows] == pytest.approx(fit["learning_rate"])
        assert len((out / "epochs.jsonl").read_text().splitlines()) == len(fit["loss"])  # rank 0 only
        assert len((out / "every-rank.jsonl").read_text().splitlines()) == workers * len(fit["loss"])
    events = list((out / "tensorboard" / "train").glob("events.out.tfevents.*"))
    assert len(events) == 1  # 2 workers, one writer
    for folder, key in (("train", "loss"), ("train", "mae"), ("validation", "val_loss")):
        tag = "epoch_" + key.removeprefix("val_")
        assert scalars(out / "tensorboard" / folder, tag) == pytest.approx(fit[key], rel=1e-4), (folder, key)
    assert len(scalars(out / "tensorboard" / "train", "epoch_learning_rate")) == len(fit["loss"])  # per epoch


def scalars(folder, tag: str) -> list[float]:
    """A tag's values by step from the event files `tensorboard --logdir` reads (TF's own reader)."""
    import tensorflow as tf

    found = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag == tag:
                    found[event.step] = float(tf.make_ndarray(value.tensor))
    return [found[step] for step in sorted(found)]


def test_scheduler_and_terminate_on_nan_end_the_run_as_finished(shared_workers, tmp_path):
    schedule = {"class_name": "LearningRateScheduler", "config": {"schedule": "tests.callbacks:halve_then_explode"}}
    spec = with_callbacks([schedule, "TerminateOnNaN"], epochs=6)
    result = train_shared(shared_workers, spec, ["scaling.num_workers=2"], output_dir=tmp_path / "nan", verbose=False)
    rates = [epoch["learning_rate"] for epoch in result.history]
    assert rates[:4] == pytest.approx([0.02, 0.02, 0.01, 0.005]) and rates[4] == math.inf  # as the schedule says
    assert len(result.history) == 5 and not math.isfinite(result.history[-1]["loss"])  # NaN in epoch 5: the end
    assert result.stopped == {"epoch": 5, "reason": "TerminateOnNaN stopped training"}
    assert json.loads((tmp_path / "nan" / "run.json").read_text())["status"] == "FINISHED"

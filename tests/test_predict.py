"""`rayparallel predict`: stateful streams equal a batch-1 loop stream by stream, stateless rows equal
`model.predict` and come back keyed, bad input is one line before anything is written or removed."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import rayparallel
from rayparallel.cli import main

from .helpers import cli, cli_env, doc_section


def saved_weights(folder, builder: str, kwargs: dict, batch_size: int = 4) -> str:
    """A checkpoint folder as a run writes it: a Keras weights file of the builder's model, listed in manifest.json."""
    from rayparallel.spec.references import resolve

    folder.mkdir(parents=True, exist_ok=True)
    resolve(builder, "model.builder")(batch_size=batch_size, **kwargs).save_weights(str(folder / "final.weights.h5"))
    manifest = {
        "model": {"builder": builder, "kwargs": kwargs},
        "checkpoints": [],
        "final": {"file": "final.weights.h5"},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return str(folder)


def readme_command() -> list[str]:
    """The `rayparallel predict` command of docs/predict.md, as written; README's is the same."""
    section = doc_section("Predict", "docs/predict.md")
    (line,) = [line for line in section.splitlines() if line.startswith("rayparallel predict ")]
    assert line in doc_section("What a run prints and leaves").splitlines()
    return line.split()[1:]


def stream_by_stream(model, x: np.ndarray, streams: int, warmup: np.ndarray | None = None) -> np.ndarray:
    """What one process computes with the batch-1 model: each stream from zero states (or after its
    training windows), window after window. Returns predictions as [stream, t, ...]."""
    windows = len(x) // streams
    out = []
    for stream in range(streams):
        for layer in model.layers:
            if getattr(layer, "stateful", False):
                layer.reset_state()
        if warmup is not None:
            for t in range(len(warmup) // streams):
                model.predict_on_batch(warmup[t * streams + stream][None])
        out.append([model.predict_on_batch(x[t * streams + stream][None])[0] for t in range(windows)])
    return np.array(out)


def by_stream(folder, name: str, shape: tuple) -> np.ndarray:
    columns = rayparallel.read_predictions(folder)
    got = np.full(shape, np.nan, dtype="float32")
    got[columns["stream"], columns["t"]] = columns[name]
    assert len(columns["t"]) == shape[0] * shape[1]  # one row per (stream, window), none twice
    return got


@pytest.mark.slow
def test_streams_equal_the_batch_1_loop_on_2_and_1_workers_with_an_mlflow_run_nested_under_training(
    default_job_runs, ray_address, tmp_path
):
    from mlflow.tracking import MlflowClient

    from jobs.stateful_lstm import load_data

    trained = default_job_runs.results[2]["checkpoint_dir"]
    data = load_data(8)
    model = rayparallel.load_model(trained, batch_size=1)
    expected = stream_by_stream(model, data["x_val"], 8)
    continued = stream_by_stream(model, data["x_val"], 8, warmup=data["x_train"])
    shape = expected.shape

    # the docs' command as written, typed in the quick start's folder after its `rayparallel train` (a clone's
    # layout: `jobs/` importable only as the working directory); the prediction nests under training's MLflow run
    runs = default_job_runs
    run = cli(*readme_command(), env=runs.env, cwd=runs.cwd)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"predicted {shape[0] * shape[1]} rows" in run.stdout and "8 streams on 2 workers" in run.stdout
    out = runs.cwd / "runs/co2-predict"
    assert np.abs(by_stream(out, "change", shape) - expected).max() < 1e-5

    # the same through Python (the page's script, run in that folder): the same rows again, overwritten
    script = tmp_path / "predict_script.py"
    script.write_text(doc_section("Predict", "docs/predict.md").split("```python\n")[1].split("```")[0])
    again = subprocess.run(
        [sys.executable, str(script)], cwd=runs.cwd, env=cli_env(runs.env), capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert np.abs(by_stream(out, "change", shape) - expected).max() < 1e-5

    summary = json.loads((out / "predict.json").read_text())
    assert summary["workers"] == 2 and summary["rows"] == shape[0] * shape[1] and summary["rows_per_s"] > 0
    client = MlflowClient(f"sqlite:///{runs.cwd / 'mlflow.db'}")  # MLflow's default store where it was typed
    training = runs.results[2]["mlflow"]["run_id"]
    logged = client.get_run(summary["mlflow"]["run_id"])
    assert logged.data.tags["mlflow.parentRunId"] == training
    assert logged.info.experiment_id == client.get_run(training).info.experiment_id
    assert logged.info.status == "FINISHED" and logged.data.metrics["rows"] == summary["rows"]
    artifacts = {a.path for a in client.list_artifacts(logged.info.run_id)}
    parts = {a.path for a in client.list_artifacts(logged.info.run_id, "predictions")}
    assert "predict.json" in artifacts and parts == {f"predictions/{name}" for name in summary["files"]}

    # 1 worker, groups of 3, 3 and 2 streams, each stream from its state at the end of the training rows
    after_training = rayparallel.predict(
        "jobs/stateful_lstm.yaml", weights=trained, out=tmp_path / "continued", split="val", num_workers=1,
        continue_states=True, overrides=["mlflow.enabled=false", "predict.batch_size=3"], verbose=False,
    )  # fmt: skip
    got = by_stream(after_training.out, "change", shape)
    assert after_training.workers == 1 and np.abs(got - continued).max() < 1e-5
    assert np.abs(got - expected).max() > 1e-3  # the states did carry over from the training rows


@pytest.mark.slow
def test_rows_through_ray_data_come_back_keyed_and_equal_model_predict_stateless_or_streams(
    ray_address, tmp_path, capsys
):
    from tests.models import blobs, small_cnn, write_blobs_to_predict

    weights = saved_weights(tmp_path / "ckpt", "tests.models:small_cnn", {})
    reference = small_cnn()
    reference.load_weights(f"{weights}/final.weights.h5")
    images = blobs(val_rows=40)["x_val"]
    expected = reference.predict_on_batch(images)

    write_blobs_to_predict(tmp_path / "data", rows=40)  # shuffled rows, each with its image_id
    job = {
        "name": "cnn-predict",
        "model": {"builder": "tests.models:small_cnn"},
        "data": {
            "dataset": "tests.models:parquet_dataset",
            "predict_dataset": "tests.models:predict_parquet",
            "kwargs": {"path": str(tmp_path / "data")},
            "x": "image",
            "y": "label",
        },
        "train": {"global_batch_size": 8},
        "scaling": {"num_workers": 2},
        "mlflow": {"enabled": False},
    }
    # a session's warm training workers would hold the CPUs the replicas wait for: the prediction closes them
    warm = rayparallel.Workers(num_workers=2, verbose=False)
    result = rayparallel.predict(job, weights=weights, out=tmp_path / "rows", overrides=["predict.batch_size=16"])
    assert "rayparallel: closing the warm workers (2 workers): the prediction needs their resources" in (
        capsys.readouterr().out
    )
    assert repr(warm) == "Workers(2 workers, closed)"
    columns = rayparallel.read_predictions(result.out)
    assert sorted(columns["image_id"]) == list(range(1000, 1040))  # every row once, keyed by the dataset's id
    assert np.abs(columns["dense"] - expected[columns["image_id"] - 1000]).max() < 1e-5

    # streams read through Ray Data: each worker's own streams, put in (stream, t) order from their columns
    from tests.models import ray_data_job, sine_streams, stateful_lstm, write_sine_streams

    write_sine_streams(tmp_path / "streams", 6, stream_major=("val",))  # one file per stream, stream after stream
    lstm = saved_weights(tmp_path / "lstm", "tests.models:stateful_lstm", {})
    streams_job = ray_data_job("streams-predict", tmp_path / "streams")
    streams_job["data"]["predict_dataset"] = "tests.models:val_parquet"
    streamed = rayparallel.predict(streams_job, weights=lstm, out=tmp_path / "streamed", verbose=False)
    one = stateful_lstm(1)
    one.load_weights(f"{lstm}/final.weights.h5")
    expected_streams = stream_by_stream(one, sine_streams(6)["x_val"], 6)
    got = by_stream(streamed.out, "dense", expected_streams.shape)
    assert streamed.workers == 2 and np.abs(got - expected_streams).max() < 1e-5

    given = rayparallel.predict(job, weights=weights, out=tmp_path / "given", x=images[::-1], verbose=False)
    columns = rayparallel.read_predictions(given.out)  # arrays passed in, as `rayparallel.fit`'s users hold them
    assert sorted(columns["row"]) == list(range(40)) and given.source == "the arrays passed as x"
    assert np.abs(columns["dense"] - expected[::-1][columns["row"]]).max() < 1e-5


def test_bad_input_is_one_line_and_an_earlier_prediction_stays(tmp_path, capsys):
    lstm = saved_weights(tmp_path / "lstm", "jobs.stateful_lstm:build_model", {"window": 8, "units": 32})
    cnn = saved_weights(tmp_path / "cnn", "tests.models:small_cnn", {})
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "predict.json").write_text("{}")
    base = ["predict", "jobs/stateful_lstm.yaml", "--set", "mlflow.enabled=false"]
    cases = {
        ("--weights", lstm, "--out", str(earlier)): "--out: expected a folder without an earlier prediction",
        ("--weights", lstm, "--out", str(earlier / "predict.json" / "x")): (
            f"--out: expected a writable folder with free space, received '{earlier / 'predict.json' / 'x'}' (a file"
        ),
        ("--weights", lstm, "--out", str(tmp_path / "a")): (
            "--split predict: expected jobs.stateful_lstm:load_data to return x_predict, received ['baselines'"
        ),
        ("--weights", lstm, "--out", str(tmp_path / "b"), "--split", "val", "--num-workers", "9"): (
            "--num-workers: expected at most 8 workers (each owns at least one of the 8 streams), received 9"
        ),
        ("--weights", cnn, "--out", str(tmp_path / "c"), "--split", "val"): (
            "--weights: expected weights of the job's model (jobs.stateful_lstm:build_model), received"
        ),
        ("--weights", lstm, "--out", str(tmp_path / "d"), "--split", "val", "--set", "model.kwargs.units=16"): (
            "model.kwargs: expected arguments that keep the trained weights' shapes"
        ),
        ("--weights", lstm, "--out", str(tmp_path / "e"), "--split", "val", "--set", "data.layout=shuffle",
         "--continue-states"): "--continue-states: expected a job with layout streams",
    }  # fmt: skip
    for args, expected in cases.items():
        assert main([*base, *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"rayparallel: error: {expected}") and err.count("\n") == 1, err
    assert (earlier / "predict.json").read_text() == "{}"
    assert not any((tmp_path / name).exists() for name in "abcde")  # refused before the folder was made

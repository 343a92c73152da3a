"""MLflow tracking against a real `mlflow server` on 127.0.0.1 (and the embedded sqlite default)."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

import rayparallel
from tests.models import lstm_job

from .helpers import MlflowServer

pytestmark = pytest.mark.slow

LSTM = lstm_job("mlflow-lstm", "train.epochs=3", "train.progress_every_n_steps=2")


def test_run_is_complete_in_a_real_server_and_leaks_no_credential(
    ray_address, mlflow_server, tmp_path, capsys, monkeypatch
):
    import mlflow
    from mlflow.tracking import MlflowClient

    password = "s3cret-pw"  # the server has no auth and ignores it; it must appear nowhere we write
    spec = dict(
        LSTM,
        mlflow={
            "tracking_uri": mlflow_server.uri.replace("http://", f"http://rp-user:{password}@"),
            "experiment": "rp-tests",
            "register_model": "rp-lstm",
            "log_step_loss": True,
            "tags": {"team": "tests", "api_token": f"tok-{password}"},
        },
    )
    result = rayparallel.train(spec, output_dir=tmp_path / "out", verbose=True)
    console = capsys.readouterr()
    assert "MLflow run" in console.out and password not in console.out + console.err
    leaking = [p for p in (tmp_path / "out").rglob("*") if p.is_file() and password.encode() in p.read_bytes()]
    assert not leaking, leaking
    client = MlflowClient(mlflow_server.uri)
    experiment = client.get_experiment_by_name("rp-tests")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1  # one run per training run, never one per worker
    run = runs[0]
    assert run.info.run_id == result.mlflow["run_id"]
    assert run.info.status == "FINISHED"
    assert (
        result.mlflow["url"] == f"{mlflow_server.uri}/#/experiments/{experiment.experiment_id}/runs/{run.info.run_id}"
    )
    params = run.data.params
    assert params["train.global_batch_size"] == "6" and params["num_workers"] == "2"
    assert params["per_worker_batch_size"] == "3" and params["version.keras"].startswith("3.")
    assert run.data.tags["team"] == "tests" and run.data.tags["rayparallel.num_nodes"] == "1"
    assert run.data.tags["rayparallel.ray_run_name"].startswith("mlflow-lstm-")
    assert run.data.tags["mlflow.user"] and run.data.tags["mlflow.source.type"] == "LOCAL"  # the Overview's
    assert "pytest" in run.data.tags["mlflow.source.name"]  # Created by and Source: what called train()
    duration = (run.info.end_time - run.info.start_time) / 1000  # the Overview's Duration: the whole command
    assert duration >= result.seconds - 1, (duration, result.seconds)
    assert run.data.tags["api_token"] == "***" and params["mlflow.tracking_uri"].startswith("http://rp-user:***@")
    assert not [v for v in [*params.values(), *run.data.tags.values()] if password in v]
    for key in ("loss", "val_loss", "mae", "val_mae"):
        history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        assert [m.step for m in history] == [1, 2, 3]
        assert np.allclose([m.value for m in history], [h[key] for h in result.history], rtol=1e-6)
    assert len(client.get_metric_history(run.info.run_id, "step_loss")) >= 3
    top = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"job.yaml", "result.json", "checkpoints"} <= top
    ckpts = {a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")}
    assert {"checkpoints/epoch-003.weights.h5", "checkpoints/final.weights.h5", "checkpoints/manifest.json"} <= ckpts
    (trained_on,) = run.inputs.dataset_inputs  # mlflow.log_input: source, schema, digest, rows
    assert trained_on.dataset.name == "train: tests.models:sine_streams" and len(trained_on.dataset.digest) == 10
    assert '"num_rows": 24' in trained_on.dataset.profile and '"x": ["float32", [5, 2]]' in trained_on.dataset.schema
    assert [(t.key, t.value) for t in trained_on.tags] == [("mlflow.data.context", "training")]

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)  # for models:/ below
    model_id = run.outputs.model_outputs[0].model_id
    model = mlflow.keras.load_model(f"models:/{model_id}")
    assert model.inputs[0].shape[0] == 1  # rebuilt at mlflow.model_batch_size
    assert model.predict_on_batch(np.zeros((1, 5, 2), "float32")).shape == (1, 5, 1)
    signature = mlflow.models.get_model_info(f"models:/{model_id}").signature  # what serving says it takes
    assert signature.inputs.to_dict() == [{"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": (-1, 5, 2)}}]
    versions = client.search_model_versions("name='rp-lstm'")
    assert len(versions) == 1 and versions[0].run_id == run.info.run_id


def test_server_down_mid_run_training_completes_and_says_what_was_not_logged(ray_address, tmp_path, capsys):
    (tmp_path / "srv").mkdir()
    server = MlflowServer(tmp_path / "srv")
    spec = dict(LSTM, mlflow={"tracking_uri": server.uri, "experiment": "rp-down", "flush_timeout_s": 3})

    def stop_when_run_exists():
        from mlflow.tracking import MlflowClient

        client = MlflowClient(server.uri)
        while True:
            experiment = client.get_experiment_by_name("rp-down")
            if experiment and client.search_runs([experiment.experiment_id]):
                return server.stop()
            time.sleep(0.2)

    stopper = threading.Thread(target=stop_when_run_exists, daemon=True)
    stopper.start()
    try:
        result = rayparallel.train(spec, output_dir=tmp_path / "out", verbose=True)
    finally:
        server.stop()
    out = capsys.readouterr().out
    assert len(result.history) == 3 and (tmp_path / "out" / "checkpoints" / "final.weights.h5").exists()
    assert out.count("WARNING MLflow: cannot log to") == 1
    assert "Traceback" not in out
    assert "metrics" in result.mlflow["unlogged"]
    unlogged = json.loads((tmp_path / "out" / "mlflow_unlogged.json").read_text())
    metrics = [r for r in unlogged["records"] if r["kind"] == "metrics"]
    assert {r["step"] for r in metrics if "loss" in r["metrics"]} == {1, 2, 3}  # the epochs' logs
    assert unlogged["run_id"] == result.mlflow["run_id"]
    assert unlogged["last_error"].split(":")[0] in {r["kind"] for r in unlogged["records"]}  # one left unlogged
    assert f"({unlogged['last_error']})" in out  # the console says why, once
    assert {"num_workers": 2.0} in [r["metrics"] for r in metrics if r["step"] == 0]  # the worker count at start
    assert f"the records are in {tmp_path / 'out' / 'mlflow_unlogged.json'}" in out


def test_embedded_default_is_the_local_sqlite_store(default_job_runs):
    """README's quick start: no tracking URI anywhere, the run is in `./mlflow.db` of the folder it ran in."""
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{default_job_runs.cwd}/mlflow.db"
    assert f"browse: mlflow ui --backend-store-uri {store}" in default_job_runs.stdout[2]
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("stateful-lstm-co2").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].info.run_id == default_job_runs.results[2]["mlflow"]["run_id"]
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "val_loss")] == [1, 2, 3]

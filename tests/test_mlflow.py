"""MLflow tracking against a real `mlflow server` on 127.0.0.1 (and the embedded sqlite default)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tests.models import lstm_job

from . import browser
from .helpers import MlflowServer, train_shared

pytestmark = pytest.mark.slow

LSTM = lstm_job("mlflow-lstm", "train.epochs=3", "train.progress_every_n_steps=2")


def test_run_is_complete_in_a_real_server_and_leaks_no_credential(
    shared_workers, mlflow_server, tmp_path, capsys, monkeypatch
):
    from mlflow.tracking import MlflowClient

    password = "s3cret-pw"  # the server has no auth and ignores it; it must appear nowhere we write
    spec = dict(
        LSTM,
        mlflow={
            "tracking_uri": mlflow_server.uri.replace("http://", f"http://rp-user:{password}@"),
            "experiment": "rp-tests",
            "register_model": "rp-lstm",
            "log_step_loss": True,
            "log_checkpoints": True,
            "system_metrics_interval_s": 1,
            "tags": {"team": "tests", "api_token": f"tok-{password}"},
        },
        checkpoint={"keep": 1},  # the best by val_loss and the newest
    )
    result = train_shared(shared_workers, spec, output_dir=tmp_path / "out", verbose=True)
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
    assert [m.value for m in client.get_metric_history(run.info.run_id, "num_workers")] == [2]  # at its start
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
    (node,) = {w["node_id"][:8] for w in result.workers}  # the System Metrics tab: one sampler for the node
    sampled = client.get_metric_history(run.info.run_id, f"system/{node}/cpu_utilization_percentage")
    assert len(sampled) >= 2 and [m.step for m in sampled] == list(range(len(sampled)))
    assert run.data.metrics[f"system/{node}/rayparallel_workers_memory_megabytes"] > 100  # two TF processes
    top = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"job.yaml", "result.json", "checkpoints"} <= top
    ckpts = {a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")}
    assert {"checkpoints/epoch-003.weights.h5", "checkpoints/final.weights.h5", "checkpoints/manifest.json"} <= ckpts
    (trained_on,) = run.inputs.dataset_inputs  # mlflow.log_input: source, schema, digest, rows
    assert trained_on.dataset.name == "train: tests.models:sine_streams" and len(trained_on.dataset.digest) == 10
    assert '"num_rows": 24' in trained_on.dataset.profile and '"x": ["float32", [5, 2]]' in trained_on.dataset.schema
    assert [(t.key, t.value) for t in trained_on.tags] == [("mlflow.data.context", "training")]

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)  # for models:/ below
    check_logged_models(client, run, result, tmp_path / "out" / "checkpoints")
    check_ui_pages(mlflow_server.uri, run, node, tmp_path)


def check_ui_pages(uri, run, node, folder):
    """The run's pages as a browser shows them (docs/mlflow-ui.md), where Chromium is installed:
    the node's System Metrics section, the registered version, each kept checkpoint in the Models tab."""
    why = browser.missing()
    if why:
        print(f"MLflow UI pages not rendered: {why}")  # only the screenshots; every assertion above ran
        return
    texts = browser.run_pages(uri, run.info.experiment_id, run.info.run_id, folder / "ui")
    assert (
        f"system/{node}" in texts["system-metrics"] and "rayparallel_workers_cpu_percentage" in texts["system-metrics"]
    )
    assert "rp-lstm" in texts["overview"] and "Finished" in texts["overview"]
    kept = [p.name.removesuffix(".weights.h5") for p in (folder / "out" / "checkpoints").glob("epoch-*.weights.h5")]
    assert kept and all(name in texts["models"] for name in kept), (kept, texts["models"][:2000])


def check_logged_models(client, run, result, folder):
    """The final model as `model`; each kept weight file a logged model at its epoch with that epoch's
    figures, a dropped file's model gone; the best file registered, `@champion` serving from a new process."""
    import mlflow

    from rayparallel.tracking.keras_models import CHECKPOINT_TAG

    models = client.search_logged_models([run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'")
    steps = {output.model_id: output.step for output in run.outputs.model_outputs}
    (final,) = [m for m in models if m.name == "model"]
    checkpoints = {m.tags[CHECKPOINT_TAG]: m for m in models if CHECKPOINT_TAG in m.tags}
    kept = sorted(p.name for p in folder.glob("epoch-*.weights.h5"))
    assert sorted(checkpoints) == kept and len(kept) < 3, (sorted(checkpoints), kept)  # one dropped at least
    for file, logged in checkpoints.items():
        epoch = int(file.removeprefix("epoch-")[:3])
        assert steps[logged.model_id] == epoch and logged.name == file.removesuffix(".weights.h5")
        linked = {metric.key: metric.value for metric in logged.metrics}
        assert linked["val_loss"] == pytest.approx(result.history[epoch - 1]["val_loss"]), (file, linked)
    for key in ("loss", "val_loss"):  # linking added no second point at a step
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [1, 2, 3]

    model = mlflow.keras.load_model(f"models:/{final.model_id}")
    assert model.inputs[0].shape[0] == 1  # rebuilt at mlflow.model_batch_size
    assert model.predict_on_batch(np.zeros((1, 5, 2), "float32")).shape == (1, 5, 1)
    signature = mlflow.models.get_model_info(f"models:/{final.model_id}").signature  # what serving says it takes
    assert signature.inputs.to_dict() == [{"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": (-1, 5, 2)}}]

    best = json.loads((folder / "manifest.json").read_text())["best"]
    (version,) = client.search_model_versions("name='rp-lstm'")
    assert version.run_id == run.info.run_id and version.source == f"models:/{checkpoints[best].model_id}"
    assert client.get_model_version_by_alias("rp-lstm", "champion").version == version.version
    served = subprocess.run(  # a fresh process, as a deployment loads it
        [sys.executable, "-c", SERVE], capture_output=True, text=True, timeout=300, env=dict(os.environ)
    )
    assert served.returncode == 0 and served.stdout.strip().endswith("(1, 5, 1)"), served.stderr[-2000:]


SERVE = """import mlflow, numpy as np
model = mlflow.pyfunc.load_model("models:/rp-lstm@champion")
print(np.asarray(model.predict(np.zeros((1, 5, 2), "float32"))).shape)"""


def test_server_down_mid_run_training_completes_and_says_what_was_not_logged(shared_workers, tmp_path, capsys):
    (tmp_path / "srv").mkdir()
    server = MlflowServer(tmp_path / "srv")
    settings = {"experiment": "rp-down", "flush_timeout_s": 3, "log_checkpoints": True, "system_metrics_interval_s": 1}
    # 5 epochs of 298 steps: the run trains on for seconds after the server is gone (its MLflow run is created
    # a few seconds into training), so the failure is met and said while it trains, not only at its end
    epochs = 5
    spec = lstm_job("mlflow-down", f"train.epochs={epochs}", "data.kwargs.windows=300")
    spec["mlflow"] = {"tracking_uri": server.uri, **settings}

    def stop_when_run_exists():
        from mlflow.tracking import MlflowClient

        client = MlflowClient(server.uri)
        while True:
            experiment = client.get_experiment_by_name("rp-down")
            if experiment and client.search_runs([experiment.experiment_id]):
                return server.stop(signal.SIGKILL)  # no graceful end that holds a request until it times out
            time.sleep(0.2)

    stopper = threading.Thread(target=stop_when_run_exists, daemon=True)
    stopper.start()
    try:
        result = train_shared(shared_workers, spec, output_dir=tmp_path / "out", verbose=True)
    finally:
        server.stop()
    out = capsys.readouterr().out
    assert len(result.history) == epochs and (tmp_path / "out" / "checkpoints" / "final.weights.h5").exists()
    assert out.count("WARNING MLflow: cannot log to") == 1
    assert "Traceback" not in out
    assert "metrics" in result.mlflow["unlogged"]
    unlogged = json.loads((tmp_path / "out" / "mlflow_unlogged.json").read_text())
    metrics = [r for r in unlogged["records"] if r["kind"] == "metrics"]
    assert {r["step"] for r in metrics if "loss" in r["metrics"]} == set(range(1, epochs + 1))  # the epochs' logs
    assert unlogged["run_id"] == result.mlflow["run_id"]
    assert unlogged["last_error"].split(":")[0] in {r["kind"] for r in unlogged["records"]}  # one left unlogged
    assert f"({unlogged['last_error']})" in out  # the console says why, once
    assert f"the records are in {tmp_path / 'out' / 'mlflow_unlogged.json'}" in out
    assert [r["file"] for r in unlogged["records"] if r["kind"] == "checkpoint"] == [
        f"epoch-{epoch:03d}.weights.h5" for epoch in range(1, epochs + 1)
    ]  # each a logged model when the server is back: kept, not lost
    assert any(key.startswith("system/") for r in metrics for key in r["metrics"])  # the samples too


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

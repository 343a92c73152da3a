"""The MLflow run's pure parts: no server, no Ray."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from rayparallel.tracking.store import enter_working_directory


def test_a_replaced_working_directory_is_entered_again(tmp_path):
    """A runtime_env working_dir unpacked anew under a running actor: MLflow's `Path.cwd()` must work again."""
    folder, before = tmp_path / "working_dir", os.getcwd()
    folder.mkdir()
    os.chdir(folder)
    try:
        shutil.rmtree(folder)
        folder.mkdir()  # the same path, a new folder: the process is still in the deleted one
        enter_working_directory(str(folder))
        assert os.getcwd() == str(folder)
        enter_working_directory(str(tmp_path))  # a directory that exists is left as it is
        assert os.getcwd() == str(folder)
    finally:
        os.chdir(before)


def test_mlflows_default_store_is_chosen_without_mlflow_and_the_run_waits_for_its_release(tmp_path, monkeypatch):
    """The driver leaves MLflow's default to the recorder without importing MLflow; the recorder's run
    is created only once released (the first step), in the folder's sqlite store even where its own
    environment names another store, and its records all arrive."""
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    from rayparallel.tracking.mlflow_run import MlflowRun, TrackingSettings

    probe = (
        "import sys; from rayparallel.tracking.store import tracking_uri_as_set as t; "
        "print(t(None), t('sqlite:///x.db'), 'mlflow' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    seen = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert seen.stdout.split() == ["None", "sqlite:///x.db", "False"]

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/elsewhere.db")
    warnings: list[str] = []
    started_at = time.time() - 30  # the command started before the run is created (its first step)
    settings = TrackingSettings(None, "held", "run-1", tmp_path / "unlogged.json", {"t": "1"}, started_at=started_at)
    run = MlflowRun(settings, warnings.append)
    run.log_metrics({"loss": 0.5}, step=1)
    assert not run.wait_started(1.0) and run.run_id is None  # held: nothing created yet
    run.release()
    assert run.wait_started(60), warnings
    assert run.finish("FINISHED", 60) == [] and not warnings
    store = f"sqlite:///{tmp_path}/mlflow.db"
    assert run.tracking_uri == store and not (tmp_path / "elsewhere.db").exists()
    logged = MlflowClient(store).get_run(run.run_id)
    assert logged.info.status == "FINISHED" and logged.data.metrics == {"loss": 0.5} and logged.data.tags["t"] == "1"
    assert logged.info.start_time == int(started_at * 1000)  # the Overview's Duration is the command's


@pytest.mark.slow
def test_a_process_killed_while_mlflow_builds_a_new_sqlite_store_leaves_none_behind(tmp_path):
    """MLflow's migrations are not one transaction: killed among them, a store was left that no
    later process could open (CI: "duplicate column name: routing_strategy" after a recorder was
    killed in its first epoch). Built aside, the real path is either absent or whole."""
    import signal
    import subprocess
    import sys

    from rayparallel.tracking.sqlite_store import mlflow_client

    database = tmp_path / "mlflow.db"
    uri = f"sqlite:///{database}"
    builder = subprocess.Popen(
        [sys.executable, "-c", f"from rayparallel.tracking.sqlite_store import mlflow_client; mlflow_client({uri!r})"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    aside = tmp_path / f".mlflow.db.building-{builder.pid}"
    deadline = time.monotonic() + 120
    while not (aside.exists() and aside.stat().st_size > 64 * 1024) and time.monotonic() < deadline:
        time.sleep(0.05)  # some tables made, the migrations under way
    builder.send_signal(signal.SIGKILL)
    builder.wait()
    assert aside.exists(), "the builder never got to the migrations"
    assert not database.exists()  # not half a store at the real path

    client = mlflow_client(uri)  # the next process builds its own and opens it
    run = client.create_run(client.create_experiment("after-a-kill")).info.run_id
    client.log_metric(run, "loss", 0.5)
    assert [m.value for m in client.get_metric_history(run, "loss")] == [0.5]
    left = {p.name for p in tmp_path.iterdir()} - {f"{aside.name}-journal"}  # killed mid-transaction: its journal
    assert left == {"mlflow.db", aside.name}  # the dead one's copy only

"""MLflow's store as rayparallel uses it: which store, which experiment, which run, what a run shows as its source.

Functions of the MLflow client only, with no state: the delivery thread (`mlflow_run`), a sweep's parent
run (`sweep_run`) and predictions (`inference/record.py`) share them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from ..secrets import without_credentials

# What MLflow's UI shows as who ran it and from where, on the run and on each of its models
SOURCE_TAGS = ("mlflow.source.name", "mlflow.source.type", "mlflow.user")
# MLflow's prefix of system metrics (`system/<node>/<name>` for each node of a multi-node run)
SYSTEM_PREFIX = "system/"


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str | None:
    """The MLflow UI address of a run, for http(s) tracking servers (as MLflow prints it)."""
    if tracking_uri.startswith(("http://", "https://")):
        return f"{without_credentials(tracking_uri).rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
    return None


def artifact_root(tracking_uri: str) -> str | None:
    """For a sqlite store, artifacts beside the database (`<its folder>/mlruns`), wherever the
    command runs; MLflow's own default is `./mlruns` of the process that creates the experiment.
    For the default store (`sqlite:///mlflow.db` here) both are the same folder."""
    if not tracking_uri.startswith("sqlite:///"):
        return None  # a server decides (--artifacts-destination)
    database = Path(tracking_uri.removeprefix("sqlite:///"))
    return (database.resolve().parent / "mlruns").as_uri()


def experiment_id(client: Any, name: str, tracking_uri: str) -> str:
    """The experiment's id, created (artifacts where `artifact_root` says) if it does not exist yet."""
    found = client.get_experiment_by_name(name)
    if found:
        return found.experiment_id
    return client.create_experiment(name, artifact_location=artifact_root(tracking_uri))


def chosen_tracking_uri(configured: str | None) -> str:
    """The job's `mlflow.tracking_uri`, else MLflow's own choice (`MLFLOW_TRACKING_URI`, else `sqlite:///mlflow.db`)."""
    if configured:
        return configured
    import mlflow

    return mlflow.get_tracking_uri()


def tracking_uri_as_set(configured: str | None) -> str | None:
    """What `chosen_tracking_uri` gives when the choice is made here: the job's, the one of an MLflow
    this process imported (`mlflow.set_tracking_uri`), `MLFLOW_TRACKING_URI`; None when MLflow's default
    is left, which the process that logs resolves in the same folder. The driver does not import MLflow
    for it: a second of CPU on the way to the first step."""
    if configured or "mlflow" in sys.modules:
        return chosen_tracking_uri(configured)
    return os.environ.get("MLFLOW_TRACKING_URI") or None


def open_run(
    client: Any, tracking_uri: str, experiment: str, run_name: str, run_id: str | None, started_at: float | None = None
) -> tuple[str, str]:
    """(experiment id, run id): the run `run_id` reopened as RUNNING (a resume), else a new run that started
    at `started_at` (the command's start: the run is created only after the first step, `MlflowRun.release`)."""
    if run_id:
        found = client.get_run(run_id).info.experiment_id
        client.update_run(run_id, status="RUNNING")
        return found, run_id
    created = experiment_id(client, experiment, tracking_uri)
    start_time = int(started_at * 1000) if started_at else None
    return created, client.create_run(created, run_name=run_name, start_time=start_time).info.run_id


def enter_working_directory(path: str) -> None:
    """Be in `path` again if this process's working directory was replaced (MLflow's `log_model`
    reads `Path.cwd()`). A job's runtime_env working_dir is unpacked anew when another node on
    the same host joins (as in a one-machine cluster), which deletes the folder a running actor
    is in; the new one is at the same path."""
    try:
        os.getcwd()
    except FileNotFoundError:
        os.chdir(path if os.path.isdir(path) else Path(path).anchor)


def source_tags(source: str) -> dict[str, str]:
    """What MLflow's UI shows as a run's Source and who ran it, as its own fluent API sets them."""
    import getpass

    ipython = sys.modules.get("IPython")  # a notebook: a running kernel, not a module imported (nbclient does)
    shell = ipython.get_ipython() if ipython is not None else None
    kind = "NOTEBOOK" if getattr(shell, "kernel", None) is not None else "LOCAL"
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = str(os.getuid())
    return {"mlflow.source.name": source, "mlflow.source.type": kind, "mlflow.user": user}


def dataset_input(description: dict) -> Any:
    """One dataset (source, schema, digest, row count) in MLflow's run inputs, with its context tag."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    source = description["source"]
    dataset = Dataset(
        name=description["name"],
        digest=description["digest"],
        source_type="local" if source.startswith("/") else "code",
        source=json.dumps({"uri": source}),
        schema=json.dumps({"columns": description["schema"]}),
        profile=json.dumps({"num_rows": description["rows"]}),
    )
    return DatasetInput(dataset, tags=[InputTag("mlflow.data.context", description["context"])])

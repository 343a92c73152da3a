"""A registered model of the MLflow registry, as training registers it (`mlflow.register_model`): which
version a `models:/NAME@ALIAS` (or `models:/NAME/VERSION`) means, the run and checkpoint it came from, and
its Keras model downloaded, for a caller that rebuilds the job's model at another batch from its weights."""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import RayParallelError, first_line
from .keras_models import CHECKPOINT_TAG
from .sqlite_store import mlflow_client

MODEL_URI = re.compile(r"models:/(?P<name>[^/@]+)(@(?P<alias>[^/]+)|/(?P<version>\d+))")


@dataclass(frozen=True)
class Registered:
    uri: str  # as given: models:/co2@champion
    name: str
    version: str
    run_id: str
    checkpoint: str  # the weights file the version was logged from ('' if not a rayparallel checkpoint)
    builder: str  # the run's `model.builder` param ('' if the run has none)
    keras_file: Path  # the logged Keras model, downloaded

    def why(self) -> str:
        """For the console: which version and where it came from."""
        came_from = f", checkpoint {self.checkpoint}" if self.checkpoint else ""
        return f"version {self.version} of {self.name}, run {self.run_id}{came_from}"


def registered(uri: str, tracking_uri: str) -> Registered:
    """The version `uri` names in the registry at `tracking_uri`, its Keras model downloaded to a temporary folder."""
    import mlflow

    found = MODEL_URI.fullmatch(uri)
    if found is None:
        raise RayParallelError(f"--model: expected models:/NAME@ALIAS or models:/NAME/VERSION, received {uri!r}")
    client = mlflow_client(tracking_uri)
    try:
        if found["alias"]:
            version = client.get_model_version_by_alias(found["name"], found["alias"])
        else:
            version = client.get_model_version(found["name"], found["version"])
    except Exception as exc:  # MlflowException: no such model, alias or version
        raise RayParallelError(
            f"--model: expected a registered model version, received {uri!r} ({first_line(exc)})"
        ) from None
    mlflow.set_tracking_uri(tracking_uri)
    folder = mlflow.artifacts.download_artifacts(
        f"models:/{version.name}/{version.version}", dst_path=tempfile.mkdtemp()
    )
    keras_files = sorted(Path(folder).rglob("*.keras"))
    if not keras_files:
        raise RayParallelError(f"--model: expected a Keras model (mlflow.keras) in {uri!r}, received none")
    # the logged model it was registered from (MLflow 3 keeps its id in `source`, `models:/m-...`)
    model_id = version.model_id or (version.source or "").removeprefix("models:/")
    logged = client.get_logged_model(model_id) if model_id.startswith("m-") else None
    run = client.get_run(version.run_id) if version.run_id else None
    checkpoint = logged.tags.get(CHECKPOINT_TAG, "") if logged else ""
    builder = run.data.params.get("model.builder", "") if run else ""
    return Registered(
        uri, version.name, str(version.version), version.run_id or "", checkpoint, builder, keras_files[0]
    )

"""A sweep's MLflow parent run; each trial's own run is its child (tag `mlflow.parentRunId`).

The sweep driver is not training, so it talks to MLflow directly: the parent must exist
before the first trial starts (the children name it), so an unreachable server is an
error here, before any trial, rather than records retried in the background.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import RayParallelError, first_line
from ..secrets import mask_text
from .keras_models import log_keras_model
from .sqlite_store import mlflow_client
from .store import open_run, run_url

if TYPE_CHECKING:
    import keras

PARENT_TAG = "mlflow.parentRunId"
BEST_TAG = "rayparallel.best_trial"


class SweepRun:
    """The parent run: created (or, for a resumed sweep, reopened) at construction."""

    def __init__(self, tracking_uri: str, experiment: str, run_name: str, run_id: str | None = None):
        self.tracking_uri, self.experiment = tracking_uri, experiment
        try:
            self.client = mlflow_client(tracking_uri)
            self.experiment_id, self.run_id = open_run(self.client, tracking_uri, experiment, run_name, run_id)
        except Exception as exc:  # MLflow raises its own and the HTTP client's errors
            raise RayParallelError(
                f"mlflow.tracking_uri: expected a reachable MLflow store for the sweep's parent run, received "
                f"{mask_text(tracking_uri)!r} ({type(exc).__name__}: {mask_text(first_line(exc, 200))}); "
                "or set mlflow.enabled=false"
            ) from None

    @property
    def url(self) -> str | None:
        return run_url(self.tracking_uri, self.experiment_id, self.run_id)

    def info(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "url": self.url,
            "experiment": self.experiment,
            "tracking_uri": mask_text(self.tracking_uri),
        }

    def log_params(self, params: dict[str, str]) -> None:
        """Params once: a resumed sweep's parent keeps the ones it has (MLflow refuses changes)."""
        existing = self.client.get_run(self.run_id).data.params
        for key, value in params.items():
            if key not in existing:
                self.client.log_param(self.run_id, key, value)

    def log_best(self, trial: str, child_run_id: str | None, history: list[dict]) -> None:
        """The best trial's per-epoch figures on the parent, and which child it is on both."""
        from mlflow.entities import Metric

        metrics = [
            Metric(key, float(value), 0, epoch)
            for epoch, logs in enumerate(history, start=1)
            for key, value in logs.items()
            if isinstance(value, (int, float))
        ]
        for start in range(0, len(metrics), 500):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 500])
        self.client.set_tag(self.run_id, BEST_TAG, trial)
        if child_run_id:
            self.client.set_tag(self.run_id, "rayparallel.best_run_id", child_run_id)
            self.client.set_tag(child_run_id, BEST_TAG, "true")

    def log_model(self, build: Callable[[], keras.Model], registered_model_name: str | None, alias: str | None) -> None:
        model = build()
        log_keras_model(self.tracking_uri, self.run_id, model, registered_model_name=registered_model_name, alias=alias)

    def log_artifact(self, path: str) -> None:
        self.client.log_artifact(self.run_id, path)

    def end_orphans(self, kept: set[str]) -> list[str]:
        """Children left RUNNING by an interrupted sweep whose trial started over: ended as KILLED."""
        children = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{PARENT_TAG}` = '{self.run_id}' and attributes.status = 'RUNNING'",
        )
        orphans = [run.info.run_id for run in children if run.info.run_id not in kept]
        for run_id in orphans:
            self.client.set_terminated(run_id, status="KILLED")
        return orphans

    def end(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=status)

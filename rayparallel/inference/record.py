"""A prediction's MLflow run: nested under the training run it came from, else in the job's experiment.

The training run is the one `result.json` names beside the weights' folder (a run's output
folder holds both); the prediction's figures are metrics, its settings params, and its
`predict.json` and Parquet files the run's artifacts (`predictions/`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import first_line
from ..secrets import mask, mask_text
from .output import SUMMARY

if TYPE_CHECKING:
    from ..spec import JobSpec

FIGURES = ("rows", "seconds", "rows_per_s", "workers")  # metrics
PARAMS = ("split", "layout", "weights", "batch_size", "source")


def training_run_id(weights: Path) -> str | None:
    """The MLflow run of the training that wrote `weights`, from its output folder's result.json."""
    for folder in (weights.parent, weights.parent.parent):
        result = folder / "result.json"
        if result.is_file():
            try:
                return (json.loads(result.read_text()).get("mlflow") or {}).get("run_id")
            except (ValueError, OSError):
                return None
    return None


@dataclass
class PredictionRun:
    """The prediction's MLflow run, RUNNING until `log` ends it."""

    client: Any
    run_id: str
    experiment_id: str
    tracking_uri: str
    parent: str | None  # the training run it is nested under

    def info(self) -> dict:
        from ..tracking.store import run_url

        url = run_url(self.tracking_uri, self.experiment_id, self.run_id)
        return {
            "run_id": self.run_id,
            "parent_run_id": self.parent,
            "tracking_uri": mask_text(self.tracking_uri),
            "url": url,
        }

    def log(self, summary: dict, out: Path) -> None:
        """The figures, the settings, predict.json and the Parquet files (`predictions/`); the run FINISHED."""
        self.client.log_batch(
            self.run_id,
            metrics=[_metric(name, summary[name]) for name in FIGURES],
            params=[_param(name, summary[name]) for name in PARAMS],
        )
        self.client.log_artifact(self.run_id, str(out / SUMMARY))
        for part in summary["files"]:
            self.client.log_artifact(self.run_id, str(out / part), "predictions")
        self.client.set_terminated(self.run_id, "FINISHED")


def open_prediction_run(job: JobSpec, weights: Path, source: str) -> PredictionRun:
    """A new run for the prediction: nested under the training run of `weights` when this store holds it."""
    from ..tracking.sqlite_store import mlflow_client
    from ..tracking.store import chosen_tracking_uri, experiment_id, source_tags

    tracking_uri = chosen_tracking_uri(job.mlflow.tracking_uri)
    client = mlflow_client(tracking_uri)
    tags = {**source_tags(source), **mask(job.mlflow.tags), "rayparallel.command": "predict"}
    parent = training_run_id(weights)
    experiment = None
    if parent:
        try:
            experiment = client.get_run(parent).info.experiment_id
            tags["mlflow.parentRunId"] = parent
        except Exception:  # the training logged to another store: a run of its own, in the job's experiment
            parent = None
    if experiment is None:
        experiment = experiment_id(client, job.mlflow.experiment or job.name, tracking_uri)
    run = client.create_run(experiment, run_name=f"predict-{job.name}", tags=tags)
    return PredictionRun(client, run.info.run_id, experiment, tracking_uri, parent)


def unlogged(exc: BaseException) -> dict:
    """What predict.json says when MLflow could not take the run (the predictions are on disk)."""
    return {"unlogged": f"{type(exc).__name__}: {first_line(exc, 200)}"}


def _metric(name: str, value: float) -> object:
    import time

    from mlflow.entities import Metric

    return Metric(name, float(value), int(time.time() * 1000), 0)


def _param(name: str, value: object) -> object:
    from mlflow.entities import Param

    return Param(name, str(value))

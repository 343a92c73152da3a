"""What the run's delivery thread delivers to MLflow (`mlflow_run.MlflowRun`): one small class per kind, each
delivering itself; `kind` names it in `mlflow_unlogged.json` when it could not be delivered."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from .keras_models import CHECKPOINT_TAG, checkpoint_models, log_keras_model
from .store import SYSTEM_PREFIX, dataset_input

if TYPE_CHECKING:
    from .mlflow_run import MlflowRun


class Record:
    """One thing to deliver to the run; `kind` names it in `mlflow_unlogged.json` (and in the last error)."""

    kind: ClassVar[str]

    def deliver(self, run: MlflowRun, client: Any) -> None:
        raise NotImplementedError

    def unlogged(self) -> dict:
        """What `mlflow_unlogged.json` keeps of it: its fields, but a model's builder."""
        return {"kind": self.kind, **{k: v for k, v in asdict(self).items() if k != "build"}}


@dataclass
class Start(Record):
    """The run created, or a resumed one reopened: first of all."""

    kind = "start"

    def deliver(self, run: MlflowRun, client: Any) -> None:
        run.open(client)


@dataclass
class Params(Record):
    kind = "params"
    params: dict

    def deliver(self, run: MlflowRun, client: Any) -> None:
        from mlflow.entities import Param

        existing = client.get_run(run.run_id).data.params
        params = [Param(k, v) for k, v in self.params.items() if k not in existing]  # a resumed run keeps its own
        for i in range(0, len(params), 100):
            client.log_batch(run.run_id, params=params[i : i + 100])


@dataclass
class Tags(Record):
    kind = "tags"
    tags: dict

    def deliver(self, run: MlflowRun, client: Any) -> None:
        from mlflow.entities import RunTag

        client.log_batch(run.run_id, tags=[RunTag(k, v) for k, v in self.tags.items()])


@dataclass
class Metrics(Record):
    kind = "metrics"
    metrics: dict
    step: int
    timestamp: int

    def deliver(self, run: MlflowRun, client: Any) -> None:
        from mlflow.entities import Metric

        metrics = [
            Metric(k, v, self.timestamp, self.step)
            for k, v in self.metrics.items()
            if self.step > run.logged_steps.get(k, -1) or k.startswith(SYSTEM_PREFIX)  # samples, never repeated
        ]
        if metrics:
            client.log_batch(run.run_id, metrics=metrics)


@dataclass
class Inputs(Record):
    kind = "inputs"
    inputs: list

    def deliver(self, run: MlflowRun, client: Any) -> None:
        client.log_inputs(run.run_id, datasets=[dataset_input(d) for d in self.inputs])


@dataclass
class Artifact(Record):
    kind = "artifact"
    path: str
    artifact_path: str | None

    def deliver(self, run: MlflowRun, client: Any) -> None:
        if os.path.exists(self.path):  # else deleted since (`checkpoint.keep`): nothing to show
            client.log_artifact(run.run_id, self.path, self.artifact_path)


@dataclass
class Model(Record):
    """A model built at delivery (never on the caller's thread), logged and maybe registered."""

    kind = "model"
    build: Callable[[], Any]
    name: str
    step: int
    register: str | None
    alias: str | None

    def deliver(self, run: MlflowRun, client: Any) -> None:
        model = self.build()  # None: its weight file is gone
        if model is not None:
            log_keras_model(
                run.tracking_uri,
                run.run_id,
                model,
                name=self.name,
                step=self.step,
                registered_model_name=self.register,
                alias=self.alias,
            )


@dataclass
class DropCheckpoint(Record):
    """The weight file `file` was deleted (or is rewritten): so is its logged model."""

    kind = "drop_checkpoint"
    file: str

    def deliver(self, run: MlflowRun, client: Any) -> None:
        for earlier in checkpoint_models(client, run.experiment_id, run.run_id, self.file):
            client.delete_logged_model(earlier.model_id)


@dataclass
class Checkpoint(DropCheckpoint):
    """The weight file `file` as a logged model, replacing one of the same file."""

    kind = "checkpoint"
    build: Callable[[], Any] | None = None  # returns None when the file is gone by then (`keep` dropped it)
    step: int = 0

    def deliver(self, run: MlflowRun, client: Any) -> None:
        super().deliver(run, client)
        model = self.build() if self.build else None
        if model is not None:
            name = self.file.removesuffix(".weights.h5").replace("/", "-")
            tags = {CHECKPOINT_TAG: self.file}
            log_keras_model(run.tracking_uri, run.run_id, model, name=name, step=self.step, tags=tags)


@dataclass
class Register(Record):
    """The logged model of `file` registered as `name`, that version pointed at by `alias`."""

    kind = "register"
    file: str
    name: str
    alias: str | None

    def deliver(self, run: MlflowRun, client: Any) -> None:
        import mlflow

        found = checkpoint_models(client, run.experiment_id, run.run_id, self.file)
        if not found:
            run.notify(f"MLflow: no logged model of {self.file} to register as {self.name}")
            return
        mlflow.set_tracking_uri(run.tracking_uri)
        version = mlflow.register_model(f"models:/{found[0].model_id}", self.name).version
        if self.alias:
            client.set_registered_model_alias(self.name, self.alias, str(version))


@dataclass
class End(Record):
    kind = "end"
    status: str

    def deliver(self, run: MlflowRun, client: Any) -> None:
        client.set_terminated(run.run_id, status=self.status)

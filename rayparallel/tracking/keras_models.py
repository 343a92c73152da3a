"""Keras models in MLflow: a model logged through the Keras flavor (MLflow 3's logged models, the run's Models
tab), registered and aliased where asked, and the logged models of a run's checkpoint files."""

from __future__ import annotations

from typing import Any

from .sqlite_store import mlflow_client
from .store import SOURCE_TAGS

# The tag that names a checkpoint's weight file on its logged model
CHECKPOINT_TAG = "rayparallel.checkpoint"


def log_keras_model(
    tracking_uri: str,
    run_id: str,
    model: Any,
    *,
    name: str = "model",
    step: int = 0,
    tags: dict | None = None,
    registered_model_name: str | None = None,
    alias: str | None = None,
) -> str:
    """`model` as a logged model of the run (MLflow 3: the run's Models tab) through the Keras flavor;
    returns its id. MLflow links the run's figures at `step` to it. Registered under the name if given,
    that version pointed at by `alias`. No fluent run is started: that would end the run when it closes."""
    import keras
    import mlflow
    import mlflow.keras
    import tensorflow as tf
    from mlflow.models import Model

    mlflow.set_tracking_uri(tracking_uri)
    requirements = [f"tensorflow=={tf.__version__}", f"keras=={keras.__version__}"]  # no slow inference
    client = mlflow_client(tracking_uri)
    run = client.get_run(run_id)
    # created here, in the run's experiment and with its source (Model.log alone creates it in the active
    # experiment of this process, which is not the run's without a fluent run, and names this process)
    source = {key: value for key, value in run.data.tags.items() if key in SOURCE_TAGS}
    created = client.create_logged_model(
        run.info.experiment_id, name=name, source_run_id=run_id, tags={**source, **(tags or {})}, params=run.data.params
    )
    info = Model.log(
        artifact_path=None,
        name=name,
        flavor=mlflow.keras,
        run_id=run_id,
        model_id=created.model_id,
        model=model,
        registered_model_name=registered_model_name,
        pip_requirements=requirements,
        signature=keras_signature(model),
        step=step,
    )
    if registered_model_name and alias:
        version = info.registered_model_version
        client.set_registered_model_alias(registered_model_name, alias, str(version))
    return info.model_id


def checkpoint_models(client: Any, experiment_id: str, run_id: str, file: str) -> list[Any]:
    """The run's logged models of one weight file (tagged with its name when logged)."""
    found = client.search_logged_models(
        [experiment_id], filter_string=f"source_run_id = '{run_id}' AND tags.`{CHECKPOINT_TAG}` = '{file}'"
    )
    return list(found)


def keras_signature(model: Any) -> Any:
    """The model's inputs and outputs as MLflow's signature, any batch (-1): what `mlflow models serve` and
    the UI say the model takes. None where MLflow's tensor specs cannot say it (string inputs)."""
    import numpy as np
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec

    def schema(tensors: list, names: list[str]) -> Schema:
        shapes = [(-1, *(-1 if d is None else d for d in t.shape[1:])) for t in tensors]
        named = names if len(tensors) > 1 else [None]
        return Schema([TensorSpec(np.dtype(t.dtype), s, n) for t, s, n in zip(tensors, shapes, named, strict=True)])

    try:
        inputs = schema(model.inputs, [t.name for t in model.inputs])
        return ModelSignature(inputs, schema(model.outputs, list(getattr(model, "output_names", []) or [])))
    except (TypeError, ValueError):  # a dtype NumPy or MLflow's TensorSpec has no word for
        return None

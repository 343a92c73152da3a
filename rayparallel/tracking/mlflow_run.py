"""One MLflow run per training run, delivered from a single background thread.

The run's recorder actor owns the only :class:`MlflowRun` of a training run; workers never
talk to MLflow. Every call only queues an operation; the thread delivers them in order.
When the server cannot be reached, training goes on: operations stay queued and are
retried with backoff, one warning is raised (not a stream of tracebacks), and at the end
whatever could not be delivered is written to a JSON file next to the run's other output.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import first_line
from ..hooks import set_env_defaults
from ..secrets import mask, mask_text, without_credentials
from .sqlite_store import mlflow_client


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


# The tag that names a checkpoint's weight file on its logged model
CHECKPOINT_TAG = "rayparallel.checkpoint"
# What MLflow's UI shows as who ran it and from where, on the run and on each of its models
SOURCE_TAGS = ("mlflow.source.name", "mlflow.source.type", "mlflow.user")
# MLflow's prefix of system metrics (`system/<node>/<name>` for each node of a multi-node run)
SYSTEM_PREFIX = "system/"


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


def enter_working_directory(path: str) -> None:
    """Be in `path` again if this process's working directory was replaced (MLflow's `log_model`
    reads `Path.cwd()`). A job's runtime_env working_dir is unpacked anew when another node on
    the same host joins (as in a one-machine cluster), which deletes the folder a running actor
    is in; the new one is at the same path."""
    try:
        os.getcwd()
    except FileNotFoundError:
        os.chdir(path if os.path.isdir(path) else Path(path).anchor)


# The longest the delivery thread waits for `release` (the run's first step) before it starts.
HOLD_S = 20.0


@dataclass(frozen=True)
class TrackingSettings:
    """Where and as what a run is recorded in MLflow: what the driver hands the recorder."""

    tracking_uri: str | None  # None: MLflow's default store, resolved where the run is logged (`MlflowRun`)
    experiment: str
    run_name: str
    unlogged_path: Path  # what could not be delivered, at the end
    tags: dict = field(default_factory=dict)  # the job's, the run's source and user (`mlflow.source.name`, ...)
    resume_run_id: str | None = None  # the MLflow run a resumed (or restarted) run goes on with
    inputs: list[dict] = field(default_factory=list)  # the datasets trained on, as mlflow.log_input records them
    used: dict = field(default_factory=dict)  # train: keys the job left out, as the run used them (params)
    started_at: float | None = None  # unix time the command started: the run's start in MLflow's Overview


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


class MlflowRun:
    def __init__(
        self,
        settings: TrackingSettings,
        notify: Callable[[str], None],
        on_started: Callable[[], None] = lambda: None,
    ):
        set_env_defaults("mlflow")  # the recorder's process: MLflow's own retries would hold up the queue
        if settings.tracking_uri is None:  # the driver had none: a cluster's MLFLOW_TRACKING_URI here must not choose
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        self._tracking_uri, self.experiment, self.run_name = (
            settings.tracking_uri,
            settings.experiment,
            settings.run_name,
        )
        self._started_at = settings.started_at
        self.run_id: str | None = settings.resume_run_id
        self.unlogged_path = settings.unlogged_path
        self.experiment_id: str | None = None
        self._notify = notify
        self._on_started = on_started  # the run's id exists from now on: the recorder's journal keeps it
        self._queue: deque = deque()
        self._cond = threading.Condition()
        self._started = threading.Event()
        self._released = threading.Event()  # see `release`
        self._closing = False
        self._failing_since: float | None = None
        self.last_error: str | None = None  # why the newest failed delivery failed (kept with what is left)
        self._working_directory = os.getcwd()
        self._logged_steps: dict[str, int] = {}
        self._thread = threading.Thread(target=self._deliver, name="rayparallel-mlflow", daemon=True)
        self._queue.append(("start", {}))
        if settings.tags:
            self.set_tags(settings.tags)
        if settings.inputs:  # the datasets trained on, as mlflow.log_input records them (MLflow keeps one per digest)
            self._queue.append(("inputs", {"inputs": settings.inputs}))
        self._thread.start()

    @property
    def tracking_uri(self) -> str:
        if self._tracking_uri is None:  # MLflow's default store, in this process's folder (the driver's)
            self._tracking_uri = chosen_tracking_uri(None)  # imports MLflow: not before it is needed
        return self._tracking_uri

    # -- queueing (never blocks on the network) -------------------------------------------
    def log_params(self, params: dict) -> None:
        self._put("params", {"params": params})

    def set_tags(self, tags: dict) -> None:
        self._put("tags", {"tags": {k: str(v) for k, v in tags.items()}})

    def log_metrics(self, metrics: dict, step: int, at: float | None = None) -> None:
        """`at`: the unix time the figures were taken (default now)."""
        values = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        self._put("metrics", {"metrics": values, "step": step, "timestamp": int((at or time.time()) * 1000)})

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        self._put("artifact", {"path": path, "artifact_path": artifact_path})

    def log_model(
        self,
        build: Callable[[], Any],
        *,
        name: str = "model",
        step: int = 0,
        registered_model_name: str | None = None,
        alias: str | None = None,
    ) -> None:
        """A model built at delivery (never on the caller's thread), logged and maybe registered."""
        self._put(
            "model", {"build": build, "name": name, "step": step, "register": registered_model_name, "alias": alias}
        )

    def log_checkpoint(self, file: str, build: Callable[[], Any] | None, step: int) -> None:
        """The weight file `file` as a logged model (replacing one of the same file); `build` returns
        None when the file is gone by then (`keep` dropped it)."""
        self._put("checkpoint", {"file": file, "build": build, "step": step})

    def drop_checkpoint(self, file: str) -> None:
        """The weight file `file` was deleted: so is its logged model (the Models tab matches the folder)."""
        self._put("checkpoint", {"file": file, "build": None, "step": 0})

    def register_checkpoint(self, file: str, name: str, alias: str | None) -> None:
        """The logged model of `file` registered as `name`, that version pointed at by `alias`."""
        self._put("register", {"file": file, "name": name, "alias": alias})

    def release(self) -> None:
        """Deliver from now on. Until then (at most `HOLD_S`) the thread waits, so that MLflow's
        import and the run's creation (seconds of CPU) do not compete with the workers' start-up."""
        self._released.set()

    def wait_started(self, timeout: float) -> bool:
        return self._started.wait(timeout)

    def url(self) -> str | None:
        if self.run_id and self.experiment_id:
            return run_url(self.tracking_uri, self.experiment_id, self.run_id)
        return None

    def finish(self, status: str, timeout: float) -> list[str]:
        """End the run as `status`; returns what could not be delivered within `timeout`."""
        self._put("end", {"status": status})
        self.release()
        deadline = time.monotonic() + timeout
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            while self._queue and time.monotonic() < deadline:
                self._cond.wait(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            left = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        return self._save_unlogged(left) if left else []

    # -- delivery thread ---------------------------------------------------------------
    def _put(self, kind: str, payload: dict) -> None:
        with self._cond:
            self._queue.append((kind, payload))
            self._cond.notify_all()

    def _deliver(self) -> None:
        self._released.wait(HOLD_S)
        backoff = 1.0
        while True:
            with self._cond:
                while not self._queue:
                    if self._closing:
                        return
                    self._cond.wait()
                kind, payload = self._queue[0]
            try:
                self._apply(kind, payload)
            except Exception as exc:  # the server is down or refused: keep it queued, retry later
                line = first_line(exc, 200)
                self.last_error = mask_text(f"{kind}: {type(exc).__name__}: {line}")
                if self._failing_since is None:
                    self._failing_since = time.monotonic()
                    self._notify(
                        mask_text(
                            f"MLflow: cannot log to {self.tracking_uri} ({type(exc).__name__}: {line}); "
                            "training goes on, metrics are kept and retried"
                        )
                    )
                with self._cond:
                    self._cond.wait(timeout=backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            if self._failing_since is not None:
                self._notify(f"MLflow: reachable again at {mask_text(self.tracking_uri)}; buffered records delivered")
                self._failing_since = None
            backoff = 1.0
            with self._cond:
                if self._queue and self._queue[0][0] == kind and self._queue[0][1] is payload:
                    self._queue.popleft()
                self._cond.notify_all()

    def _apply(self, kind: str, payload: dict) -> None:
        from mlflow.entities import Metric, Param, RunTag

        enter_working_directory(self._working_directory)
        client = mlflow_client(self.tracking_uri)
        if kind == "start":
            resumed = self.run_id is not None
            self.experiment_id, self.run_id = open_run(
                client, self.tracking_uri, self.experiment, self.run_name, self.run_id, self._started_at
            )
            if resumed:  # the same run goes on; epochs it has already are not logged twice
                self._logged_steps = {
                    key: max(m.step for m in client.get_metric_history(self.run_id, key))
                    for key in client.get_run(self.run_id).data.metrics
                }
            self._started.set()
            self._on_started()
        elif kind == "params":
            params = [Param(k, v) for k, v in payload["params"].items()]
            existing = client.get_run(self.run_id).data.params
            params = [p for p in params if p.key not in existing]  # a resumed run keeps its params
            for i in range(0, len(params), 100):
                client.log_batch(self.run_id, params=params[i : i + 100])
        elif kind == "tags":
            client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in payload["tags"].items()])
        elif kind == "metrics":
            step = payload["step"]
            metrics = [
                Metric(k, v, payload["timestamp"], step)
                for k, v in payload["metrics"].items()
                if step > self._logged_steps.get(k, -1) or k.startswith(SYSTEM_PREFIX)  # samples, never repeated
            ]
            if metrics:
                client.log_batch(self.run_id, metrics=metrics)
        elif kind == "inputs":
            client.log_inputs(self.run_id, datasets=[_dataset_input(d) for d in payload["inputs"]])
        elif kind == "artifact":
            if os.path.exists(payload["path"]):  # else deleted since (`checkpoint.keep`): nothing to show
                client.log_artifact(self.run_id, payload["path"], payload["artifact_path"])
        elif kind == "model":
            model = payload["build"]()  # None: its weight file is gone
            if model is None:
                return
            log_keras_model(
                self.tracking_uri,
                self.run_id,
                model,
                name=payload["name"],
                step=payload["step"],
                registered_model_name=payload["register"],
                alias=payload["alias"],
            )
        elif kind == "checkpoint":
            self._log_checkpoint(client, payload)
        elif kind == "register":
            self._register_checkpoint(client, payload)
        elif kind == "end":
            client.set_terminated(self.run_id, status=payload["status"])

    def _log_checkpoint(self, client: Any, payload: dict) -> None:
        file = payload["file"]
        for earlier in checkpoint_models(client, self.experiment_id, self.run_id, file):  # rewritten or dropped
            client.delete_logged_model(earlier.model_id)
        model = payload["build"]() if payload["build"] else None
        if model is not None:
            name = file.removesuffix(".weights.h5").replace("/", "-")
            tags = {CHECKPOINT_TAG: file}
            log_keras_model(self.tracking_uri, self.run_id, model, name=name, step=payload["step"], tags=tags)

    def _register_checkpoint(self, client: Any, payload: dict) -> None:
        import mlflow

        found = checkpoint_models(client, self.experiment_id, self.run_id, payload["file"])
        if not found:
            self._notify(f"MLflow: no logged model of {payload['file']} to register as {payload['name']}")
            return
        model = found[0]
        mlflow.set_tracking_uri(self.tracking_uri)
        version = mlflow.register_model(f"models:/{model.model_id}", payload["name"]).version
        if payload["alias"]:
            client.set_registered_model_alias(payload["name"], payload["alias"], str(version))

    def _save_unlogged(self, left: list) -> list[str]:
        records = [{"kind": kind, **{k: v for k, v in payload.items() if k != "build"}} for kind, payload in left]
        unlogged = {
            "tracking_uri": self.tracking_uri,
            "run_id": self.run_id,
            "last_error": self.last_error,
            "records": records,
        }
        self.unlogged_path.parent.mkdir(parents=True, exist_ok=True)
        self.unlogged_path.write_text(json.dumps(mask(unlogged), indent=2, default=str))
        return sorted({kind for kind, _ in left})


def _dataset_input(description: dict) -> Any:
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

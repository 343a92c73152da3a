"""Run a validated job on Ray Train: workers, the run's recorder, progress, result.

`DataParallelTrainer.fit()` (Ray Train, with our TensorFlow backend) blocks, so it runs in a thread while this thread prints the
progress events the recorder collects from rank 0. The recorder actor is named
`rayparallel:<ray run name>`, so a live run can be inspected with `ray.get_actor`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import ray
import yaml
from ray.exceptions import RayActorError
from ray.train import ControllerError, ScalingConfig
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..checkpoint.manifest import set_aside
from ..console import Say, continue_with, interrupted, printer
from ..data.batch_server import start_batch_server
from ..data.datasets import rank_shards
from ..data.feed import DataSource
from ..data.keras_inputs import KerasInput
from ..errors import RunFailedError, StepTimeoutError, death_reason, user_error
from ..files import WriteError, atomic_write_text
from ..hooks import env_defaults
from ..recorder.actor import RECORDER_RESTARTS, RecorderActor, recorder_name
from ..recorder.events import ControllerStarted, EpochEnded, Event, PhaseReached, Resized, RunWarning, TrackingStarted
from ..recorder.journal import JOURNAL
from ..result import RunSummary, TrainResult
from ..secrets import mask
from ..spec import JobSpec
from ..spec.references import deferred
from ..startup import relative
from ..tracking.mlflow_run import TrackingSettings
from ..tracking.store import source_tags, tracking_uri_as_set
from ..worker.loop import train_loop_per_worker
from . import connect as cluster
from .abort import ControllerAnnounced, abort_training
from .backend import TensorflowBackendConfig, make_run_config, make_scaling_config, trainer_class
from .progress import ConsoleProgress, describe_resize, print_summary, tracking_line
from .run_state import RunPlan, folder_held
from .stall import StallWatch

if TYPE_CHECKING:
    from ray.actor import ActorHandle

    from .shared_workers import SharedRun, SharedWorkers


@dataclass(frozen=True)
class Launch:
    """How one run is launched, built once by `run_job`: the plan and everything `train` was told."""

    output_dir: Path
    search_path: list[str]  # where the user's modules import from (the driver's folder), in every process
    plan: RunPlan  # the job, and the run it starts or resumes
    baselines: dict = field(default_factory=dict)  # the loader's figures, printed beside the model's
    verbose: bool = True
    worker_logs: bool = False
    started_at: float = field(default_factory=time.time)  # the command's start: the clock of `startup`
    source_name: str = ""  # what MLflow shows as the run's Source: the job file, or the script that called train
    marks: dict[str, float] = field(default_factory=dict)  # the driver's start-up phases, unix time
    # Called with each epoch's global logs as they arrive; a returned reason ends the run as
    # finished after the epoch in progress (a sweep's trial that its Tune scheduler stops).
    on_epoch: Callable[[int, dict], str | None] | None = None
    source: DataSource | None = None  # what the workers read (preflight's); None: the loader, called by them
    datasets: dict = field(default_factory=dict)  # Ray Data: the lazy datasets, by split, for Ray Train
    inputs: list[dict] = field(default_factory=list)  # the datasets as MLflow records them
    settings: dict = field(default_factory=dict)  # train: keys left out, as used, for MLflow's params
    workers: SharedWorkers | None = None  # a worker group kept up for several runs; None: the run's own

    @property
    def spec(self) -> JobSpec:
        return self.plan.spec

    @property
    def storage_path(self) -> str:
        return self.plan.state.storage_path

    def mark(self, phase: str) -> None:
        self.marks.setdefault(phase, time.time())


def shared_with_workers(source: DataSource) -> DataSource:
    """The loader's arrays put once into the object store, where every worker of a node reads them
    without a copy; the driver keeps only the reference (a restarted worker group reads the same object).
    A loader's PyDatasets go to a batch server instead, which loads each batch once for all workers."""
    if source.served is not None and source.batch_server is None:
        splits = {"train": source.served.train, "val": source.served.val}
        server = start_batch_server({name: split.dataset for name, split in splits.items() if split is not None})
        bare = {name: replace(split, dataset=None) if split else None for name, split in splits.items()}
        return replace(source, served=KerasInput(**bare), batch_server=server)
    if source.arrays is None or isinstance(source.arrays, ray.ObjectRef):
        return source
    return replace(source, arrays=ray.put(source.arrays))


def launch(run: Launch) -> TrainResult:
    """Run the planned job on the connected Ray; the output folder is held for the whole run."""
    with folder_held(run.output_dir, run.spec.name):  # first: a second run into a live run's folder changes nothing
        with cluster.worker_output_shown(run.worker_logs):
            return _fit(run)


def _fit(run: Launch) -> TrainResult:
    say = printer(run.verbose)
    scaling_config = make_scaling_config(run.spec)  # first: a Ray without elastic training is an error before any write
    job_file = _prepare_folder(run, say)
    actor = _start_recorder(run)
    try:
        trainer = _trainer(run, actor, scaling_config)
        # read by Ray Train's controller, which starts inside fit() with this process's environment
        with env_defaults("train_driver", *(["elastic_driver"] if run.spec.scaling.elastic else [])):
            progress = ConsoleProgress(run.spec.train.epochs) if run.verbose else None
            watch = StallWatch(run.spec.run.stall_warning_s, partial(cluster.resources_line, run.spec))
            error = _run_with_progress(trainer, actor, partial(_show, run, actor, say, progress), watch)
        result = _conclude(run, actor, error, job_file)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM from `ray job stop` (see cli)
        _end(run, actor, "KILLED", [job_file])
        _record(run, "KILLED")
        say(interrupted("train", run.output_dir, "MLflow run marked KILLED"))
        raise
    except RayActorError as exc:  # the recorder died: every later call on it raises this
        _record(run, "FAILED")
        raise RunFailedError(
            f"the run's recorder died ({death_reason(exc)}); the epochs it saved are kept; "
            + continue_with("train", run.output_dir)
        ) from exc
    finally:  # the recorder is a named actor: a failed or interrupted run must not leave it behind either
        ray.kill(actor)
    if run.verbose:
        print_summary(result)
    return result


def _prepare_folder(run: Launch, say: Say) -> Path:
    """The folder as the run starts: an earlier run's checkpoints set aside, job.yaml and run.json written."""
    state, point = run.plan.state, run.plan.point
    for skipped in point.skipped if point else []:
        say(f"rayparallel: skipped a damaged resume checkpoint, {skipped}")
    if point:
        say(f"rayparallel: resuming {state.ray_run_name} after {point.position} ({point.folder})")
    else:
        say(f"rayparallel: starting {state.ray_run_name} (fresh) in {run.output_dir}")
        moved = set_aside(checkpoint_dir(run.spec, run.output_dir))
        if moved:
            say(f"rayparallel: moved {moved[1]} files of an earlier run aside, to {moved[0]}")
    run.output_dir.mkdir(parents=True, exist_ok=True)
    job_file = run.output_dir / "job.yaml"
    atomic_write_text(job_file, yaml.safe_dump(mask(run.spec.recorded()), sort_keys=False), "--output-dir")
    state.save(run.output_dir)
    return job_file


def _start_recorder(run: Launch) -> ActorHandle:
    """The run's recorder, on this node (it writes the output folder), up before any worker starts."""
    spec, state = run.spec, run.plan.state
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    actor = RecorderActor.options(
        name=recorder_name(state.ray_run_name),
        scheduling_strategy=here,
        max_restarts=RECORDER_RESTARTS,  # a lost process comes back, and the calls it was in are made again
        max_task_retries=-1,
    ).remote(
        replace(spec, model=replace(spec.model, builder=deferred(spec.model.builder))),  # no TF import to be up
        str(checkpoint_dir(spec, run.output_dir)),
        run.search_path,
        str(run.output_dir / JOURNAL),
        _tracking_config(run),
        str(Path(run.storage_path).resolve() / state.ray_run_name) if spec.run.local_storage else None,
    )
    # not waited for: it starts beside the worker group (the workers' first calls on it wait for it), and
    # marks recorder_ready itself; its MLflow run is created meanwhile, announced by an event
    return actor


def _trainer(run: Launch, actor: ActorHandle, scaling_config: ScalingConfig) -> DataParallelTrainer | SharedRun:
    spec = run.spec
    config = {
        "spec": spec,
        "actor": actor,
        "search_path": run.search_path,
        "output_dir": str(run.output_dir),
        "source": run.source or DataSource(rank_aware=True),
    }
    if run.workers is not None:
        return run.workers.run(config)
    data_options = {}
    if run.datasets:
        stored = run.source.datasets.stored  # each split's order of rows, found by the driver
        data_options = dict(
            datasets=run.datasets, dataset_config=rank_shards(spec.data.layout, spec.train.global_batch_size, stored)
        )
    return trainer_class()(
        train_loop_per_worker,
        backend_config=TensorflowBackendConfig(),
        train_loop_config=config,
        **data_options,
        scaling_config=scaling_config,
        run_config=make_run_config(spec, run.plan.state.ray_run_name, run.storage_path, [ControllerAnnounced(actor)]),
    )


def _show(run: Launch, actor: ActorHandle, say: Say, progress: ConsoleProgress | None, event: Event) -> None:
    """One of the recorder's events on the console (and, for an epoch, to `on_epoch`)."""
    state = run.plan.state
    if isinstance(event, TrackingStarted):  # the run exists: say where, and record it for --resume
        say(tracking_line("started", event.info))
        state.mlflow_run_id = event.info["run_id"]
        state.save(run.output_dir)
    elif isinstance(event, Resized):
        say(f"rayparallel: {describe_resize(event.resize)}")
    elif isinstance(event, PhaseReached):
        return
    elif progress:
        progress.show(event)
    if isinstance(event, EpochEnded) and run.on_epoch:
        reason = run.on_epoch(event.epoch, event.logs)
        if reason:
            actor.request_stop.remote(reason)


def _end(run: Launch, actor: ActorHandle, status: str, files: list[Path]) -> dict | None:
    """The recorder's last writes and its MLflow run ended; returns what the MLflow run became, whose id
    `_record` then keeps for --resume: a short run can end before its `TrackingStarted` event was shown."""
    ray.get(actor.writes_done.remote())  # saves rank 0 handed over before a failure are good epochs: keep them
    tracking = ray.get(actor.finish.remote(status, [str(f) for f in files]))
    if tracking and tracking.get("run_id"):
        run.plan.state.mlflow_run_id = tracking["run_id"]
    return tracking


def _record(run: Launch, status: str) -> None:
    """Last: a run interrupted before its MLflow run and result.json were complete is not finished yet."""
    run.plan.state.status = status
    run.plan.state.save(run.output_dir)


def _conclude(run: Launch, actor: ActorHandle, error: BaseException | None, job_file: Path) -> TrainResult:
    """The run's result, written; or, when the trainer failed, the error a user can act on."""
    if error is not None:
        _end(run, actor, "FAILED", [job_file])
        _record(run, "FAILED")
        reason = user_error(error, run.storage_path)
        if isinstance(reason, WriteError):  # a disk that failed mid-run is not bad input; the run resumes
            raise RunFailedError(f"{reason}; {continue_with('train', run.output_dir)}") from error
        if reason:
            raise reason
        reason = ray.get(actor.failure.remote())  # a worker that ended itself left its reason here
        if reason:
            raise StepTimeoutError(reason) from error
        if isinstance(error, ControllerError):
            raise RunFailedError(
                f"Ray Train's controller failed ({death_reason(error.controller_failure)}); "
                + continue_with("train", run.output_dir)
            ) from error
        raise error
    summary: RunSummary = ray.get(actor.summary.remote())
    startup = relative({**summary.startup_marks, **run.marks}, run.started_at)
    result = TrainResult(
        name=run.spec.name,
        history=summary.history,
        final_weights=summary.final_weights,
        workers=[asdict(worker) for worker in summary.workers],
        output_dir=str(run.output_dir),
        seconds=time.time() - run.started_at,
        checkpoint_dir=summary.checkpoint_dir,
        checkpoints=summary.checkpoints,
        baselines=run.baselines,
        mlflow=ray.get(actor.tracking_info.remote(0)) or {},
        first_step_at=summary.first_step_at,
        time_to_first_step_s=startup.get("first_step_done"),
        startup=startup,
        resizes=summary.resizes,
        stopped=summary.stopped,
    )
    result_file = result.write()
    result.mlflow = _end(run, actor, "FINISHED", [job_file, result_file]) or {}
    result.write()
    _record(run, "FINISHED")
    return result


def _run_with_progress(
    trainer: DataParallelTrainer | SharedRun, actor: ActorHandle, show: Callable[[Event], None], watch: StallWatch
) -> BaseException | None:
    """`trainer.fit()` in a thread; this thread shows the actor's events until it ends, and says
    when they stop coming (`StallWatch`)."""
    outcome: dict = {}

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=fit, name="rayparallel-fit", daemon=True)
    thread.start()
    controller = None
    try:
        while True:
            thread.join(timeout=0.5)
            for event in ray.get(actor.drain.remote()):
                if isinstance(event, ControllerStarted):
                    controller = event.handle
                else:
                    watch.saw(event)
                    show(event)
            stalled = watch.warning()
            if stalled:
                show(RunWarning(stalled))
            if not thread.is_alive():
                return outcome.get("error")
    except KeyboardInterrupt:  # a shared group's workers would go on with this run: its controller ends them
        abort_training(controller or getattr(trainer, "controller", lambda: None)(), thread)
        raise


def _tracking_config(run: Launch) -> TrackingSettings | None:
    spec, state = run.spec, run.plan.state
    if not spec.mlflow.enabled:
        return None
    return TrackingSettings(
        tracking_uri=tracking_uri_as_set(spec.mlflow.tracking_uri),
        experiment=spec.mlflow.experiment or spec.name,
        run_name=spec.mlflow.run_name or state.ray_run_name,
        tags={**source_tags(run.source_name), **mask(spec.mlflow.tags), "rayparallel.ray_run_name": state.ray_run_name},
        unlogged_path=run.output_dir / "mlflow_unlogged.json",
        resume_run_id=state.mlflow_run_id,
        inputs=run.inputs,
        used=run.settings,
        started_at=run.started_at,
    )


def checkpoint_dir(spec: JobSpec, output_dir: Path) -> Path:
    return Path(spec.checkpoint.dir).resolve() if spec.checkpoint.dir else output_dir / "checkpoints"

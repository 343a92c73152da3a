"""Run a validated job on Ray Train: workers, the run's recorder, progress, result.

`DataParallelTrainer.fit()` (Ray Train, with our TensorFlow backend) blocks, so it runs in a thread while this thread prints the
progress events the recorder collects from rank 0. The recorder actor is named
`rayparallel:<ray run name>`, so a live run can be inspected with `ray.get_actor`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import ray
import yaml
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..checkpoint.manifest import set_aside
from ..errors import RayParallelError, StepTimeoutError
from ..files import atomic_write_text
from ..recorder.actor import RecorderActor, recorder_name
from ..result import TrainResult, describe_stop
from ..secrets import mask, mask_text
from ..spec import JobSpec
from ..startup import describe, relative
from ..worker.datasets import rank_shards
from ..worker.feed import DataSource
from ..worker.loop import train_loop_per_worker
from . import connect as cluster
from .backend import TensorflowBackendConfig
from .progress import ConsoleProgress, describe_resize, format_logs
from .run_state import RunState, folder_held, plan_run

if TYPE_CHECKING:
    from ray.actor import ActorHandle


# Ray Train's controller polls the workers this often (default 2 s), and a worker's
# `ray.train.report` waits for the poll that takes its previous report: with the default,
# every epoch of a short-epoch job lasted at least 2 s (the default job: 30 s of waiting
# for 5 s of training). A user's own setting wins.
HEALTH_CHECK_INTERVAL = ("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")
# After a lost node Ray's resource view still counts it for a while and the controller waits for
# a worker group that cannot be placed (60 s by default) before it tries fewer workers.
ELASTIC_START_TIMEOUT = ("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "20")


@dataclass
class Launch:
    """How one run is launched: everything `train` was told besides the job spec."""

    output_dir: Path
    search_path: list[str]  # where the user's modules import from (the driver's folder), in every process
    baselines: dict = field(default_factory=dict)  # the loader's figures, printed beside the model's
    verbose: bool = True
    worker_logs: bool = False
    resume: bool | None = None  # True: continue the recorded run; False: fresh; None: resume if unfinished
    started_at: float = field(default_factory=time.time)  # the command's start: the clock of `startup`
    marks: dict[str, float] = field(default_factory=dict)  # the driver's start-up phases, unix time
    # Called with each epoch's global logs as they arrive; a returned reason ends the run as
    # finished after the epoch in progress (a sweep's trial that its Tune scheduler stops).
    on_epoch: Callable[[int, dict], str | None] | None = None
    source: DataSource | None = None  # what the workers read (preflight's); None: the loader, called by them
    datasets: dict = field(default_factory=dict)  # Ray Data: the lazy datasets, by split, for Ray Train
    inputs: list[dict] = field(default_factory=list)  # the datasets as MLflow records them

    def mark(self, phase: str) -> None:
        self.marks.setdefault(phase, time.time())


def launch(spec: JobSpec, run: Launch) -> TrainResult:
    with folder_held(run.output_dir, spec.name):  # first: a second run into a live run's folder changes nothing
        started_ray = cluster.connect(run.worker_logs)
        run.mark("ray_ready")
        try:
            if started_ray or not os.environ.get("RAY_ADDRESS"):
                cluster.check_capacity(spec)
            with cluster.worker_output_shown(run.worker_logs):
                return _fit(spec, run)
        finally:
            if started_ray:
                ray.shutdown()


def _fit(spec: JobSpec, run: Launch) -> TrainResult:
    output_dir = run.output_dir
    say = partial(print, flush=True) if run.verbose else (lambda *_: None)  # at once, also into a `ray job` log
    scaling_config = _scaling_config(spec)  # first: a Ray without elastic training is an error before any write
    storage_path = spec.run.storage_path or str(output_dir / "ray_results")
    state, point = plan_run(spec.name, output_dir, storage_path, run.resume)
    for skipped in point.skipped if point else []:
        say(f"rayparallel: skipped a damaged resume checkpoint, {skipped}")
    if point:
        say(f"rayparallel: resuming {state.ray_run_name} after {point.position} ({point.folder})")
    else:
        say(f"rayparallel: starting {state.ray_run_name} (fresh) in {output_dir}")
        moved = set_aside(checkpoint_dir(spec, output_dir))
        if moved:
            say(f"rayparallel: moved {moved[1]} files of an earlier run aside, to {moved[0]}")
    output_dir.mkdir(parents=True, exist_ok=True)
    job_file = output_dir / "job.yaml"
    atomic_write_text(job_file, yaml.safe_dump(mask(spec.to_dict()), sort_keys=False), "--output-dir")
    state.save(output_dir)

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    actor = RecorderActor.options(name=recorder_name(state.ray_run_name), scheduling_strategy=here).remote(
        spec,
        str(checkpoint_dir(spec, output_dir)),
        run.search_path,
        _tracking_config(spec, output_dir, state, run.inputs),
        str(Path(storage_path).resolve() / state.ray_run_name) if spec.run.local_storage else None,
    )
    ray.get(actor.ping.remote())  # up; its MLflow run is created meanwhile, announced by an event
    run.mark("recorder_ready")
    progress = ConsoleProgress(spec.train.epochs) if run.verbose else None

    def show(event: dict) -> None:
        if event["kind"] == "mlflow":  # the run exists: say where, and record it for --resume
            say(_tracking_line("started", event["info"]))
            state.mlflow_run_id = event["info"]["run_id"]
            state.save(output_dir)
        elif event["kind"] == "resize":
            say(f"rayparallel: {describe_resize(event['resize'])}")
        elif progress:
            progress.show(event)
        if event["kind"] == "epoch" and run.on_epoch:
            reason = run.on_epoch(event["epoch"], event["logs"])
            if reason:
                actor.request_stop.remote(reason)

    source = run.source or DataSource(rank_aware=True)
    if source.arrays is not None and not isinstance(source.arrays, ray.ObjectRef):
        # once per run into the object store, where every worker of a node reads it without a copy;
        # the driver keeps only the reference (a restarted worker group reads the same object)
        source = replace(source, arrays=ray.put(source.arrays))
        run.source = source
    data_options = {}
    if run.datasets:
        data_options = dict(
            datasets=run.datasets, dataset_config=rank_shards(spec.data.layout, spec.train.global_batch_size)
        )
    os.environ.setdefault(*HEALTH_CHECK_INTERVAL)  # read from here by the controller (Ray propagates it)
    if spec.scaling.elastic:
        os.environ.setdefault(*ELASTIC_START_TIMEOUT)
    trainer = DataParallelTrainer(
        train_loop_per_worker,
        backend_config=TensorflowBackendConfig(),
        train_loop_config={
            "spec": spec,
            "actor": actor,
            "search_path": run.search_path,
            "output_dir": str(output_dir),
            "source": source,
        },
        **data_options,
        scaling_config=scaling_config,
        run_config=RunConfig(
            name=state.ray_run_name,
            storage_path=storage_path,
            checkpoint_config=CheckpointConfig(num_to_keep=spec.run.checkpoints_to_keep),
            failure_config=FailureConfig(max_failures=spec.failure.max_failures),
        ),
    )

    def end(status: str, files: list[Path]) -> dict | None:
        ray.get(actor.writes_done.remote())  # saves rank 0 handed over before a failure are good epochs: keep them
        return ray.get(actor.finish.remote(status, [str(f) for f in files]))

    def record(status: str) -> None:
        """Last: a run interrupted before its MLflow run and result.json were complete is not finished yet."""
        state.status = status
        state.save(output_dir)

    try:
        error = _run_with_progress(trainer, actor, show)
        if error is not None:
            end("FAILED", [job_file])
            record("FAILED")
            user_error = _user_error(error, storage_path)
            if user_error:
                raise user_error
            reason = ray.get(actor.failure.remote())  # a worker that ended itself left its reason here
            if reason:
                raise StepTimeoutError(reason) from error
            raise error

        summary = ray.get(actor.summary.remote())
        startup = relative({**summary.pop("startup_marks"), **run.marks}, run.started_at)
        result = TrainResult(
            name=spec.name,
            output_dir=str(output_dir),
            seconds=time.time() - run.started_at,
            baselines=run.baselines,
            mlflow=ray.get(actor.tracking_info.remote(0)) or {},
            startup=startup,
            time_to_first_step_s=startup.get("first_step_done"),
            **summary,
        )
        result_file = result.write()
        result.mlflow = end("FINISHED", [job_file, result_file]) or {}
        result.write()
        record("FINISHED")
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM from `ray job stop` (see cli)
        end("KILLED", [job_file])
        record("KILLED")
        say(
            f"\nrayparallel: interrupted; MLflow run marked KILLED; continue with: rayparallel train ... --resume "
            f"--output-dir {output_dir}"
        )
        raise
    finally:  # the recorder is a named actor: a failed or interrupted run must not leave it behind either
        ray.kill(actor)
    if run.verbose:
        _print_summary(result)
    return result


def _run_with_progress(
    trainer: DataParallelTrainer, actor: ActorHandle, show: Callable[[dict], None]
) -> BaseException | None:
    """`trainer.fit()` in a thread; this thread shows the actor's events until it ends."""
    outcome: dict = {}

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=fit, name="rayparallel-fit", daemon=True)
    thread.start()
    while True:
        thread.join(timeout=0.5)
        for event in ray.get(actor.drain.remote()):
            show(event)
        if not thread.is_alive():
            return outcome.get("error")


def _scaling_config(spec: JobSpec) -> ScalingConfig:
    scaling = spec.scaling
    elastic = {}
    if scaling.elastic:
        if "elastic_resize_monitor_interval_s" not in ScalingConfig.__dataclass_fields__:
            raise RayParallelError(
                f"scaling.num_workers: expected a Ray with elastic training (2.50 or newer) for "
                f"{{min: {scaling.min_workers}, max: {scaling.max_workers}}}, received Ray {ray.__version__}"
            )
        elastic = {
            "num_workers": (scaling.min_workers, scaling.max_workers),
            "elastic_resize_monitor_interval_s": scaling.elastic_resize_monitor_interval_s,
        }
    return ScalingConfig(
        **(elastic or {"num_workers": scaling.num_workers}),
        use_gpu=scaling.use_gpu,
        resources_per_worker=scaling.resources_per_worker or None,
        placement_strategy=scaling.placement_strategy,
    )


def _tracking_config(spec: JobSpec, output_dir: Path, state: RunState, inputs: list[dict]) -> dict | None:
    if not spec.mlflow.enabled:
        return None
    import mlflow

    return {
        "tracking_uri": spec.mlflow.tracking_uri or mlflow.get_tracking_uri(),
        "experiment": spec.mlflow.experiment or spec.name,
        "run_name": spec.mlflow.run_name or state.ray_run_name,
        "tags": dict(mask(spec.mlflow.tags), **{"rayparallel.ray_run_name": state.ray_run_name}),
        "unlogged_path": output_dir / "mlflow_unlogged.json",
        "resume_run_id": state.mlflow_run_id,
        "inputs": inputs,
    }


def _tracking_line(when: str, info: dict) -> str:
    where = info.get("url") or f"{info['tracking_uri']} (browse: mlflow ui --backend-store-uri {info['tracking_uri']})"
    if not info.get("run_id"):
        return f"MLflow: run not created yet at {info['tracking_uri']}; retrying in the background"
    return f"MLflow run {info['run_id']} ({info['experiment']}) {when}: {where}"


def checkpoint_dir(spec: JobSpec, output_dir: Path) -> Path:
    return Path(spec.checkpoint.dir).resolve() if spec.checkpoint.dir else output_dir / "checkpoints"


def _user_error(error: BaseException, storage_path: str) -> RayParallelError | None:
    """The user's bad input raised inside a worker, unwrapped from Ray's failure wrappers."""
    if "Unable to set up cluster storage" in str(error):  # Ray Train's check from every node
        return RayParallelError(
            f"run.storage_path: expected shared storage that every node can read and write for a multi-node "
            f"run (an NFS mount, s3://..., gs://...), received {mask_text(storage_path)!r}"
        )
    failures = getattr(error, "worker_failures", None) or {}
    for failure in [error, *failures.values()]:
        seen = set()
        while failure is not None and id(failure) not in seen:
            seen.add(id(failure))
            if isinstance(failure, RayParallelError):
                return failure
            failure = getattr(failure, "cause", None) or failure.__cause__
    return None


def _print_summary(result: TrainResult) -> None:
    final = result.final
    print(
        f"\nrayparallel: {result.name} finished in {result.seconds:.1f}s on {len(result.workers)} workers"
        + (f" (first step after {result.time_to_first_step_s:.1f}s)" if result.time_to_first_step_s else "")
    )
    print(f"  start-up (s since the command started): {describe(result.startup)}")
    print(f"  final: {format_logs(final)}")
    if result.stopped:
        print(f"  stopped early, {describe_stop(result.stopped)}")
    for name, figures in result.baselines.items():
        print(f"  baseline {name}: {format_logs(figures)}")
    print(
        "  placement: "
        + "; ".join(f"rank {w['rank']} on node {w['node_id'][:8]} gpus {w['gpu_ids'] or '-'}" for w in result.workers)
    )
    print(f"  weights: {result.final_weights}")
    if result.checkpoints:
        print(f"  checkpoints: {len(result.checkpoints)} in {result.checkpoint_dir}")
    print(f"  result:  {Path(result.output_dir) / 'result.json'}")
    if result.mlflow:
        print(_tracking_line("finished", result.mlflow))
        if result.mlflow.get("unlogged"):
            print(
                f"MLflow: could not log {', '.join(result.mlflow['unlogged'])} to {result.mlflow['tracking_uri']} "
                f"({result.mlflow.get('unlogged_error') or 'not reached in time'}); "
                f"the records are in {result.mlflow['unlogged_path']} and every file is on disk in {result.output_dir}"
            )

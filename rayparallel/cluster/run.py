"""One run's life, the one code path of `rayparallel.train`, the CLI and every sweep trial.

Order matters: the resume plan first (which job runs is decided before anything starts), the
job's own checks (after Ray for a Ray Data job, which they read through; see
`needs_ray_for_checks`), Ray and the cluster's capacity (all refuse a bad job before any file
is written), the folders' writability, and only then the launch, which takes the output
folder's lock and writes.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..console import printer
from ..files import ensure_writable, refuse_unwritable, space_warning
from ..spec import SpecSource, load_spec
from ..spec.references import add_search_path
from .stall import warned_while

if TYPE_CHECKING:
    from ..result import TrainResult
    from ..spec import JobSpec
    from .launch import Launch
    from .preflight import Preflight
    from .run_state import RunPlan
    from .shared_workers import SharedWorkers


@contextlib.contextmanager
def ray_session(
    job: JobSpec, worker_logs: bool, *, only_for_checks: bool = False, predict: bool = False
) -> Iterator[bool]:
    """Ray for the job: the cluster in `RAY_ADDRESS` (or the one this process joined), else a
    local Ray started here and shut down when the block ends, however it ends.

    Yields whether the cluster is all there is (not one that may autoscale behind `RAY_ADDRESS`),
    so a job that cannot fit fails now instead of waiting forever. `only_for_checks`: connect
    only when the checks need Ray (a Ray Data job reads a sample through it). `predict`: for a
    prediction (Ray Data beside its workers, no Ray Train).
    """
    if only_for_checks and not needs_ray_for_checks(job):
        yield False
        return
    import ray

    from . import connect

    ray_data = predict or job.data.dataset is not None
    started = connect.connect(worker_logs, data_cpus=connect.DATA_CPUS if ray_data else 0)
    if not predict:
        connect.start_coordinator()
    if ray_data:
        connect.quiet_ray_data(worker_logs)
    try:
        yield started or not os.environ.get("RAY_ADDRESS")
    finally:
        if started:
            ray.shutdown()


def needs_ray_for_checks(job: JobSpec) -> bool:
    """A Ray Data job is checked through Ray (a sample read, the row count); any other job is checked
    before Ray starts. That order matters inside `ray job submit`: once the job's driver connects,
    Ray may drop the unpacked working directory it imports from, so what the checks import (our
    modules, the user's builder and loader) must be imported first."""
    return job.data.dataset is not None


def checked_job(job: JobSpec, native_logs: bool = False, working_dir: str | None = None) -> Preflight:
    """The workers' own checks, run here first: imports (from the working directory), data, the replica."""
    from .preflight import preflight

    add_search_path([working_dir or os.getcwd()])
    return preflight(job, native_logs=native_logs)


def start_checks(job: JobSpec, worker_logs: bool, working_dir: str, marks: dict[str, float]) -> Callable[[], Preflight]:
    """The job's checks (seconds: they import TensorFlow), started as early as they may be; the
    function returned gives their result (or raises their error) inside the Ray session.

    A Ray Data job is checked through Ray, once it is there. Any other job is checked before
    Ray (see `needs_ray_for_checks`), beside the start of a local Ray when this process starts
    one: no working directory can vanish then, and both take seconds.
    """
    import ray

    def check() -> Preflight:
        checks = checked_job(job, native_logs=worker_logs, working_dir=working_dir)
        marks["spec_checked"] = time.time()
        return checks

    if needs_ray_for_checks(job):
        return check
    if ray.is_initialized() or os.environ.get("RAY_ADDRESS"):
        checks = check()
        return lambda: checks
    beside_ray = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rayparallel-checks").submit(check)
    return beside_ray.result


def space_warning_for(job: JobSpec, output_dir: Path, checks: Preflight) -> str | None:
    """Whether the checkpoint folder's disk has room for the weight files the run will keep."""
    from .launch import checkpoint_dir

    folder = checkpoint_dir(job, output_dir)
    return space_warning(folder, checks.checkpoint_files, checks.checkpoint_file_bytes, "checkpoint.dir")


def check_folders(job: JobSpec, output_dir: Path, checks: Preflight, verbose: bool) -> None:
    """Both folders writable (or one line, before anything is written); a warning when the weight
    files will not fit, and what else the checks have to say (rows an epoch leaves out)."""
    from .launch import checkpoint_dir

    ensure_writable(output_dir, "--output-dir")
    ensure_writable(checkpoint_dir(job, output_dir), "checkpoint.dir")
    warning = space_warning_for(job, output_dir, checks)
    for line in ([warning] if warning else []) + checks.notes:
        printer(verbose)(line)


def run_job(
    spec: SpecSource,
    *,
    overrides: Sequence[str] = (),
    output_dir: str | os.PathLike | None = None,
    verbose: bool = True,
    worker_logs: bool = False,
    resume: bool | None = None,
    started_at: float | None = None,
    on_epoch: Callable[[int, dict], str | None] | None = None,
    workers: SharedWorkers | None = None,
    warm: bool = False,
) -> TrainResult:
    """Train the job (`spec` with `overrides`) into `output_dir` (default `runs/<name>`): see
    `rayparallel.train` and the module doc. `started_at` is the start-up clock's origin (the
    CLI's: when its process started); `on_epoch` sees every epoch's logs here and may end the run;
    `workers` runs it on a worker group kept for several runs (`shared_workers`), `warm` on this process's."""
    from .connect import check_capacity_where_known
    from .launch import Launch, shared_with_workers
    from .run_state import plan_run

    started_at = started_at or time.time()
    working_dir = os.getcwd()  # before Ray: in `ray job submit` the cwd may be gone once the driver connects
    source_name = source_of(spec)  # a path resolved against it: before Ray too
    marks: dict[str, float] = {}  # the driver's start-up phases (rayparallel.startup)
    job = load_spec(spec, overrides)
    output_dir = Path(output_dir if output_dir is not None else Path("runs") / job.name).resolve()
    plan = plan_run(job, overrides, output_dir, resume)
    check_plan(plan, output_dir, verbose)
    checks = start_checks(plan.spec, worker_logs, working_dir, marks)  # beside Ray's start, when it starts here
    workers = workers_for_run(plan, workers, warm, worker_logs, verbose, marks, started_at)
    with ray_session(plan.spec, worker_logs) as whole_cluster:
        marks["ray_ready"] = time.time()
        check_capacity_where_known(plan.spec, whole_cluster, printer(verbose))
        with warned_while(checks_waiting(plan.spec), plan.spec.run.stall_warning_s, printer(verbose)):
            checks = checks()
        check_folders(plan.spec, output_dir, checks, verbose)
        run = Launch(
            output_dir=output_dir,
            source_name=source_name,
            search_path=[working_dir],
            plan=plan,
            baselines=checks.baselines,
            verbose=verbose,
            worker_logs=worker_logs,
            started_at=started_at,
            marks=marks,
            on_epoch=on_epoch,
            source=shared_with_workers(checks.source),
            datasets=checks.datasets,
            inputs=checks.inputs,
            settings=checks.settings,
            workers=workers,
        )
        del checks  # the driver keeps no copy of a loader's arrays: they are in the object store
        return launched(run, warm)


def launched(run: Launch, warm: bool) -> TrainResult:
    """The run's result; on the session's warm group (`warm`), then one line of what the session keeps."""
    from .launch import launch
    from .warm_workers import after_run

    try:
        return launch(run)
    finally:
        if warm:
            after_run(run.workers, printer(run.verbose))


def check_plan(plan: RunPlan, output_dir: Path, verbose: bool) -> None:
    """What the plan alone decides, before Ray starts: a folder that cannot take the run is refused
    (`check_folders` probes both once the checks pass), a resume that goes on with the recorded job says so."""
    from .launch import checkpoint_dir

    refuse_unwritable(output_dir, "--output-dir")
    refuse_unwritable(checkpoint_dir(plan.spec, output_dir), "checkpoint.dir")
    if plan.changed:
        printer(verbose)(
            f"rayparallel: resuming the job recorded in {output_dir / 'job.yaml'}, not the given one, which differs "
            f"in {', '.join(plan.changed)}"
        )


def workers_for_run(
    plan: RunPlan,
    workers: SharedWorkers | None,
    warm: bool,
    worker_logs: bool,
    verbose: bool,
    marks: dict,
    since: float,
) -> SharedWorkers | None:
    """The shared group the run goes to: the one given (checked to fit), else with `warm` the group this
    process keeps (`warm_workers`, marked `workers_reused` when it started before the call, `since`);
    None: a group of its own."""
    from .warm_workers import workers_for

    if workers is not None:
        workers.check(plan.spec, plan.point)
        return workers
    workers = workers_for(plan.spec, plan.point, worker_logs, printer(verbose)) if warm else None
    if workers is not None and workers.started_at < since:
        marks["workers_reused"] = time.time()
    return workers


def checks_waiting(job: JobSpec) -> str:
    """What the driver's checks wait for when they take long: the user's data function, or Ray Data."""
    if job.data.dataset is not None:
        return (
            "the driver's checks are calling data.dataset and reading its first batch "
            "(Ray Data may be waiting for CPUs beside the workers, or the function blocks)"
        )
    return "the driver's checks are calling data.loader and building the replica (the loader may block)"


def source_of(spec: SpecSource) -> str:
    """The run's source as MLflow shows it: the job file, else the script (or notebook kernel) that ran."""
    import sys

    if isinstance(spec, (str, os.PathLike)):
        return str(Path(spec).resolve())
    return str(Path(sys.argv[0]).resolve()) if sys.argv and sys.argv[0] else "python"

"""Where the job runs: an existing Ray cluster if there is one, else an embedded local Ray."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import ray

from ..errors import RayParallelError
from ..hooks import hook
from ..spec import JobSpec

WORKER_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
_PRINT_HANDLER = "ray_print_logs"  # the name ray.init(log_to_driver=True) gives its printer


DATA_CPUS = 1  # Ray Data jobs: logical CPUs left beside the workers for its read and map tasks


def connect(worker_logs: bool = False, data_cpus: int = 0) -> bool:
    """Join the cluster in `RAY_ADDRESS` (set inside `ray job submit`) or start a local Ray.

    Worker and actor output reaches this console only with `worker_logs` (TensorFlow and Ray
    Train are chatty); their errors always arrive as exceptions. Returns True when this call
    started a local Ray that the caller must shut down.
    """
    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS")
    env = {"env_vars": dict(WORKER_ENV)}
    quiet = {} if worker_logs else {"logging_level": logging.ERROR}  # Ray's own start-up lines
    if address:
        try:
            ray.init(address=address, runtime_env=env, log_to_driver=worker_logs, **quiet)
        except ConnectionError as exc:
            raise RayParallelError(
                f"RAY_ADDRESS: expected a running Ray cluster, received {address!r} ({exc})"
            ) from None
        return False
    if data_cpus:  # the workers take a CPU each: Ray Data's tasks would wait for one forever
        quiet["num_cpus"] = (os.cpu_count() or 1) + data_cpus
    # never a stale `ray start`; no dashboard: its ten processes take 1.7 s of the start and CPU from the
    # workers for a UI that ends with the run (for Ray's dashboard, `ray start --head` and runs join it)
    ray.init(address="local", include_dashboard=False, runtime_env=env, log_to_driver=worker_logs, **quiet)
    return True


def start_coordinator() -> None:
    """Ray Train's autoscaling coordinator, started now rather than by the run's controller.

    It is one detached actor per cluster, which the controller creates on first use and then
    waits for before it starts the worker group: a new process's start on the way to the first
    step of every run on a new local Ray. Asked for here (not awaited), it starts beside the
    driver's checks and the recorder; on a cluster that has one already this finds it.
    """
    hook("autoscaling_coordinator")()


def quiet_ray_data(show: bool) -> None:
    """Ray Data's per-execution lines (plans, progress bars) in the driver only with `worker_logs`."""
    from ray.data import DataContext

    if not show:
        logging.getLogger("ray.data").setLevel(logging.WARNING)
        DataContext.get_current().enable_progress_bars = False


@contextlib.contextmanager
def worker_output_shown(show: bool) -> Iterator[None]:
    """Hold back the workers' and Ray Train's output in a driver that streams it (a notebook's ray.init()).

    A driver started with `log_to_driver=True` prints every worker's TensorFlow lines and Ray
    Train's internal actors' messages; during a run without `worker_logs` they are held back
    (errors still arrive as exceptions) and the driver's own setting is restored afterwards.
    """
    dispatcher = getattr(hook("ray_logging"), "global_worker_stdstream_dispatcher", None)
    handlers = [] if show or dispatcher is None else [h for h in dispatcher.handlers if h[0] == _PRINT_HANDLER]
    for name, _ in handlers:
        dispatcher.remove_handler(name)
    try:
        yield
    finally:
        for name, handler in handlers:
            dispatcher.add_handler(name, handler)


def worker_need(spec: JobSpec) -> dict[str, float]:
    """What one worker of the job asks Ray for (Ray Train's default: 1 CPU, and 1 GPU with use_gpu)."""
    need = dict(spec.scaling.resources_per_worker)
    need.setdefault("CPU", 1)
    if spec.scaling.use_gpu:
        need.setdefault("GPU", 1)
    return need


def check_capacity(spec: JobSpec) -> None:
    """Fail fast when the (non-autoscaling) cluster cannot hold the workers: Ray would wait forever."""
    available = ray.cluster_resources()
    need = worker_need(spec)
    for resource, amount in need.items():
        total = amount * spec.scaling.min_workers  # an elastic run starts with what there is, at least min
        if total > available.get(resource, 0) + 1e-9:
            raise RayParallelError(
                f"scaling: expected the cluster to have {total:g} {resource} for {spec.scaling.min_workers} workers "
                f"x {amount:g}, received a cluster with {available.get(resource, 0):g} {resource}"
            )
    if spec.data.dataset is not None:
        workers_cpu = need["CPU"] * spec.scaling.max_workers
        if available.get("CPU", 0) < workers_cpu + DATA_CPUS - 1e-9:
            raise RayParallelError(
                f"scaling: expected at least {DATA_CPUS} CPU beyond the workers' {workers_cpu:g} for Ray Data's "
                f"tasks (data.dataset), received a cluster with {available.get('CPU', 0):g} CPU; use fewer workers "
                "or scaling.resources_per_worker.CPU below 1"
            )


def runs_that_fit(spec: JobSpec) -> int:
    """How many runs of the job (at their least workers) the cluster holds at once: a sweep's trials."""
    available = ray.cluster_resources()
    counts = [
        int((available.get(resource, 0) + 1e-9) // (amount * spec.scaling.min_workers))
        for resource, amount in worker_need(spec).items()
        if amount > 0
    ]
    return min(counts, default=1)

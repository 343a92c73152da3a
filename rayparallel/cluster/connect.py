"""Where the job runs: an existing Ray cluster if there is one, else an embedded local Ray."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator

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
    return need_of(spec.scaling.resources_per_worker, spec.scaling.use_gpu)


def need_of(resources_per_worker: dict | None, use_gpu: bool) -> dict[str, float]:
    """`resources_per_worker` with Ray Train's defaults filled in: 1 CPU, and 1 GPU with `use_gpu`."""
    need = dict(resources_per_worker or {})
    need.setdefault("CPU", 1)
    if use_gpu:
        need.setdefault("GPU", 1)
    return need


def task_options(spec: JobSpec) -> dict:
    """`worker_need` in the words of a Ray task's or actor's options (`num_cpus`, `num_gpus`, `resources`)."""
    need = worker_need(spec)
    return dict(num_cpus=need.pop("CPU"), num_gpus=need.pop("GPU", 0), resources=need or None)


def cluster_can_grow() -> bool:
    """Whether an autoscaler may add nodes to the joined cluster.

    Ray's monitor keeps its view in the GCS (what `ray status` prints); on a cluster it cannot
    grow (nodes started by hand with `ray start`) its node types are the read-only provider's,
    one per node, named `node_<node id>`. Autoscaler v2 (KubeRay's in-tree autoscaling), named
    node types (the cluster launcher's) and a view not reported yet all count as able to grow:
    the capacity rule must never refuse a run that would start.
    """
    import json

    try:
        if hook("is_autoscaler_v2")(fetch_from_server=True):
            return True
        raw = hook("internal_kv_get")(hook("autoscaling_status_key"))
        mapping = json.loads(raw)["autoscaler_report"]["node_type_mapping"] if raw else None
    except Exception:  # a status Ray wrote in another shape: no grounds to refuse
        return True
    return not mapping or any(kind != f"node_{node}" for node, kind in mapping.items())


def resources_line(spec: JobSpec) -> str:
    """What the workers ask Ray for and what the cluster has free, for a run waiting to start."""
    need, free = worker_need(spec), ray.available_resources()
    asked = ", ".join(f"{amount:g} {name}" for name, amount in need.items())
    have = ", ".join(f"{free.get(name, 0):g} {name}" for name in need)
    return f"{spec.scaling.min_workers} workers x {asked}; free now: {have}"


def check_capacity(spec: JobSpec, say_when_it_can_grow: Callable[[str], None] | None = None) -> None:
    """Fail fast when a cluster that cannot grow cannot hold the workers (or leaves Ray Data no CPU):
    Ray would wait forever. Given `say_when_it_can_grow`, a cluster that may autoscale is only told of."""
    available = ray.cluster_resources()
    need = worker_need(spec)
    for resource, amount in need.items():
        total = amount * spec.scaling.min_workers  # an elastic run starts with what there is, at least min
        if total > available.get(resource, 0) + 1e-9:
            if say_when_it_can_grow:
                return say_when_it_can_grow(
                    f"rayparallel: waiting for the cluster to scale up: the workers need {total:g} {resource}, "
                    f"it has {available.get(resource, 0):g}"
                )
            raise RayParallelError(
                f"scaling: expected the cluster to have {total:g} {resource} for {spec.scaling.min_workers} workers "
                f"x {amount:g}, received a cluster with {available.get(resource, 0):g} {resource}"
            )
    workers_cpu = need["CPU"] * spec.scaling.max_workers
    if spec.data.dataset is not None and available.get("CPU", 0) < workers_cpu + DATA_CPUS - 1e-9:
        if say_when_it_can_grow:
            return say_when_it_can_grow(
                f"rayparallel: waiting for the cluster to scale up: Ray Data needs {DATA_CPUS} CPU beside the "
                f"workers' {workers_cpu:g}"
            )
        raise RayParallelError(
            f"scaling: expected at least {DATA_CPUS} CPU beyond the workers' {workers_cpu:g} for Ray Data's "
            f"read tasks (data.dataset), received a cluster with {available.get('CPU', 0):g} CPU that cannot "
            f"grow; use fewer workers or a lower scaling.resources_per_worker.CPU (now {need['CPU']:g})"
        )
    return None


def check_capacity_where_known(spec: JobSpec, whole_cluster: bool, say: Callable[[str], None]) -> None:
    """`check_capacity` on a cluster that cannot grow (this process's own Ray, or a joined one without an
    autoscaler: `cluster_can_grow`); where it can grow, a run it cannot hold yet starts and says so once."""
    check_capacity(spec, None if whole_cluster or not cluster_can_grow() else say)


def runs_that_fit(spec: JobSpec) -> int:
    """How many runs of the job (at their least workers) the cluster holds at once: a sweep's trials."""
    available = ray.cluster_resources()
    counts = [
        int((available.get(resource, 0) + 1e-9) // (amount * spec.scaling.min_workers))
        for resource, amount in worker_need(spec).items()
        if amount > 0
    ]
    return min(counts, default=1)

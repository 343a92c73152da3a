"""One serving application, the one code path of `rayparallel.serve` and `rayparallel serve`.

Order matters as in training and predict: every check that can refuse (the arguments, the weights
against the job's model, a model S slots can hold) comes before Ray Serve starts anything, so a bad
argument is one line and nothing is left running.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..cluster.stall import warned_while
from ..console import plural, printer
from ..errors import RayParallelError
from ..spec import SpecSource, load_spec
from .app import ServeSettings, build

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

    from ..checkpoint.export import Rebuilt


# where the fronts run, in Ray Serve's words (`proxy_location`): one on every node (a load balancer in front of
# them), or one on the head only
PROXY_LOCATIONS = ("EveryNode", "HeadOnly")
READY_S = 600.0  # how long the command waits for every replica to answer through the front


@dataclass
class Served:
    """A running application: where it answers, and a handle for callers inside Ray."""

    url: str  # the model's KServe address: POST {url}/infer
    name: str
    weights: str  # the weights file, or the registered model's URI
    why: str
    version: str  # the registered model's version, else "1"
    slots: int
    replicas: int
    # the stream replicas' deployment handle, for callers inside Ray:
    # `handle.options(session_id=str(sequence_id)).infer.remote(sequence_id, start, end, window, token)` ->
    # (status, outputs or one line, replica id); the same `token` on a retry of a window applies it once, and
    # `sent_at=time.time()` of its first try keeps its wait for a dead replica's successor from counting as idle
    handle: DeploymentHandle


def serve(
    spec: SpecSource,
    *,
    weights: str | os.PathLike | None = None,
    model: str | None = None,
    name: str | None = None,
    replicas: int = 1,
    slots: int | None = None,
    idle_timeout_s: float = 60.0,
    slot_wait_s: float = 5.0,
    use_gpu: bool | None = None,
    keep_states: bool = True,
    host: str = "127.0.0.1",
    port: int = 8000,
    proxy_location: str = "EveryNode",
    overrides: Iterable[str] = (),
    unlisted: bool = False,
    verbose: bool = True,
    worker_logs: bool = False,
) -> Served:
    """The job's stateful model served to live streams on Ray Serve, KServe v2 with Triton's sequence extension.

    The weights are a weights file or checkpoint folder (`weights`), or a registered version (`model`,
    `models:/NAME@ALIAS`: the metadata's `versions` name it). Each of `replicas` holds `slots` streams
    (default the job's global batch: the model is built for it); a stream takes a slot at
    `sequence_start`, frees it at `sequence_end` or after `idle_timeout_s`, and its answers are what the
    batch-1 loop over its windows gives. With `keep_states` each step's states are kept outside the
    replicas before they answer, so a replica's death loses no stream (its windows go on on another
    replica, a window in flight applied once). `proxy_location`, in Ray Serve's words, says where the
    fronts (HAProxy, forwarding each window to its stream's replica) run: `EveryNode` or `HeadOnly`. The
    application stays up while Ray does (`ray.serve.delete(name)` ends it; the command line ends it at Ctrl-C).

    Examples:
        >>> served = rayparallel.serve("jobs/stateful_lstm.yaml", weights="runs/stateful-lstm-co2/checkpoints")  # doctest: +SKIP
        >>> served.url  # doctest: +SKIP
        'http://127.0.0.1:8000/v2/models/stateful-lstm-co2'
    """
    job = load_spec(spec, list(overrides))
    settings = _settings(job, name, replicas, slots, idle_timeout_s, slot_wait_s, use_gpu, keep_states)
    _check_address(host, port, proxy_location)
    rebuilt, source, version = _weights(job, weights, model, unlisted, settings.slots)
    settings = replace(settings, version=version)
    _check_model(rebuilt.model)
    settings = replace(settings, host=host, port=port, head_only=proxy_location == "HeadOnly")
    handle = _run(job, rebuilt, settings, worker_logs, verbose)
    url = f"http://{host}:{port}/v2/models/{settings.name}"
    served = Served(url, settings.name, source, rebuilt.why, version, settings.slots, settings.num_replicas, handle)
    printer(verbose)(_up_line(served, settings, "model" if model else "weights"))
    return served


def _run(job: Any, rebuilt: Rebuilt, settings: ServeSettings, worker_logs: bool, verbose: bool) -> DeploymentHandle:
    """The application started on Ray Serve (on the Ray this process joins or starts), once every replica
    answers through the fronts; the stream replicas' handle."""
    from ray import serve as ray_serve

    from ..cluster import connect

    working_dir = os.getcwd()  # before Ray, as predict takes it
    connect.connect(worker_logs)  # a local Ray started here lives as long as this process
    settings = replace(settings, fronts=1 if settings.head_only else _nodes())
    if not worker_logs:  # Ray Serve's own start-up lines: the one line the caller prints says what runs where
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
    ray_serve.start(proxy_location="Disabled")  # no window passes through Ray Serve's proxy: the fronts take them
    app = build(rebuilt.recipe, rebuilt.model.get_weights(), [working_dir], rebuilt.model, settings)
    waiting = "Ray Serve is starting the replicas (each imports TensorFlow and builds the model) or waits for CPUs"
    with warned_while(waiting, job.run.stall_warning_s, printer(verbose)):  # as predict says what its workers wait for
        front = ray_serve.run(app, name=settings.name, route_prefix=None, blocking=False)
        deadline = time.monotonic() + READY_S
        while front.ready.remote().result() < settings.num_replicas:
            if time.monotonic() > deadline:
                raise RayParallelError(
                    f"--replicas: expected {settings.num_replicas} replicas answering within {READY_S:g} s, received "
                    f"fewer (Ray Serve's logs say why: `ray logs`, or the dashboard's Serve page)"
                )
            time.sleep(0.5)
    return ray_serve.get_deployment_handle(f"{settings.name}-streams", settings.name)


def _nodes() -> int:
    """The cluster's alive nodes: a front on each (`proxy_location="EveryNode"`)."""
    import ray

    return max(1, sum(1 for node in ray.nodes() if node["Alive"]))


def _up_line(served: Served, settings: ServeSettings, given: str) -> str:
    kept = "kept" if settings.keep_states else "not kept"
    return (
        f"rayparallel serve: {served.url} ({served.slots} slots x {plural(served.replicas, 'replica')}, idle timeout "
        f"{settings.idle_timeout_s:g} s, states {kept}); {given} {served.weights} ({served.why})"
    )


def stay_up(name: str) -> None:
    """Until Ctrl-C (or SIGTERM): then the application is deleted, and the caller exits 130."""
    from ray import serve as ray_serve

    try:
        while True:
            time.sleep(1.0)
    finally:
        ray_serve.delete(name)


def _settings(
    job: Any,
    name: str | None,
    replicas: int,
    slots: int | None,
    idle: float,
    wait: float,
    use_gpu: bool | None,
    keep_states: bool,
) -> ServeSettings:
    for key, value, low in (("--replicas", replicas, 1), ("--slots", slots, 1)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < low):
            raise RayParallelError(f"{key}: expected a positive integer, received {value!r}")
    for key, value in (("--idle-timeout-s", idle), ("--slot-wait-s", wait)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise RayParallelError(f"{key}: expected a number of seconds (0 or more), received {value!r}")
    use_gpu = job.scaling.use_gpu if use_gpu is None else use_gpu
    cpus = job.scaling.resources_per_worker.get("CPU", 1)
    model_name = name or job.name
    if not model_name or "/" in model_name:
        raise RayParallelError(f"--name: expected a name without '/' for the URL, received {model_name!r}")
    slots = slots or job.train.global_batch_size
    if not isinstance(keep_states, bool):
        raise RayParallelError(f"keep_states: expected True or False, received {keep_states!r}")
    return ServeSettings(model_name, "1", replicas, slots, float(idle), float(wait), bool(use_gpu), cpus, keep_states)


def _weights(job: Any, weights: Any, model: str | None, unlisted: bool, slots: int) -> tuple[Rebuilt, str, str]:
    """The job's model for `slots` rows with its weights, what they came from (the file or the model's URI), and
    the version the metadata names (a registered one's, else "1")."""
    from ..inference.run import rebuilt_for, registered_for

    if (weights is None) == (model is None):
        given = "both" if model else "neither"
        raise RayParallelError(f"--weights, --model: expected one of them, received {given}")
    if model is None:
        rebuilt = rebuilt_for(job, weights, unlisted, batch_size=slots)
        return rebuilt, str(rebuilt.weights), "1"
    rebuilt, version = registered_for(job, model, slots)
    return rebuilt, model, version


def _check_address(host: str, port: int, proxy_location: str) -> None:
    if proxy_location not in PROXY_LOCATIONS:
        raise RayParallelError(
            f"--proxy-location: expected one of {', '.join(PROXY_LOCATIONS)}, received {proxy_location!r}"
        )
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise RayParallelError(f"--port: expected a port number (1-65535), received {port!r}")
    if not isinstance(host, str) or not host:
        raise RayParallelError(f"--host: expected an address to listen on, received {host!r}")


def _check_model(model: Any) -> None:
    from .slot_model import SlotModel

    try:
        SlotModel(model)
    except ValueError as exc:
        raise RayParallelError(str(exc)) from None

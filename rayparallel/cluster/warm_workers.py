"""The worker group a Python session keeps warm: the next `rayparallel.fit` or `train` starts in seconds.

A notebook user calls `fit` again and again. A run's own worker group costs each call new
processes that import TensorFlow again (most of a short run's start on a small machine). So
the session keeps the group of its last run (`SharedWorkers`) up, and the next call whose
`scaling` asks for the same workers runs on it; a call that asks for others replaces it (one
line says so). A job that a shared group cannot run (`SharedWorkers.refusal`: Ray Data, elastic
scaling, resume points, restarts) runs on a group of its own, as from the command line, after
the warm group has given back its resources.

The group holds its workers' CPUs (or GPUs) while it waits, and Ray must outlive each run for
it: the session starts the local Ray itself (when no cluster is joined) and keeps it.
`rayparallel.shutdown()`, or the end of the process, releases both. Between calls the group
never makes anything else wait: a watch closes it, in one line, as soon as anything else in
the session's Ray waits for what it holds (a Ray task, Ray Data, a trainer of the user's own:
Ray's pending demands), or once it has been idle `RAYPARALLEL_WARM_IDLE_TIMEOUT_S` (600 s). `rayparallel.Workers` starts
the group before the first call (its workers import TensorFlow while the user's cells run).
`RAYPARALLEL_WARM_WORKERS=0` turns the keeping off: a call then starts and ends its own group, as
the command line does, unless a `Workers` group fits it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import threading
import time
from typing import TYPE_CHECKING

from ..console import Say, plural
from ..errors import RayParallelError
from .shared_workers import SharedWorkers

if TYPE_CHECKING:
    from ..spec import JobSpec
    from .run_state import ResumePoint

_lock = threading.Lock()
_session: dict = {"workers": None, "ray_started": False, "storage": None, "exit_hook": False, "idle_since": None}
IDLE_TIMEOUT_S = 600.0  # RAYPARALLEL_WARM_IDLE_TIMEOUT_S's default
WATCH_EVERY_S = 1.0  # Ray's raylets report what waits about once a second


def enabled() -> bool:
    return os.environ.get("RAYPARALLEL_WARM_WORKERS", "1") != "0"


def workers_for(job: JobSpec, point: ResumePoint | None, worker_logs: bool, say: Say) -> SharedWorkers | None:
    """The session's group for the job (kept, or started now in place of another); None when the job runs
    on a group of its own (it cannot run on a shared one, or warm workers are off and none was started)."""
    with _lock:
        kept: SharedWorkers | None = _session["workers"]
        if kept is not None and kept.alive and point is None and kept.refusal(job) is None:
            say(f"rayparallel: on the warm workers ({kept.described})")
            _session["idle_since"] = None  # the run's own: the watch leaves it alone until `after_run`
            return kept
        wanted = SharedWorkers.for_job(job, storage_path="")  # its storage is made when it starts
        reason = "a resumed run" if point is not None else wanted.refusal(job)
        reason = reason or (None if enabled() else "RAYPARALLEL_WARM_WORKERS=0")
        if reason:
            if kept is not None and kept.alive:
                say(f"rayparallel: closing the warm workers ({kept.described}): this run needs its own ({reason})")
            _close_kept()
            return None
        _join_ray(worker_logs)
        return _keep(wanted, say, idle=False)


def after_run(workers: SharedWorkers | None, say: Say) -> None:
    """The end of a run on the session's group: it waits for the next call from now on, and one line
    says what it keeps and how to free it."""
    with _lock:
        if workers is None or _session["workers"] is not workers or not workers.alive:
            return
        _session["idle_since"] = time.time()
    held = ", ".join(
        plural(round(amount), key) if float(amount).is_integer() else f"{amount} {key}"
        for key, amount in workers.holds.items()
    )
    say(
        f"rayparallel: keeping {workers.described} ({held}) warm for the next fit or train; rayparallel.shutdown() "
        f"frees them (so do anything else of this session's Ray waiting for them, and {idle_timeout_s():.0f} s idle)"
    )


def idle_timeout_s() -> float:
    """RAYPARALLEL_WARM_IDLE_TIMEOUT_S: seconds an idle warm group waits for the next call before it closes."""
    given = os.environ.get("RAYPARALLEL_WARM_IDLE_TIMEOUT_S", "")
    try:
        seconds = float(given) if given else IDLE_TIMEOUT_S
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise RayParallelError(
            f"RAYPARALLEL_WARM_IDLE_TIMEOUT_S: expected a positive number of seconds, received {given!r}"
        )
    return seconds


def start(num_workers: int, use_gpu: bool, resources_per_worker: dict | None, say: Say) -> SharedWorkers:
    """A group started now as the session's, for the calls to come (`rayparallel.Workers`)."""
    with _lock:
        _join_ray(worker_logs=False)
        return _keep(SharedWorkers(num_workers, "", resources_per_worker, use_gpu), say, idle=True)


def release(workers: SharedWorkers) -> None:
    """End `workers` (a `rayparallel.Workers` block's end); the session's Ray stays up."""
    with _lock:
        if _session["workers"] is workers:
            _close_kept()


def make_room(workers: int, need: dict[str, float], say: Say) -> None:
    """Close the session's group when `workers` processes needing `need` each (with a CPU for Ray Data)
    do not fit beside it: a prediction's workers are not the group's, and would wait for its CPUs."""
    import ray

    from .connect import DATA_CPUS

    with _lock:
        kept: SharedWorkers | None = _session["workers"]
        if kept is None or not kept.alive or not ray.is_initialized():
            return
        wanted = {key: workers * amount for key, amount in need.items() if amount}
        wanted["CPU"] = wanted.get("CPU", 0) + DATA_CPUS
        held, free, total = kept.holds, ray.available_resources(), ray.cluster_resources()
        # the group holds its share once its workers are placed: until then `free` still counts it
        if all(min(free.get(key, 0), total.get(key, 0) - held.get(key, 0)) >= n for key, n in wanted.items()):
            return
        say(f"rayparallel: closing the warm workers ({kept.described}): the prediction needs their resources")
        _close_kept()


def _keep(wanted: SharedWorkers, say: Say, idle: bool) -> SharedWorkers:
    """`wanted` started as the session's group, watched; `idle`: no run is waiting for it (`Workers`)."""
    kept = _session["workers"]
    if kept is not None and kept.alive:
        say(f"rayparallel: replacing the warm workers ({kept.described}) with {wanted.described}")
    _close_kept()
    idle_timeout_s()  # a bad setting refused now, not by the watch
    _session["workers"], wanted.storage_path = wanted, _storage()
    _session["idle_since"] = time.time() if idle else None
    wanted.start()  # beside the driver's checks (or the user's next cells): the workers import TensorFlow
    threading.Thread(target=_watch, args=(wanted, say), name="rayparallel-warm-watch", daemon=True).start()
    return wanted


def _watch(group: SharedWorkers, say: Say) -> None:
    """Close `group` while it is idle, once something else has waited for what it holds in two looks in a
    row (not a placement of a moment), or once it has idled past the timeout; ends with the group."""
    from .pending_demands import pending_demands, waiting_for

    seen = None
    while True:
        time.sleep(WATCH_EVERY_S)
        with _lock:
            if _session["workers"] is not group or not group.alive:
                return
            since = _session["idle_since"]
            waiting = waiting_for(group.holds, pending_demands()) if since is not None and group.placed else None
            reason = f"{waiting} waited for them" if waiting is not None and waiting == seen else None
            if since is not None and time.time() - since > idle_timeout_s():
                reason = f"idle for {time.time() - since:.0f} s (RAYPARALLEL_WARM_IDLE_TIMEOUT_S)"
            if reason:
                say(f"rayparallel: closing the warm workers ({group.described}): {reason}")
                _close_kept()
                return
            seen = waiting


def shutdown() -> None:
    """Release the session's warm workers and the local Ray it started for them (`rayparallel.shutdown`)."""
    import ray

    with _lock:
        _close_kept()
        if _session["ray_started"] and ray.is_initialized():
            ray.shutdown()
        _session["ray_started"] = False
        if _session["storage"]:
            shutil.rmtree(_session["storage"], ignore_errors=True)
            _session["storage"] = None


def _close_kept() -> None:
    from ray.exceptions import RayError

    kept = _session["workers"]
    _session["workers"], _session["idle_since"] = None, None
    if kept is not None:
        with contextlib.suppress(RayError):  # a group whose actors are gone has nothing left to release
            kept.close()


def _join_ray(worker_logs: bool) -> None:
    """Ray for the session: the one this process joined, the cluster in RAY_ADDRESS, else a local Ray
    started here that the session keeps (with a CPU beside the workers, in case a Ray Data job comes)."""
    import ray

    from . import connect

    if not ray.is_initialized():
        _session["ray_started"] = connect.connect(worker_logs, data_cpus=connect.DATA_CPUS)
    if not _session["exit_hook"]:  # after ray.init's own: it runs first, while Ray is still up
        atexit.register(shutdown)
        _session["exit_hook"] = True


def _storage() -> str:
    """Where the warm group's Ray Train run keeps its (empty) records: a folder of the session's own."""
    if _session["storage"] is None:
        _session["storage"] = tempfile.mkdtemp(prefix="rayparallel-warm-")
    return _session["storage"]

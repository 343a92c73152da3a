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
`rayparallel.shutdown()`, or the end of the process, releases both. `rayparallel.Workers` starts
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
from typing import TYPE_CHECKING

from ..console import Say
from .shared_workers import SharedWorkers

if TYPE_CHECKING:
    from ..spec import JobSpec
    from .run_state import ResumePoint

_lock = threading.Lock()
_session: dict = {"workers": None, "ray_started": False, "storage": None, "exit_hook": False}


def enabled() -> bool:
    return os.environ.get("RAYPARALLEL_WARM_WORKERS", "1") != "0"


def workers_for(job: JobSpec, point: ResumePoint | None, worker_logs: bool, say: Say) -> SharedWorkers | None:
    """The session's group for the job (kept, or started now in place of another); None when the job runs
    on a group of its own (it cannot run on a shared one, or warm workers are off and none was started)."""
    with _lock:
        kept: SharedWorkers | None = _session["workers"]
        if kept is not None and kept.alive and point is None and kept.refusal(job) is None:
            say(f"rayparallel: on the warm workers ({kept.described})")
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
        return _keep(wanted, say)


def start(num_workers: int, use_gpu: bool, resources_per_worker: dict | None, say: Say) -> SharedWorkers:
    """A group started now as the session's, for the calls to come (`rayparallel.Workers`)."""
    with _lock:
        _join_ray(worker_logs=False)
        return _keep(SharedWorkers(num_workers, "", resources_per_worker, use_gpu), say)


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


def _keep(wanted: SharedWorkers, say: Say) -> SharedWorkers:
    kept = _session["workers"]
    if kept is not None and kept.alive:
        say(f"rayparallel: replacing the warm workers ({kept.described}) with {wanted.described}")
    _close_kept()
    _session["workers"], wanted.storage_path = wanted, _storage()
    wanted.start()  # beside the driver's checks (or the user's next cells): the workers import TensorFlow
    return wanted


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
    _session["workers"] = None
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

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
`rayparallel.shutdown()`, or the end of the process, releases both. `RAYPARALLEL_WARM_WORKERS=0`
turns this off: every call then starts and ends its own group, as the command line does.
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
    on a group of its own (it cannot run on a shared one, or the session keeps none)."""
    if not enabled():
        return None
    with _lock:
        kept: SharedWorkers | None = _session["workers"]
        _join_ray(job, worker_logs)
        wanted = SharedWorkers.for_job(job, _storage())
        reason = "a resumed run" if point is not None else wanted.refusal(job)
        if reason:
            if kept is not None and kept.alive:
                say(f"rayparallel: closing the warm workers ({kept.described}): this run needs its own ({reason})")
            _close_kept()
            return None
        if kept is not None and kept.refusal(job) is None and kept.alive:
            say(f"rayparallel: on the warm workers ({kept.described}) kept from the last call")
            return kept
        if kept is not None and kept.alive:
            say(f"rayparallel: replacing the warm workers ({kept.described}) with {wanted.described}")
        _close_kept()
        _session["workers"] = wanted
        wanted.start()  # beside the driver's checks: the workers import TensorFlow meanwhile
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


def _join_ray(job: JobSpec, worker_logs: bool) -> None:
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

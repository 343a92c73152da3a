"""`run.json` in the output folder: which Ray run and MLflow run a job folder belongs to.

It makes restarts explicit: `--resume` continues the recorded Ray run (same
`RunConfig(name, storage_path)`, so Ray Train hands the workers its latest checkpoint) and
the same MLflow run; `--fresh` starts new ones. Without either, an unfinished run resumes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from ..checkpoint.resume_state import META, describe_position, newest_intact, points
from ..errors import RayParallelError
from ..files import atomic_write_text
from ..secrets import MASK, mask
from ..spec import JobSpec, load_spec
from ..spec.references import named

RUN_FILE = "run.json"
LOCK_FILE = ".rayparallel.lock"


@contextlib.contextmanager
def folder_held(output_dir: Path, name: str) -> Iterator[None]:
    """The output folder belongs to one live run at a time.

    An exclusive `flock` on `.rayparallel.lock`, held for the whole run: the kernel releases
    it when the process ends, however it ends (a SIGKILLed driver leaves nothing stuck). The
    file says who holds it, for the one-line error a second run gets.
    """
    output_dir.mkdir(parents=True, exist_ok=True)
    with open(output_dir / LOCK_FILE, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another run"
            raise RayParallelError(
                f"--output-dir: expected a folder no live run is writing to, received {str(output_dir)!r} "
                f"(held by {holder}); choose another --output-dir or wait for that run to end"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"job {name!r}, pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%H:%M:%S')}")
        handle.flush()
        yield


@dataclass
class RunState:
    ray_run_name: str
    storage_path: str
    status: str = "RUNNING"  # RUNNING, FINISHED, FAILED, KILLED (MLflow's words)
    mlflow_run_id: str | None = None

    def save(self, output_dir: Path) -> None:
        atomic_write_text(output_dir / RUN_FILE, json.dumps(mask(asdict(self)), indent=2), "--output-dir")

    def points(self) -> list[Path]:
        return points(Path(self.storage_path) / self.ray_run_name)

    def resume_point(self) -> ResumePoint | None:
        """The newest intact Ray checkpoint and the newer damaged ones skipped, or None if nothing was saved."""
        folders = self.points()
        if not folders:
            return None
        folder, skipped = newest_intact(folders)
        if folder is None:
            raise RayParallelError(
                f"--resume: expected an intact resume checkpoint of run {self.ray_run_name!r}, received none "
                f"({'; '.join(skipped)}); start anew with --fresh"
            )
        meta = json.loads((folder / META).read_text())
        return ResumePoint(int(meta["epoch"]), describe_position(meta), folder, skipped)


@dataclass(frozen=True)
class ResumePoint:
    epoch: int  # the last completed epoch
    position: str  # "epoch 2", or "epoch 2 and 40 steps of epoch 3"
    folder: Path  # its resume state
    skipped: list[str]  # newer points that were damaged: "epoch-0005: why"


# What a resume may change: how long and where it runs, never what it trains.
RESUMABLE = (
    "train.epochs",
    "train.progress_every_n_steps",
    "scaling.",
    "run.collective_timeout_s",
    "run.checkpoints_to_keep",
    "run.resume_every_n_steps",
    "failure.max_failures",
    "mlflow.flush_timeout_s",
    "tune.",  # `train` ignores the sweep's settings
)


def differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two nested dicts."""
    keys = []
    for key in sorted(set(a) | set(b)):
        left, right = a.get(key), b.get(key)
        if isinstance(left, dict) and isinstance(right, dict):
            keys += differences(left, right, f"{prefix}{key}.")
        elif left != right:
            keys.append(f"{prefix}{key}")
    return keys


def _unmasked(recorded: object, requested: object) -> object:
    """The recorded job with the requested values where job.yaml could only name them: masked
    secrets, and functions given themselves (`rayparallel.fit`'s builder), recorded by name."""
    if isinstance(recorded, dict) and isinstance(requested, dict):
        return {key: _unmasked(value, requested.get(key)) for key, value in recorded.items()}
    if isinstance(recorded, list) and isinstance(requested, list) and len(recorded) == len(requested):
        return [_unmasked(value, asked) for value, asked in zip(recorded, requested, strict=True)]
    if isinstance(recorded, str) and MASK in recorded and requested is not None and mask(requested) == recorded:
        return requested
    if isinstance(recorded, str) and not isinstance(requested, str) and named(requested) == recorded:
        return requested
    return recorded


def _wants_resume(previous: RunState | None, resume: bool | None) -> bool:
    return resume is True or (resume is None and previous is not None and previous.status != "FINISHED")


@dataclass(frozen=True)
class RunPlan:
    """The run `train` starts, decided once before anything starts (see module doc)."""

    spec: JobSpec  # the requested job, or, resuming, the recorded job.yaml with the overrides applied
    state: RunState  # a new run, or the recorded one
    point: ResumePoint | None  # where a resume continues; None: a fresh run
    changed: list[str]  # keys where the requested job differs from the resumed one (a resume runs its own)


def plan_run(requested: JobSpec, overrides: Sequence[str], output_dir: Path, resume: bool | None) -> RunPlan:
    """A fresh run of `requested`, or the recorded run of `output_dir` when resuming.

    A resume continues the run's own `job.yaml`; `overrides` may change only RESUMABLE keys
    (an override that sets a key to the value it already has changes nothing and is accepted).
    `job.yaml` is written with secrets masked: where a masked value matches the requested
    spec's, the requested (real) value is used.
    """
    previous = read_run_state(output_dir)
    point = previous.resume_point() if previous and _wants_resume(previous, resume) else None
    if resume is True and point is None:
        raise RayParallelError(
            f"--resume: expected a previous run with a saved epoch in {str(output_dir)!r}, received "
            + ("none (no run.json)" if previous is None else f"run {previous.ray_run_name!r} without a completed epoch")
        )
    if point is None:
        # the suffix: runs of one job started in the same second (a sweep's trials) get their own recorder
        name = f"{requested.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(2).hex()}"
        storage_path = requested.run.storage_path or str(output_dir / "ray_results")
        return RunPlan(requested, RunState(ray_run_name=name, storage_path=storage_path), None, [])
    recorded_file = output_dir / "job.yaml"
    recorded = requested  # a folder from before job.yaml was written: the requested job is the run's
    if recorded_file.is_file():
        recorded = load_spec(_unmasked(yaml.safe_load(recorded_file.read_text()), requested.to_dict()))
    resumed = load_spec(recorded, overrides)
    refused = [key for key in differences(recorded.to_dict(), resumed.to_dict()) if not resumable(key)]
    if refused:
        raise RayParallelError(
            f"--set {', '.join(refused)}: expected only settings a resume may change ({', '.join(RESUMABLE)}), "
            f"received a change to {', '.join(refused)}: a resume continues the recorded {recorded_file}; "
            "start anew with --fresh"
        )
    previous.status = "RUNNING"
    return RunPlan(resumed, previous, point, differences(resumed.to_dict(), requested.to_dict()))


def resumable(key: str) -> bool:
    return key in RESUMABLE or key.startswith(tuple(k for k in RESUMABLE if k.endswith(".")))


def read_run_state(output_dir: Path) -> RunState | None:
    """The folder's `run.json`, or None when it has none."""
    path = output_dir / RUN_FILE
    if not path.is_file():
        return None
    try:
        return RunState(**json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise RayParallelError(
            f"{path}: expected a run.json written by rayparallel, received unreadable content ({exc})"
        ) from None

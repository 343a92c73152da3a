"""`run.json` in the output folder: which Ray run and MLflow run a job folder belongs to.

It makes restarts explicit: `--resume` continues the recorded Ray run (same
`RunConfig(name, storage_path)`, so Ray Train hands the workers its latest checkpoint) and
the same MLflow run; `--fresh` starts new ones. Without either, an unfinished run resumes.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import RayParallelError
from ..files import atomic_write_text
from ..secrets import mask

RUN_FILE = "run.json"


@dataclass
class RunState:
    ray_run_name: str
    storage_path: str
    status: str = "RUNNING"  # RUNNING, FINISHED, FAILED, KILLED (MLflow's words)
    mlflow_run_id: str | None = None

    def save(self, output_dir: Path) -> None:
        atomic_write_text(output_dir / RUN_FILE, json.dumps(mask(asdict(self)), indent=2), "--output-dir")

    def resume_point(self) -> tuple[int, Path] | None:
        """(last completed epoch, its Ray checkpoint folder), or None if nothing was saved."""
        folders = sorted((Path(self.storage_path) / self.ray_run_name).glob("epoch-*/meta.json"))
        if not folders:
            return None
        meta = json.loads(folders[-1].read_text())
        return int(meta["epoch"]), folders[-1].parent


def plan_run(
    name: str, output_dir: Path, storage_path: str, resume: bool | None
) -> tuple[RunState, tuple[int, Path] | None]:
    """The run to start: a new one, or the recorded one when resuming (see module doc)."""
    previous = _read(output_dir)
    point = previous.resume_point() if previous else None
    if resume is True and point is None:
        raise RayParallelError(
            f"--resume: expected a previous run with a saved epoch in {str(output_dir)!r}, received "
            + ("none (no run.json)" if previous is None else f"run {previous.ray_run_name!r} without a completed epoch")
        )
    if point is not None and (resume is True or (resume is None and previous.status != "FINISHED")):
        previous.status = "RUNNING"
        return previous, point
    fresh = RunState(ray_run_name=f"{name}-{time.strftime('%Y%m%d-%H%M%S')}", storage_path=storage_path)
    return fresh, None


def _read(output_dir: Path) -> RunState | None:
    path = output_dir / RUN_FILE
    if not path.is_file():
        return None
    try:
        return RunState(**json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise RayParallelError(
            f"{path}: expected a run.json written by rayparallel, received unreadable content ({exc})"
        ) from None

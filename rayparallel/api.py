"""The public Python API: `train` and `validate`."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from .result import TrainResult
from .spec import JobSpec, load_spec
from .spec.references import add_search_path

if TYPE_CHECKING:
    from .worker.preflight import Preflight

SpecSource = str | os.PathLike | dict | JobSpec


def validate(spec: SpecSource, overrides: Iterable[str] = ()) -> JobSpec:
    """Check a job without training: spec, imports, data shapes, the replica's batch.

    >>> import rayparallel
    >>> rayparallel.validate("jobs/stateful_lstm.yaml").per_worker_batch_size  # doctest: +SKIP
    4
    """
    job, _ = _checked(spec, overrides)
    return job


def train(
    spec: SpecSource,
    overrides: Iterable[str] = (),
    output_dir: str | os.PathLike | None = None,
    verbose: bool = True,
    worker_logs: bool = False,
    resume: bool | None = None,
) -> TrainResult:
    """Train a job data-parallel on Ray and return its result (also written as result.json).

    Joins the Ray cluster this process is connected to (or `RAY_ADDRESS`), else starts a
    local Ray for the run and stops it afterwards. `resume=True` continues the run recorded
    in `output_dir` from its last completed epoch, `False` starts fresh, `None` (default)
    resumes only a run that did not finish. `worker_logs=True` shows the workers' own
    output (TensorFlow, Ray Train), which is otherwise held back.

    >>> import rayparallel
    >>> result = rayparallel.train("jobs/stateful_lstm.yaml", overrides=["train.epochs=2"])  # doctest: +SKIP
    >>> result.history[-1]["val_loss"]  # doctest: +SKIP
    """
    return _train(spec, overrides, output_dir, verbose, worker_logs, resume, started_at=time.time())


def _train(
    spec: SpecSource,
    overrides: Iterable[str],
    output_dir: str | os.PathLike | None,
    verbose: bool,
    worker_logs: bool,
    resume: bool | None,
    started_at: float,
) -> TrainResult:
    """`train`, with the start-up clock's origin given (the CLI's: when its process started)."""
    from .cluster.run_state import differences, resumed_spec

    overrides = list(overrides)
    requested = load_spec(spec, overrides)
    out = (Path(output_dir) if output_dir is not None else Path("runs") / requested.name).resolve()
    recorded = resumed_spec(requested.to_dict(), overrides, out, resume)  # a resume continues its own job.yaml
    changed = differences(recorded, requested.to_dict()) if recorded is not None else []
    if changed and verbose:
        print(
            f"rayparallel: resuming the job recorded in {out / 'job.yaml'}, not the given one, which differs in "
            + ", ".join(changed)
        )
    job, checks = _checked(recorded or requested, (), native_logs=worker_logs)  # imports TensorFlow quietly

    from .cluster.launch import Launch, checkpoint_dir, launch
    from .files import ensure_writable

    ensure_writable(out, "--output-dir")
    ensure_writable(checkpoint_dir(job, out), "checkpoint.dir")
    run = Launch(out, [os.getcwd()], checks.baselines, verbose, worker_logs, resume, started_at=started_at)
    run.mark("spec_checked")
    return launch(job, run)


def _checked(spec: SpecSource, overrides: Iterable[str], native_logs: bool = False) -> tuple[JobSpec, Preflight]:
    """The spec, then the workers' own checks run here first (imports from the working directory)."""
    from .worker.preflight import preflight

    job = load_spec(spec, overrides)
    add_search_path([os.getcwd()])
    return job, preflight(job, native_logs=native_logs)

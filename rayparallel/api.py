"""The public Python API: `train` and `validate`."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from .result import TrainResult
from .spec import JobSpec, load_spec
from .spec.references import add_search_path

SpecSource = str | os.PathLike | dict | JobSpec


def validate(spec: SpecSource, overrides: Iterable[str] = ()) -> JobSpec:
    """Check a job without training: spec, imports, data shapes, the replica's batch.

    >>> import rayparallel
    >>> rayparallel.validate("jobs/stateful_lstm.yaml").per_worker_batch_size  # doctest: +SKIP
    4
    """
    from .worker.preflight import preflight

    job = load_spec(spec, overrides)
    add_search_path([os.getcwd()])
    preflight(job)
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
    resumes only a run that did not finish.

    >>> import rayparallel
    >>> result = rayparallel.train("jobs/stateful_lstm.yaml", overrides=["train.epochs=2"])  # doctest: +SKIP
    >>> result.history[-1]["val_loss"]  # doctest: +SKIP
    """
    from .checkpoint.files import ensure_writable
    from .cluster.launch import checkpoint_dir, launch
    from .worker.preflight import preflight

    job = load_spec(spec, overrides)
    search_path = [os.getcwd()]
    add_search_path(search_path)
    checks = preflight(job)
    out = (Path(output_dir) if output_dir is not None else Path("runs") / job.name).resolve()
    ensure_writable(checkpoint_dir(job, out))
    return launch(job, out, checks.baselines, search_path, verbose=verbose, worker_logs=worker_logs, resume=resume)

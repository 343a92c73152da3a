"""The public Python API: `train`, `validate` and `tune`."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from .result import TrainResult
from .spec import JobSpec, SpecSource, load_spec

if TYPE_CHECKING:
    from .sweep.result import SweepResult


def validate(spec: SpecSource, overrides: Iterable[str] = ()) -> JobSpec:
    """Check a job without training: spec, imports, data shapes, the replica's batch.

    >>> import rayparallel
    >>> rayparallel.validate("jobs/stateful_lstm.yaml").per_worker_batch_size  # doctest: +SKIP
    4
    """
    from .cluster.run import checked_job, ray_session, space_warning_for

    job = load_spec(spec, overrides)
    with ray_session(job, worker_logs=False, only_for_checks=True):
        checks = checked_job(job)
    warning = space_warning_for(job, (Path("runs") / job.name).resolve(), checks)  # train's default folder
    if warning:
        print(warning)
    return job


def train(
    spec: SpecSource,
    *,
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
    from .cluster.run import run_job

    return run_job(
        spec,
        overrides=list(overrides),
        output_dir=output_dir,
        verbose=verbose,
        worker_logs=worker_logs,
        resume=resume,
        started_at=time.time(),
    )


def tune(
    spec: SpecSource,
    *,
    params: dict[str, str] | None = None,
    overrides: Iterable[str] = (),
    samples: int | None = None,
    max_concurrent: int | None = None,
    metric: str | None = None,
    mode: str | None = None,
    scheduler: str | None = None,
    output_dir: str | os.PathLike | None = None,
    resume: bool = False,
    verbose: bool = True,
    worker_logs: bool = False,
) -> SweepResult:
    """Sweep a job's settings with Ray Tune: every trial a whole data-parallel run.

    `params` maps dotted spec keys (anything `overrides` may set) to spaces: `choice(a, b)`,
    `grid(a, b)`, `uniform(lo, hi)`, `loguniform(lo, hi)`, `randint(lo, hi)`; they add to
    the job's `tune.params`, as the other arguments override its `tune:` section. Trials
    write to `<output_dir>/trial-NNN/` (default `runs/<name>-tune`); `resume=True` runs only
    the trials of the recorded sweep that did not finish.

    >>> result = rayparallel.tune(  # doctest: +SKIP
    ...     "jobs/stateful_lstm.yaml", {"train.optimizer.config.learning_rate": "loguniform(1e-4, 1e-1)"},
    ...     samples=4, scheduler="asha")
    >>> result.best_weights  # doctest: +SKIP
    """
    from .files import ensure_writable
    from .sweep.driver import run_sweep

    chosen = dict(samples=samples, max_concurrent=max_concurrent, metric=metric, mode=mode, scheduler=scheduler)
    sets = [f"tune.{key}={json.dumps(value)}" for key, value in chosen.items() if value is not None]
    job = load_spec(spec, [*overrides, *sets])
    settings = replace(job.tune, params={**job.tune.params, **(params or {})})
    out = (Path(output_dir) if output_dir is not None else Path("runs") / f"{job.name}-tune").resolve()
    ensure_writable(out, "--output-dir")
    return run_sweep(job, settings, out, resume=resume, verbose=verbose, worker_logs=worker_logs)

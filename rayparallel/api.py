"""The public Python API: `train`, `validate` and `tune`."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from .result import TrainResult
from .spec import JobSpec, load_spec
from .spec.references import add_search_path

if TYPE_CHECKING:
    from .sweep.driver import SweepResult
    from .worker.preflight import Preflight

SpecSource = str | os.PathLike | dict | JobSpec


def validate(spec: SpecSource, overrides: Iterable[str] = ()) -> JobSpec:
    """Check a job without training: spec, imports, data shapes, the replica's batch.

    >>> import rayparallel
    >>> rayparallel.validate("jobs/stateful_lstm.yaml").per_worker_batch_size  # doctest: +SKIP
    4
    """
    job = load_spec(spec, overrides)
    with _ray_for_checks(job, worker_logs=False):
        _checked(job, ())
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
    on_epoch: Callable[[int, dict], str | None] | None = None,
) -> TrainResult:
    """`train`, with the start-up clock's origin given (the CLI's: when its process started);
    `on_epoch` sees every epoch's logs in this process and may end the run (see `Launch`)."""
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
    job = requested if recorded is None else load_spec(recorded, ())
    with _ray_for_checks(job, worker_logs):
        job, checks = _checked(job, (), native_logs=worker_logs)  # imports TensorFlow quietly

        from .cluster.launch import Launch, checkpoint_dir, launch
        from .files import ensure_writable

        ensure_writable(out, "--output-dir")
        ensure_writable(checkpoint_dir(job, out), "checkpoint.dir")
        run = Launch(out, [os.getcwd()], checks.baselines, verbose, worker_logs, resume, started_at=started_at)
        run.on_epoch, run.source, run.datasets, run.inputs = on_epoch, checks.source, checks.plans, checks.inputs
        del checks  # the driver keeps no copy of a loader's arrays once launch has put them in the object store
        run.mark("spec_checked")
        return launch(job, run)


def tune(
    spec: SpecSource,
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
    return run_sweep(job, settings, out, resume, verbose, worker_logs)


@contextlib.contextmanager
def _ray_for_checks(job: JobSpec, worker_logs: bool) -> Iterator[None]:
    """A Ray Data job is checked through Ray (a sample read, the row count): connect before the checks,
    and stop a Ray started here at the end. Other jobs are checked before Ray starts (launch connects)."""
    if job.data.dataset is None:
        yield
        return
    import ray

    from .cluster.connect import DATA_CPUS, connect, quiet_ray_data

    started = connect(worker_logs, data_cpus=DATA_CPUS)
    quiet_ray_data(worker_logs)
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def _checked(spec: SpecSource, overrides: Iterable[str], native_logs: bool = False) -> tuple[JobSpec, Preflight]:
    """The spec, then the workers' own checks run here first (imports from the working directory)."""
    from .worker.preflight import preflight

    job = load_spec(spec, overrides)
    add_search_path([os.getcwd()])
    return job, preflight(job, native_logs=native_logs)

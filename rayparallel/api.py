"""The public Python API: `fit`, `train`, `validate` and `tune` (`predict` lives beside its run path, `inference/run.py`)."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import RayParallelError
from .result import TrainResult
from .spec import JobSpec, SpecSource, load_spec

if TYPE_CHECKING:
    import keras

    from .tuning.result import SweepResult


def validate(spec: SpecSource, overrides: Iterable[str] = ()) -> JobSpec:
    """Check a job without training: spec, imports, data shapes, the replica's batch.

    Examples:
        >>> import rayparallel
        >>> rayparallel.validate("jobs/stateful_lstm.yaml").per_worker_batch_size  # doctest: +SKIP
        4
    """
    from .cluster.run import checked_job, ray_session, space_warning_for

    job = load_spec(spec, overrides)
    with ray_session(job, worker_logs=False, only_for_checks=True):
        checks = checked_job(job)
    warning = space_warning_for(job, (Path("runs") / job.name).resolve(), checks)  # train's default folder
    for line in ([warning] if warning else []) + checks.notes:
        print(line)
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
    local Ray. The run's worker group stays up for the next `train` or `fit` of this process
    that asks for the same workers (`scaling`), which then starts in seconds; `shutdown()`
    releases it (and the local Ray), as the end of the process does (see `Workers`).
    `resume=True` continues the run recorded in `output_dir` from its last completed epoch,
    `False` starts fresh, `None` (default) resumes only a run that did not finish.
    `worker_logs=True` shows the workers' own output (TensorFlow, Ray Train), which is
    otherwise held back.

    Examples:
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
        warm=True,
    )


def fit(
    build: Callable[..., keras.Model],
    x: Any = None,
    y: Any = None,
    *,
    batch_size: int | None = None,
    epochs: int = 1,
    validation_data: Any = None,
    validation_split: float = 0.0,
    sample_weight: Any = None,
    class_weight: dict | None = None,
    callbacks: list[keras.callbacks.Callback] | None = None,
    shuffle: bool = True,
    steps_per_epoch: int | None = None,
    validation_steps: int | None = None,
    num_workers: int = 2,
    use_gpu: bool = False,
    name: str | None = None,
    output_dir: str | os.PathLike | None = None,
    overrides: Iterable[str] = (),
    verbose: bool = True,
    worker_logs: bool = False,
    resume: bool | None = None,
    **settings: Any,
) -> TrainResult:
    """`model.fit` on `num_workers` Ray Train workers, from a notebook or a script: no YAML, no module.

    `build(batch_size)` returns the model (compiled or not) for a worker's rows, from anywhere (a notebook
    cell: Ray sends it by value). The data arguments mean what they mean in `fit` (`validation_split` too);
    `batch_size` is the global batch; `shuffle=False` keeps row order (for stateful models). Arrays go to
    Ray's object store once; a tf.data pipeline as the function that builds it (`x=make_ds`), called by
    every worker. Other settings: `mlflow={"experiment": "x"}`, `overrides=["run.seed=1"]`.

    Examples:
        >>> result = rayparallel.fit(build, x, y, batch_size=32, epochs=3, validation_data=(xv, yv))  # doctest: +SKIP
        >>> model = rayparallel.load_model(result.checkpoint_dir, batch_size=1)  # doctest: +SKIP
    """
    from .data.in_memory import fit_loader

    _check_fit_arguments(batch_size)
    loader = fit_loader(x, y, validation_data, sample_weight, validation_split)
    job = {
        "name": name or _run_name(build),
        "model": {"builder": build},
        "data": {"loader": loader, "layout": "shuffle" if shuffle else "streams"},
        "train": dict(
            global_batch_size=batch_size,
            epochs=epochs,
            class_weight=class_weight,
            callbacks=list(callbacks or []),
            steps_per_epoch=steps_per_epoch,
            validation_steps=validation_steps,
        ),
        "scaling": {"num_workers": num_workers, "use_gpu": use_gpu},
    }
    for section, values in settings.items():  # an unknown section: the spec's own error names the known ones
        job[section] = {**job[section], **values} if isinstance(job.get(section), dict) else values
    return train(
        job, overrides=overrides, output_dir=output_dir, verbose=verbose, worker_logs=worker_logs, resume=resume
    )


def _check_fit_arguments(batch_size: Any) -> None:
    """What `fit` can do without and rayparallel must have (`batch_size`: the global batch)."""
    from .errors import SpecError

    if not isinstance(batch_size, int) or isinstance(batch_size, bool):
        raise SpecError(f"batch_size: expected the global batch size (an integer), received {batch_size!r}")


def _run_name(build: Callable) -> str:
    """`fit-<the builder's name>`, in the letters a run's name may have."""
    return "fit-" + re.sub(r"[^A-Za-z0-9._-]+", "-", getattr(build, "__name__", "model")).strip("-")


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

    Examples:
        >>> result = rayparallel.tune(  # doctest: +SKIP
        ...     "jobs/stateful_lstm.yaml", params={"train.optimizer.config.learning_rate": "loguniform(1e-4, 1e-1)"},
        ...     samples=4, scheduler="asha")
        >>> result.best_weights  # doctest: +SKIP
    """
    from .files import ensure_writable
    from .tuning.driver import run_sweep

    chosen = dict(samples=samples, max_concurrent=max_concurrent, metric=metric, mode=mode, scheduler=scheduler)
    sets = [f"tune.{key}={json.dumps(value)}" for key, value in chosen.items() if value is not None]
    job = load_spec(spec, [*overrides, *sets])
    settings = replace(job.tune, params={**job.tune.params, **(params or {})})
    out = (Path(output_dir) if output_dir is not None else Path("runs") / f"{job.name}-tune").resolve()
    ensure_writable(out, "--output-dir")
    return run_sweep(job, settings, out, resume=resume, verbose=verbose, worker_logs=worker_logs)


class Workers:
    """The worker group that `fit` and `train` keep warm, started now rather than by the first call.

    Its workers start (and import TensorFlow) while the next cells run; every `fit` or `train` that
    asks for these workers (`num_workers`, `use_gpu`, `scaling.resources_per_worker`) then runs on
    them. It replaces the group kept before, if another. `close()`, or the end of a `with` block,
    ends it; `shutdown()` ends it and the local Ray.

    Examples:
        >>> workers = rayparallel.Workers(num_workers=2)  # doctest: +SKIP
        >>> x, y = load_my_arrays()  # meanwhile, the workers start  # doctest: +SKIP
        >>> result = rayparallel.fit(build, x, y, batch_size=64, num_workers=2)  # on them  # doctest: +SKIP
    """

    def __init__(
        self,
        num_workers: int = 2,
        *,
        use_gpu: bool = False,
        resources_per_worker: dict[str, float] | None = None,
        verbose: bool = True,
    ):
        from .cluster.warm_workers import start
        from .console import printer

        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise RayParallelError(f"num_workers: expected a positive number, received {num_workers!r}")
        if not isinstance(resources_per_worker, (dict, type(None))):
            raise RayParallelError(
                f"resources_per_worker: expected a dict such as {{'CPU': 2}}, received {resources_per_worker!r}"
            )
        self._group = start(num_workers, use_gpu, resources_per_worker, printer(verbose))
        self.described = self._group.described  # `2 workers`, as the console says it

    def close(self) -> None:
        from .cluster.warm_workers import release

        release(self._group)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Workers({self.described}{'' if self._group.alive else ', closed'})"


def shutdown() -> None:
    """Release the worker group that `train` and `fit` keep warm, and the local Ray they started.

    Examples:
        >>> import rayparallel
        >>> rayparallel.shutdown()  # the workers' CPUs (or GPUs) back to the cluster
    """
    from .cluster.warm_workers import shutdown as release

    release()

"""One prediction, the one code path of `rayparallel.predict` and `rayparallel predict`.

Order matters as in training: every check that can refuse the job (the output folder, the
rows, the weights against the job's model, the worker count) comes before Ray starts and
before an earlier prediction is removed, so bad input loses nothing. The rows and the
weights are read here once and reach the workers through Ray's object store.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cluster.connect import task_options
from ..cluster.run import ray_session
from ..cluster.stall import warned_while
from ..console import Say, plural, printer
from ..errors import RayParallelError
from ..spec import SpecSource, load_spec
from ..spec.references import add_search_path, reference_name
from . import output
from .source import Rows, dataset_of, find_rows

if TYPE_CHECKING:
    from ..checkpoint.export import Rebuilt
    from ..spec import JobSpec

STATELESS_BATCH = 256  # rows a replica predicts per step when `predict.batch_size` is not set
PROGRESS_EVERY_S = 10.0


@dataclass
class PredictResult:
    """What `predict` wrote (also as `predict.json` in `out`)."""

    out: str
    rows: int
    seconds: float
    rows_per_s: float
    workers: int
    weights: str
    why: str  # why that weights file: "the best by val_loss", "the file given"...
    split: str
    layout: str
    batch_size: int  # rows per replica per step
    source: str  # where the rows came from
    files: list[str] = field(default_factory=list)
    streams: int | None = None
    continue_states: bool = False
    mlflow: dict = field(default_factory=dict)


def predict(
    spec: SpecSource,
    *,
    weights: str | os.PathLike,
    out: str | os.PathLike,
    split: str = "predict",
    x: Any = None,
    overrides: Iterable[str] = (),
    num_workers: int | None = None,
    use_gpu: bool | None = None,
    continue_states: bool = False,
    overwrite: bool = False,
    unlisted: bool = False,
    verbose: bool = True,
    worker_logs: bool = False,
) -> PredictResult:
    """The model's predictions for the job's rows, on `num_workers` Ray workers, as Parquet in `out`.

    The rows: the loader's `x_predict` (`split="val"`: `x_val`), or `data.predict_dataset`
    (`data.val_dataset`), or the arrays `x` (as `fit` takes them; for a `rayparallel.fit` run, pass its
    `job.yaml`). `weights`: a weights file or a checkpoint folder (its best), as `export` takes them. With
    `layout: streams` each worker carries its streams' states window after window, from zero states
    (`continue_states=True`: from the end of the loader's x_train); other rows go through Ray Data to a
    pool of replicas, keyed by their row (or the dataset's id columns). Also written: `out/predict.json`,
    and an MLflow run. The job's modules import from the working directory, as on the command line.

    Examples:
        >>> result = rayparallel.predict("jobs/stateful_lstm.yaml", weights="runs/stateful-lstm-co2/checkpoints",  # doctest: +SKIP
        ...                              out="runs/co2-predict", split="val")
        >>> rayparallel.read_predictions(result.out)["change"].shape  # doctest: +SKIP
    """
    from ..cluster.run import source_of

    say, working_dir = printer(verbose), os.getcwd()  # before Ray: in `ray job submit` the cwd may go once it connects
    add_search_path([working_dir])
    source_name = source_of(spec)
    job = load_spec(spec, list(overrides))
    if use_gpu is not None:
        job = replace(job, scaling=replace(job.scaling, use_gpu=use_gpu))
    output.check_folder(out := Path(out).resolve(), overwrite)
    with contextlib.ExitStack() as ray_up:
        # a loader is called before Ray (inside `ray job submit` the working directory may go once the
        # driver connects); a Ray Data function needs Ray first, or Ray Data starts (or joins) one itself
        if x is None and dataset_of(job, split) is not None:
            ray_up.enter_context(ray_session(job, worker_logs, predict=True))
        rows = find_rows(job, split, continue_states, x)
        workers = _workers(num_workers, job, rows)
        rebuilt = rebuilt_for(job, weights, unlisted)
        batch = _batch_size(job, rows, workers)
        say(f"rayparallel predict: {rows.source}, {_described(rows, workers, batch)}; {_weights_line(rebuilt)}")
        result = PredictResult(
            out=str(out), rows=0, seconds=0.0, rows_per_s=0.0, workers=workers, weights=str(rebuilt.weights),
            why=rebuilt.why, split=split, layout=job.data.layout, batch_size=batch, source=rows.source,
            streams=rows.streams, continue_states=continue_states,
        )  # fmt: skip
        output.clear_folder(out)
        started = time.time()
        ray_up.enter_context(ray_session(job, worker_logs, predict=True))  # joins the one started above, if any
        result.files, result.rows = _predicted(job, rows, rebuilt, workers, batch, out, working_dir, say)
    return _finished(job, result, time.time() - started, source_name, say)


def _finished(job: JobSpec, result: PredictResult, seconds: float, source_name: str, say: Say) -> PredictResult:
    """The result with its time, recorded (predict.json, MLflow) and said."""
    result.seconds, result.rows_per_s = round(seconds, 3), round(result.rows / seconds, 1)
    _record(job, result, Path(result.out), source_name, say)
    say(
        f"predicted {result.rows} rows in {seconds:.1f} s ({result.rows_per_s:g} rows/s) on "
        f"{plural(result.workers, 'worker')} to {result.out}"
    )
    return result


def _predicted(
    job: JobSpec, rows: Rows, rebuilt: Rebuilt, workers: int, batch: int, out: Path, working_dir: str, say: Say
) -> tuple[list[str], int]:
    """The predictions written to `out` as they arrive: (the files, the rows)."""
    import ray

    from ..cluster.connect import worker_need
    from ..cluster.warm_workers import make_room

    make_room(workers, worker_need(job), say)  # a session's warm training workers, when they are in the way
    shared = ray.put(rebuilt.model.get_weights())
    predict = _stream_tables if rows.streams else _replica_tables
    tables = predict(job, rows, rebuilt, shared, workers, batch, working_dir)
    waiting = "the predict workers are starting (importing TensorFlow, building the model) or wait for CPUs"
    with warned_while(waiting, job.run.stall_warning_s, say):  # the first predictions: the workers' start-up
        first = next(tables, None)
    return _write(out, itertools.chain([first] if first is not None else [], tables), rows.count, say)


def rebuilt_for(job: JobSpec, weights: str | os.PathLike, unlisted: bool, batch_size: int = 1) -> Rebuilt:
    """The job's model with the weights, checked to be the model they were trained for (one line if not)."""
    from ..checkpoint.export import find_weights, rebuild

    path, manifest, _ = find_weights(weights, unlisted)
    trained = manifest["model"]["builder"]
    if trained != reference_name(job.model.builder):
        raise RayParallelError(
            f"--weights: expected weights of the job's model ({reference_name(job.model.builder)}), received "
            f"{str(path)!r}, trained for {trained}"
        )
    return rebuild(weights, batch_size, unlisted, dict(job.model.kwargs))


def registered_for(job: JobSpec, uri: str, batch_size: int) -> tuple[Rebuilt, str]:
    """The job's model with the weights of a registered version (`models:/NAME@ALIAS`), and that version."""
    from ..checkpoint.export import Rebuilt
    from ..errors import first_line
    from ..model import build_model
    from ..quiet import import_tensorflow
    from ..spec.references import add_search_path
    from ..tracking.registry import registered
    from ..tracking.store import chosen_tracking_uri

    found = registered(uri, chosen_tracking_uri(job.mlflow.tracking_uri))
    if found.builder and found.builder != reference_name(job.model.builder):
        raise RayParallelError(
            f"--model: expected a version of the job's model ({reference_name(job.model.builder)}), received "
            f"{uri!r}, trained for {found.builder}"
        )
    import_tensorflow()
    add_search_path([os.getcwd()])
    model = build_model(job.model, batch_size)
    try:
        model.load_weights(str(found.keras_file))  # Keras reads the weights of a whole `.keras` model too
    except Exception as exc:
        raise RayParallelError(
            f"--model: expected weights matching the model of {reference_name(job.model.builder)} with kwargs "
            f"{job.model.kwargs}, received {uri!r} ({first_line(exc)})"
        ) from None
    return Rebuilt(model, job.model, found.keras_file, found.why()), found.version


def _workers(num_workers: int | None, job: JobSpec, rows: Rows) -> int:
    workers = job.scaling.max_workers if num_workers is None else num_workers
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise RayParallelError(f"--num-workers: expected a positive number, received {workers!r}")
    if rows.streams is not None and workers > rows.streams:
        raise RayParallelError(
            f"--num-workers: expected at most {rows.streams} workers (each owns at least one of the "
            f"{rows.streams} streams), received {workers}"
        )
    return workers


def _batch_size(job: JobSpec, rows: Rows, workers: int) -> int:
    """Rows per replica per step: a stream worker's streams (in groups of at most `predict.batch_size`)."""
    from ..spec.schema import rank_rows

    if rows.streams is None:
        return job.predict.batch_size or STATELESS_BATCH
    start, stop = rank_rows(rows.streams, workers, 0)  # rank 0 owns the most
    return min(stop - start, job.predict.batch_size or stop - start)


def _described(rows: Rows, workers: int, batch: int) -> str:
    if rows.streams:
        return f"{rows.streams} streams on {plural(workers, 'worker')}, {batch} at a time"
    counted = f"{rows.count} rows" if rows.count is not None else "rows"
    return f"{counted} through {plural(workers, 'replica')}, {batch} a step"


def _weights_line(rebuilt: Rebuilt) -> str:
    return f"weights {rebuilt.weights} ({rebuilt.why})"


def _stream_tables(
    job: JobSpec, rows: Rows, rebuilt: Rebuilt, shared: Any, workers: int, batch: int, working_dir: str
) -> Iterator[Any]:
    """One streaming task per worker (`streams.predict_streams`); tables as any of them yields one."""
    import ray

    from ..data.datasets import own_streams
    from ..spec.schema import rank_rows
    from .streams import predict_streams

    task = ray.remote(predict_streams).options(num_returns="streaming", **task_options(job))
    x = ray.put(rows.x) if rows.x is not None else None
    warmup = ray.put(rows.warmup) if rows.warmup is not None else None
    running = []
    for rank in range(workers):
        start, stop = rank_rows(rows.streams, workers, rank)
        dataset = own_streams(rows.dataset, start, stop) if rows.dataset is not None else None
        running.append(
            task.remote(
                rebuilt.recipe,
                shared,
                [working_dir],
                (start, stop, rows.streams),
                batch,
                x,
                warmup,
                dataset,
                job.data.x,
            )
        )
    while running:
        ready, _ = ray.wait(running, num_returns=1)
        generator = ready[0]
        try:
            yield ray.get(next(generator))
        except StopIteration:
            running.remove(generator)


def _replica_tables(
    job: JobSpec, rows: Rows, rebuilt: Rebuilt, shared: Any, workers: int, batch: int, working_dir: str
) -> Iterator[Any]:
    """Ray Data through a pool of `workers` replicas (`replicas.Replica`), tables as they come."""
    import numpy as np
    import ray
    import ray.data

    from .replicas import ROW, Replica

    if rows.x is not None:  # the row numbers go through Ray Data; each replica takes its rows from the arrays
        ids = np.arange(rows.count)
        dataset = ray.data.from_numpy(np.array_split(ids, max(1, min(len(ids) // batch, 8 * workers))))
        dataset, keys, arrays = dataset.rename_columns({"data": ROW}), [ROW], ray.put(rows.x)
    else:
        dataset, keys, arrays = rows.dataset, rows.keys, None
    predicted = dataset.map_batches(
        Replica,
        fn_constructor_kwargs=dict(
            recipe=rebuilt.recipe,
            weights=shared,
            search_path=[working_dir],
            batch_size=batch,
            keys=keys,
            x_names=job.data.x,
            arrays=arrays,
        ),
        batch_size=batch,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=workers),
        **task_options(job),
    )
    yield from predicted.iter_batches(batch_size=None, batch_format="pyarrow")


def _write(out: Path, tables: Iterator[Any], total: int | None, say: Say) -> tuple[list[str], int]:
    """Each table as a Parquet part, with a progress line every `PROGRESS_EVERY_S`."""
    files, count, started = [], 0, time.time()
    shown = started
    for table in tables:
        if not table.num_rows:
            continue
        files.append(output.write_part(out, len(files), table).name)
        count += table.num_rows
        if time.time() - shown >= PROGRESS_EVERY_S:
            shown = time.time()
            share = f" of {total} ({count / total:.0%})" if total else ""
            say(f"predict: {count} rows{share}, {count / (shown - started):.0f} rows/s")
    return files, count


def _record(job: JobSpec, result: PredictResult, out: Path, source_name: str, say: Say) -> None:
    """predict.json, and the MLflow run when the job tracks (an outage is one line; the files stay)."""
    from .record import open_prediction_run, unlogged

    summary = asdict(result)
    if job.mlflow.enabled:
        try:
            run = open_prediction_run(job, Path(result.weights), source_name)
            result.mlflow = run.info()
            output.write_summary(out, {**summary, "mlflow": result.mlflow})
            run.log(summary, out)
        except Exception as exc:  # an unreachable server, a refused write: the predictions are on disk
            result.mlflow = unlogged(exc)
            say(f"WARNING mlflow: the prediction was not logged ({result.mlflow['unlogged']})")
    output.write_summary(out, asdict(result))

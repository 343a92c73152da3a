"""The workers' own checks, run once in the driver before Ray starts any worker.

A bad builder, loader, data set or checkpoint template then fails in seconds with one line,
instead of after a cluster start-up with a worker traceback. The same functions run again in
every worker. The data is what the workers will read: a plain loader's arrays (loaded here,
once, for the workers to share), a sample of a Ray Data dataset, or rank 0's share from a
rank-aware loader; never a second full copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..checkpoint.policy import check_against_metrics, files_kept
from ..checkpoint.writer import weight_file_bytes
from ..data import datasets, keras_inputs, shards
from ..data.feed import DataSource
from ..errors import DataError, SpecError, first_line
from ..logs import LOSS_SCALE, THROUGHPUT
from ..model import build_model
from ..quiet import import_tensorflow
from ..spec import JobSpec, Shard
from ..worker import compile_checks, compile_settings, outputs, own_step, replica
from ..worker.callbacks import callback_classes

if TYPE_CHECKING:
    import keras


@dataclass
class Preflight:
    baselines: dict  # the loader's figures to print beside the model's
    epoch_keys: list[str]  # the history keys each epoch will have
    source: DataSource  # what the workers read
    datasets: dict = field(default_factory=dict)  # Ray Data: the lazy datasets for Ray Train, by split
    inputs: list[dict] = field(default_factory=list)  # the datasets as MLflow records them (log_input)
    checkpoint_files: int = 0  # weight files the checkpoint folder holds at most by the end
    checkpoint_file_bytes: int = 0  # about what one of them takes
    settings: dict = field(default_factory=dict)  # train: keys left out, as used (compile's or defaults), for MLflow
    notes: list[str] = field(default_factory=list)  # what the driver says once before training (rows left out)


def check_accumulation(spec: JobSpec, steps_per_epoch: int) -> None:
    """Every epoch (and every resume point) ends on an update, so nothing half-accumulated is lost
    between them; within that, updates fall where Keras' `gradient_accumulation_steps` puts them."""
    k = spec.train.gradient_accumulation_steps
    if steps_per_epoch % k:
        raise SpecError(
            f"train.gradient_accumulation_steps: expected a divisor of the {steps_per_epoch} steps per epoch, so "
            f"every epoch ends on an update, received {k}"
        )
    every = spec.run.resume_every_n_steps
    if every and every % k:
        raise SpecError(
            f"run.resume_every_n_steps: expected a multiple of gradient_accumulation_steps {k}, received {every}"
        )


@dataclass
class _Opened:
    """The workers' source, and what the checks need of the data."""

    source: DataSource
    targets: Any  # training targets (all, rank 0's share or a sample)
    val_targets: Any  # None: no validation data
    steps: int  # training steps per epoch
    baselines: dict
    inputs: list[dict]  # for MLflow
    datasets: dict = field(default_factory=dict)  # Ray Data's lazy datasets
    sample_x: Any = None  # Ray Data: the features of the first global batch
    features: Any = None  # training features (as `targets`), for a model's own step
    val_features: Any = None
    weighted: bool = False  # the loader gave sample weights
    weights: Any = None  # those of the training rows (all, or a dataset's first batch)
    rows: tuple[int, int] = (0, 0)  # a plain loader's training and validation rows (0: another source, rank-aware)


def preflight(spec: JobSpec, native_logs: bool = False) -> Preflight:
    """Load the data (a sample of it for Ray Data, one worker's share for a rank-aware loader), build the
    replica at the per-worker batch, resolve optimizer/loss/metrics."""
    import_tensorflow(verbose=native_logs)
    data = _open_data(spec)
    replica.batch_dependent_variables(spec.model, spec.possible_batch_sizes, spec.train.dtype_policy)  # uneven splits
    model = build_model(spec.model, spec.per_worker_batch_size, spec.train.dtype_policy)
    train = compile_settings.resolve(spec.train, model)
    own = own_step.overridden(model)
    own_step.check_job(spec, model)
    if data.sample_x is not None:
        check_inputs(model, data.sample_x, "data.x" if spec.data.dataset is not None else "data.loader x_train")
    optimizer = compile_settings.make_optimizer(train.optimizer)
    names = outputs.output_names(model)
    y_train = outputs.targets_by_output(data.targets, names, "train")
    y_val = outputs.targets_by_output(data.val_targets, names, "val") if data.val_targets is not None else None
    if not own:
        compile_checks.check_settings(train, model, y_train)
    compile_settings.compile_model(model, optimizer, train)
    rows = spec.per_worker_batch_size
    if data.weighted and not own:
        check_weights(model, outputs.first_rows((data.features, y_train, data.weights), rows), train.loss)
    val = outputs.first_rows((data.val_features, y_val), rows) if y_val is not None else None
    first = outputs.first_rows(own_step.packed(data.features, y_train, data.weights), rows)
    train_keys, val_keys = own_step.trial_step(model, first, val, own)
    notes = shuffled_streams(spec, model) + last_batch(
        spec, model, data, own + own_step.overridden(model, own_step.OWN_LOSS)
    )
    check_accumulation(spec, data.steps)
    scale = [LOSS_SCALE] if spec.train.loss_scale else []
    keys = train_keys + list(THROUGHPUT) + scale + val_keys
    callback_classes(spec.train.callbacks)
    files = 0
    if spec.checkpoint.enabled:
        check_against_metrics(spec.checkpoint, epoch_keys=keys, step_keys=["loss"])
        files = files_kept(spec.checkpoint, spec.train.epochs, data.steps)
    return Preflight(
        data.baselines,
        keys,
        data.source,
        data.datasets,
        data.inputs,
        files,
        weight_file_bytes(model),
        compile_settings.described(spec.train, train),
        notes,
    )


def _open_data(spec: JobSpec) -> _Opened:
    batch = spec.train.global_batch_size
    if spec.data.dataset is not None:
        opened = datasets.open_datasets(spec.data, batch, spec.train.seed)
        sample = opened.input.sample
        y = datasets.features(sample, spec.data.y)
        steps = opened.input.steps(opened.input.train_rows, batch)
        y_val = y if opened.input.val_rows else None  # the same columns
        source = DataSource(datasets=opened.input)
        x = datasets.features(sample, spec.data.x)
        return _Opened(
            source, y, y_val, steps, {}, opened.descriptions, opened.datasets, sample_x=x, features=x, val_features=x
        )
    rank_aware = shards.rank_aware(spec.data)
    shard = Shard.of(0, spec.scaling.max_workers, batch) if rank_aware else None  # check rank 0's share
    rows = shard.batch_size if shard else batch  # what each of the loader's batches holds
    out = shards.call_loader(spec.data, batch, shard)
    if keras_inputs.is_dataset(out.get("x_train") if isinstance(out, dict) else None):
        return _opened_keras_input(spec, out, rows, rank_aware)
    for key in ("steps_per_epoch", "validation_steps"):
        if getattr(spec.train, key) is not None:
            raise SpecError(
                f"train.{key}: expected only with a loader that returns datasets (epochs over arrays take every "
                f"full batch), received {getattr(spec.train, key)}"
            )
    data = shards.checked_arrays(out, spec.data, rows, spec.train.class_weight)
    source = DataSource(rank_aware=True) if rank_aware else DataSource(arrays=data)
    steps = shards.steps_per_epoch(data.train.rows, rows)
    y_val, x_val = (data.val.y, data.val.x) if data.val is not None else (None, None)
    weighted = data.train.w is not None and spec.train.class_weight is None
    described = [shards.describe_arrays(spec.data, data)]
    return _Opened(
        source,
        data.train.y,
        y_val,
        steps,
        data.baselines,
        described,
        features=data.train.x,
        val_features=x_val,
        weighted=weighted,
        weights=data.train.w,
        rows=(0, 0) if rank_aware else (data.train.rows, data.val.rows if data.val is not None else 0),
    )


def shuffled_streams(spec: JobSpec, model: keras.Model) -> list[str]:
    """A stateful model trained on shuffled rows: Keras' `fit(shuffle=True)` does the same without a word, but a
    stateful layer's row i then continues a state that another stream's row left; said once."""
    layers = replica.stateful_layers(model)
    if spec.data.layout != "shuffle" or not layers:
        return []
    return [
        f"rayparallel: data.layout: shuffle (fit's shuffle=True) mixes rows of different streams in every batch of "
        f"a stateful model ({', '.join(layer.name for layer in layers)}): each row continues another row's state; "
        f"layout: streams (shuffle=False) keeps row i of every batch on stream i"
    ]


def last_batch(spec: JobSpec, model: keras.Model, data: _Opened, own: list[str]) -> list[str]:
    """A plain loader's rows past the last full global batch: a last, shorter batch, as `fit` takes it, when the
    model's batch is free; left out, said once, when it is fixed (stateful layers, or a model that fails on
    fewer rows: `fit` cannot take them either). Sets the source's `last_partial` and the steps per epoch."""
    global_batch, world = spec.train.global_batch_size, spec.scaling.max_workers
    rest = [rows % global_batch for rows in data.rows]
    if not any(rest):
        return []
    fixed = "stateful layers" if replica.stateful_layers(model) else _fails_on_fewer_rows(model, data, rest, world)
    if fixed:
        left_out = f"{rest[0]} training" + (f" and {rest[1]} validation" if rest[1] else "")
        return [
            f"rayparallel: each epoch leaves out the last {left_out} rows, which do not fill a global batch of "
            f"{global_batch}: the model's batch is fixed ({fixed}), so fit cannot take them either"
        ]
    uneven = [r for r in rest if r % world]
    if own and uneven:  # its own step's (or compute_loss') means over rows are per worker: exact on equal shares
        raise DataError(
            f"data.loader: expected rows that leave a last batch divisible by the {world} workers for a model with "
            f"its own {', '.join(own)} (its means are per worker), received a last batch of {uneven[0]} rows "
            f"({data.rows[0]} training, {data.rows[1]} validation rows, global batch {global_batch})"
        )
    data.source.last_partial = True
    data.steps = shards.steps_per_epoch(data.rows[0], global_batch, last_partial=True)
    return []


def _fails_on_fewer_rows(model: keras.Model, data: _Opened, rest: list[int], world: int) -> str:
    """Why the model cannot run on a worker's share of a shorter last batch (the smallest), or ''."""
    rows = max(1, min(r // world for r in rest if r))
    try:
        model(outputs.first_rows(data.features, rows), training=False)
    except Exception as exc:  # the user's model: any error, named with its first line
        return f"it fails on {rows} rows: {type(exc).__name__}: {first_line(exc)}"
    return ""


def _opened_keras_input(spec: JobSpec, out: dict, batch: int, rank_aware: bool) -> _Opened:
    """A loader's datasets, checked on their first batches; every worker calls the loader itself."""
    train = spec.train
    opened = keras_inputs.open_input(out, batch, train.steps_per_epoch, train.validation_steps)
    x, y, w = opened.train.first
    if train.class_weight is not None and isinstance(y, (dict, tuple, list)):
        raise DataError("train.class_weight: expected a model with one output (as fit), received several outputs")
    val = opened.val.first if opened.val else (None, None, None)
    pydatasets = not any(keras_inputs.is_tf_data(s.dataset) for s in (opened.train, opened.val) if s is not None)
    served = opened if pydatasets and not rank_aware else None  # loaded once for all workers
    source = DataSource(keras_input=True, rank_aware=rank_aware, served=served)
    first = shards.Data(train=shards.Split(x=x, y=y), val=None, baselines={})
    described = dict(shards.describe_arrays(spec.data, first), rows=opened.train.steps * batch)
    weighted = w is not None and train.class_weight is None
    return _Opened(
        source,
        targets=y,
        val_targets=val[1],
        steps=opened.train.steps,
        baselines={},
        inputs=[described],
        sample_x=x,
        features=x,
        val_features=val[0],
        weighted=weighted,
        weights=w,
    )


def check_weights(model: keras.Model, rows: tuple, loss: Any) -> None:
    """The model's loss once on one worker's rows with their sample weights, as the step calls it: weights of
    a shape Keras' loss cannot apply (one per row for a loss per token) fail here, in one line, as in `fit`."""
    x, y, w = rows
    y_pred = model(x, training=False)
    try:
        model.compute_loss(x, y, y_pred, sample_weight=w, training=False)
    except Exception as exc:  # TensorFlow's shape errors, whatever their class
        raise DataError(
            f"data.loader: expected sample weights the loss {_named(loss)} can apply to its values (one per row, or "
            f"per element of a loss per token, as fit takes them), received shape {np.shape(w)} "
            f"({type(exc).__name__}: {first_line(exc)})"
        ) from None


def _named(loss: Any) -> str:
    if outputs.per_output(loss):
        return str({name: _named(value) for name, value in loss.items()})
    return repr(compile_settings.make_loss(loss).name)


def check_inputs(model: keras.Model, x: Any, key: str = "data.x") -> None:
    """Ray Data columns (or a dataset's first batch) against the model's inputs: shapes (past the batch)
    and numbers, or text for a string input (`TextVectorization`, `StringLookup` inside the model). Inputs
    keyed by name are the model's to match."""
    if isinstance(x, dict):
        return
    arrays = list(x) if isinstance(x, (tuple, list)) else [x]
    if len(arrays) != len(model.inputs):
        raise DataError(f"{key}: expected {len(model.inputs)} array(s), one per model input, received {len(arrays)}")
    for tensor, array in zip(model.inputs, arrays, strict=True):
        wanted = tuple(tensor.shape[1:])
        got = tuple(np.shape(array)[1:])
        fits = len(wanted) == len(got) and all(w is None or w == g for w, g in zip(wanted, got, strict=True))
        text = tensor.dtype == "string"
        kind = np.asarray(array).dtype.kind
        if not fits or kind not in ("OSU" if text else "iufc"):
            raise DataError(
                f"{key}: expected rows of shape {wanted} and {'text' if text else 'a numeric dtype'} for the model input "
                f"{tensor.name!r}, received rows of shape {got} and dtype {np.asarray(array).dtype}"
            )

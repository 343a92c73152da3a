"""The workers' own checks, run once in the driver before Ray starts any worker.

A bad builder, loader, data set or checkpoint template then fails in seconds with one line,
instead of after a cluster start-up with a worker traceback. The same functions run again in
every worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint.policy import check_against_metrics
from ..errors import SpecError
from ..model import build_model
from ..quiet import import_tensorflow
from ..spec import JobSpec
from . import outputs, replica, shards
from .callbacks import callback_classes


@dataclass
class Preflight:
    baselines: dict  # the loader's figures to print beside the model's
    epoch_keys: list[str]  # the history keys each epoch will have


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


def preflight(spec: JobSpec, native_logs: bool = False) -> Preflight:
    """Load the data, build the replica at the per-worker batch, resolve optimizer/loss/metrics."""
    import_tensorflow(verbose=native_logs)
    data = shards.load_data(spec.data, spec.train.global_batch_size, spec.train.class_weight)
    replica.batch_dependent_variables(spec.model, spec.possible_batch_sizes, spec.train.dtype_policy)  # uneven splits
    model = build_model(spec.model, spec.per_worker_batch_size, spec.train.dtype_policy)
    replica.make_optimizer(spec.train.optimizer)
    names = outputs.output_names(model)
    y_train = outputs.targets_by_output(data.train.y, names, "train")
    if data.val is not None:
        outputs.targets_by_output(data.val.y, names, "val")
    train_keys = outputs.epoch_keys(outputs.make_heads(spec.train, model, y_train))
    check_accumulation(spec, shards.steps_per_epoch(data.train.rows, spec.train.global_batch_size))
    scale = ["loss_scale"] if spec.train.loss_scale else []
    keys = train_keys + ["samples_per_s"] + scale + ([f"val_{k}" for k in train_keys] if data.val is not None else [])
    callback_classes(spec.train.callbacks)
    if spec.checkpoint.enabled:
        check_against_metrics(spec.checkpoint, epoch_keys=keys, step_keys=["loss"])
    return Preflight(baselines=data.baselines, epoch_keys=keys)

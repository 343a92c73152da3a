"""The loop every Ray Train worker runs: build the replica, feed its rows, sync, report.

Order matters: the strategy is created before any other TensorFlow op (MWMS requires
it), the replica and optimizer are built inside its scope, and every rank takes part in
every collective (steps, progress reductions, epoch figures, weight reads) the same number
of times, otherwise the collectives hang.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ..spec import JobSpec
from ..spec.references import add_search_path
from . import replica, shards
from .step import EpochFigures, Steps
from .sync import Reducer, configure_threads, make_strategy


def train_loop_per_worker(config: dict) -> None:
    """Entry point handed to `TensorflowTrainer(train_loop_per_worker=...)`."""
    import ray.train

    spec: JobSpec = config["spec"]
    actor = config["actor"]
    add_search_path(config["search_path"])
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()

    configure_threads(spec.scaling.resources_per_worker.get("CPU", 1))
    strategy = make_strategy(spec.scaling.use_gpu, spec.run.collective_timeout_s)

    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(spec.train.seed)
    batch, per_worker = spec.train.global_batch_size, spec.per_worker_batch_size
    data = shards.load_data(spec.data, batch)
    with strategy.scope():
        model = replica.build_replica(spec.model, per_worker)
        optimizer = replica.make_optimizer(spec.train.optimizer)
    loss_rows = replica.per_sample_loss(spec.train.loss)
    metrics = replica.make_metrics(spec.train.metrics, spec.train.loss, data.train.y, tuple(model.outputs[0].shape))
    steps = Steps(strategy, model, optimizer, loss_rows, metrics, batch)
    figures = EpochFigures(steps, Reducer(strategy))
    stateful = replica.stateful_layers(model)

    actor.register_worker.remote({
        "rank": rank,
        "node_id": ray.get_runtime_context().get_node_id(),
        "batch_shape": replica.batch_shapes(model),
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        "pid": os.getpid(),
    })

    train_steps = shards.steps_per_epoch(data.train.rows, batch)
    every = spec.train.progress_every_n_steps or max(1, train_steps // 10)
    for epoch in range(spec.train.epochs):
        replica.reset_states(stateful)
        steps.reset()
        started = time.perf_counter()
        order = shards.epoch_order(data.train.rows, epoch, spec.data.layout, spec.train.seed)
        rows = shards.worker_rows(order, batch, rank, world)
        for step, (x, y) in enumerate(_batches(tf, data.train, rows, per_worker), start=1):
            steps.train_step(x, y)
            if step % every == 0 and step < train_steps:
                loss = figures.running_loss(step)  # a collective: every rank calls it
                if rank == 0:
                    elapsed = time.perf_counter() - started
                    actor.log_progress.remote(epoch + 1, step, train_steps, loss, step * batch / elapsed)
        logs = figures.collect(train_steps)
        seconds = time.perf_counter() - started
        logs["samples_per_s"] = train_steps * batch / seconds

        if data.val is not None:
            replica.reset_states(stateful)
            steps.reset()
            val_rows = shards.worker_rows(shards.epoch_order(data.val.rows, 0, "streams", 0), batch, rank, world)
            for x, y in _batches(tf, data.val, val_rows, per_worker):
                steps.eval_step(x, y)
            logs.update(figures.collect(shards.steps_per_epoch(data.val.rows, batch), prefix="val_"))
            replica.reset_states(stateful)

        if rank == 0:
            actor.end_epoch.remote(epoch + 1, logs, seconds)
        ray.train.report(dict(logs, epoch=epoch + 1))

    weights = [w for w in model.get_weights()]  # every rank reads: sync-on-read variables reduce
    if rank == 0:
        ray.get(actor.save_final_weights.remote(weights))


def _batches(tf: Any, split: shards.Split, rows: Any, per_worker: int) -> Any:
    """This worker's rows as full per-worker batches, prefetched."""
    dataset = tf.data.Dataset.from_tensor_slices((shards.take(split.x, rows), split.y[rows]))
    return dataset.batch(per_worker, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

"""The step without Ray: `Steps` and `OwnSteps` on a 2-replica `MirroredStrategy` over two logical CPU devices
(`conftest.pytest_configure` makes them), fed each replica's rows of every global batch as a worker is fed,
against plain Keras `fit` in this process: a masked loss; a position embedding under `global_clipnorm` with
sample weights and a last batch of fewer rows; a model's own `train_step` with sample weights."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from rayparallel.spec.schema import rank_rows
from rayparallel.worker import replica
from rayparallel.worker.own_step import OwnSteps, overridden
from rayparallel.worker.step import Steps
from rayparallel.worker.sync import average_over_workers, clip_after_all_reduce, sum_shared_slices

from . import conformance_models
from .helpers import keras_fit, max_relative_error

GLOBAL_BATCH, REPLICAS = 8, 2


@functools.cache
def two_replicas():
    """One strategy for the process: a second one over the same devices would reuse the first one's collective
    keys, and TensorFlow keeps what each key was (a shape mismatch at the first collective)."""
    import tensorflow as tf

    devices = tf.config.list_logical_devices("CPU")[:REPLICAS]
    if len(devices) < REPLICAS:  # the runtime started before conftest could split the CPU
        raise RuntimeError(f"expected {REPLICAS} logical CPU devices, received {len(devices)}")
    return tf.distribute.MirroredStrategy([d.name for d in devices])


def per_replica(strategy, arrays, rows: int):
    """Each replica's slice of a global batch of `rows` rows, as `shards.worker_steps` gives a worker its own."""
    import keras

    def value(context):
        start, stop = rank_rows(rows, REPLICAS, context.replica_id_in_sync_group)
        return keras.tree.map_structure(lambda a: a[start:stop], arrays)

    return strategy.experimental_distribute_values_from_function(value)


def train_on_replicas(build, data: dict, epochs: int = 2) -> list[np.ndarray]:
    """The worker's set-up (`WorkerSetup._build_replica`, `_build_steps`) on two replicas, then every global
    batch of the epochs in order (the last one shorter where the rows leave one)."""
    import keras

    strategy = two_replicas()
    keras.utils.set_random_seed(4)
    with strategy.scope(), replica.kept_local(set()):
        model = build(batch_size=GLOBAL_BATCH // REPLICAS)
        model._symbolic_build(data_batch=(data["x_train"][:4], data["y_train"][:4]))
        optimizer = model.optimizer
        optimizer.build(model.trainable_variables)
    sum_shared_slices(optimizer)
    average_over_workers(optimizer, REPLICAS)
    clip_after_all_reduce(optimizer)
    steps = OwnSteps(strategy, model) if overridden(model) else Steps(strategy, model, optimizer)
    weights = data.get("sample_weight_train")
    rows = len(data["y_train"])
    for _ in range(epochs):
        for start in range(0, rows, GLOBAL_BATCH):
            batch = slice(start, min(start + GLOBAL_BATCH, rows))
            size = batch.stop - batch.start
            w = None if weights is None else per_replica(strategy, weights[batch], size)
            x, y = (per_replica(strategy, data[key][batch], size) for key in ("x_train", "y_train"))
            steps.train_step(x, y, w, size)
    return model.get_weights()


CASES = {
    "our step: a masked loss": (conformance_models.masked_tagger, conformance_models.padded_tags, {}),
    "our step: a position embedding, global_clipnorm, sample weights, a last batch of 5": (
        conformance_models.position_transformer,
        conformance_models.token_classes,
        {"rows": 61, "weighted": True},
    ),
    "a model's own train_step with sample weights": (
        conformance_models.weighted_own_steps,
        conformance_models.weighted_rows,
        {},
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_step_on_two_replicas_trains_what_fit_trains(name):
    build, load, kwargs = CASES[name]
    data = load(**kwargs)
    fit_data = {key: value for key, value in data.items() if not key.endswith("_val")} | {
        "x_val": data["x_train"][:8],
        "y_val": data["y_train"][:8],
    }
    weights = {"sample_weight": data["sample_weight_train"]} if "sample_weight_train" in data else {}
    model, _ = keras_fit(build, fit_data, None, 2, **weights)
    error = max_relative_error(train_on_replicas(build, data), model.get_weights(), floor=1e-3)
    print(f"{name}: 2 replicas vs Keras fit, max relative weight error {error:.2e}")
    assert error < 1e-5

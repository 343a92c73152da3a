"""This worker's replica and where its variables live.

The replica is built by `rayparallel.model.build_model` with the per-worker batch, inside the
strategy's scope: batch-shaped states kept out of it when batches differ, random layers' seed
states and metric states kept per worker. It is compiled by its builder, or with the job's
settings (`compiled`); every step runs its own `compute_loss` and `compute_metrics`.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..errors import ModelError
from ..hooks import hook
from ..model import build_model

if TYPE_CHECKING:
    import keras

    from ..spec import ModelSpec


def use_jit(setting: bool | str, model: keras.Model) -> bool:
    """`train.jit_compile`: "auto" is Keras' own rule: XLA on GPU workers when every layer supports it
    (on CPUs XLA made this machine's VGG step 35% slower)."""
    import tensorflow as tf

    if setting != "auto":
        return bool(setting)
    layers_ok = all(getattr(layer, "supports_jit", True) for layer in model._flatten_layers())
    return bool(tf.config.list_physical_devices("GPU")) and layers_ok


def batch_shapes(model: keras.Model) -> list[list]:
    """The input shapes the replica was built with, as plain lists for result.json."""
    return [list(t.shape) for t in model.inputs]


def batch_dependent_variables(spec: ModelSpec, batch_sizes: list[int], dtype_policy: str = "float32") -> set[int]:
    """Creation indices of the variables whose shape follows the batch (stateful RNN states).

    With an uneven split the replicas differ in batch, and MultiWorkerMirroredStrategy
    broadcasts every variable's initial value from rank 0 when it is created: a state of
    another shape fails that broadcast. Probe builds at the split's two batch sizes, outside
    the strategy, find these variables by creation order, which is the same on every rank.
    """
    sizes = sorted(set(batch_sizes))
    if len(sizes) == 1:
        return set()
    probes = [_created_variables(spec, size, dtype_policy) for size in sizes]
    differing = {i for i, (small, large) in enumerate(zip(*probes, strict=True)) if small[1] != large[1]}
    trainable = [probes[1][i][0] for i in sorted(differing) if probes[1][i][2]]
    if trainable:
        raise ModelError(
            f"model.builder: expected weights whose shapes do not depend on the batch size (workers get "
            f"batches of {' and '.join(map(str, sizes))}), received {', '.join(trainable)}"
        )
    return differing


def _created_variables(spec: ModelSpec, batch_size: int, dtype_policy: str) -> list[tuple[str, tuple, bool]]:
    import tensorflow as tf

    created = []

    def record(next_creator, **kwargs):
        variable = next_creator(**kwargs)
        created.append((variable.name, tuple(variable.shape), bool(variable.trainable)))
        return variable

    with tf.variable_creator_scope(record):
        build_model(spec, batch_size, dtype_policy)
    return created


# Keras' name for a SeedGenerator's state (Dropout, GaussianNoise, random augmentation layers...)
SEED_STATE = "seed_generator_state"


@contextlib.contextmanager
def kept_local(indices: set[int]) -> Iterator[None]:
    """Inside the strategy's scope: the variables created at `indices`, every random layer's seed
    state and every metric's state stay this worker's own.

    Neither broadcast nor mirrored: each replica's stream states belong to its own streams, and
    its random layers draw from its own stream (`seed_per_rank`). Metric states (Keras makes them
    sync-on-read, which a read outside the step would sum over all workers, a collective) are
    summed by rayparallel where figures are needed, as for the metrics of its own step.
    TensorFlow has no public way past the strategy's variable creator; its default creator
    is the one it would end with.
    """
    import tensorflow as tf

    default_variable_creator_v2 = hook("default_variable_creator")
    count = itertools.count()

    def create(next_creator, **kwargs):
        index = next(count)  # every variable counts, in creation order
        on_read = kwargs.get("synchronization") == tf.VariableSynchronization.ON_READ  # Keras metrics only
        if index in indices or kwargs.get("name") == SEED_STATE or on_read:
            return default_variable_creator_v2(None, **kwargs)
        return next_creator(**kwargs)

    with tf.variable_creator_scope(create):
        yield


def seed_per_rank(model: keras.Model, seed: int, rank: int) -> None:
    """Each worker's random layers draw from their own stream, repeatable from `(seed, rank)`.

    Built alike, every replica's SeedGenerator starts from the same state, so rows `i` and
    `b + i` of a global batch would get the same dropout mask: less noise than one device
    sees. Rank 0 keeps the builder's own states (one worker draws as plain `fit` does).
    """
    import numpy as np

    if rank == 0:
        return
    states = [v for v in model.variables if v.name == SEED_STATE]
    for index, state in enumerate(states):
        derived = int(np.random.SeedSequence([seed, rank, index]).generate_state(1)[0] % 2**31)
        state.assign(np.array([derived, 0], dtype=state.dtype))


def stateful_layers(model: keras.Model) -> list[keras.layers.Layer]:
    return [layer for layer in model._flatten_layers() if getattr(layer, "stateful", False)]


def reset_states(layers: list[keras.layers.Layer]) -> None:
    for layer in layers:
        layer.reset_state()

"""BatchNormalization over N workers: the statistics one device would see, or each worker's own.

Keras' BatchNormalization normalizes with the moments of the rows it is given, so on N workers
it would normalize each worker's slice alone and its moving statistics would drift apart rank
by rank (ranks no longer hold one model). `train.batch_norm`:

- `global` (default): every layer uses the moments of the whole global batch: each layer's
  sums, sums of squares and row count are summed over workers inside the step, so uneven
  shards (3/3/2) weigh each row alike and every rank writes the same moving statistics; the
  gradient flows back through the sum. Keras' own `synchronized=True` computes the same with
  three all-reduces per layer (and three more for the gradient); here the three are packed
  into one: on this machine's CPU ring that took the U-Net's step (10 layers, 2 workers)
  from 126 ms to 69 ms, against 24 ms with `local` (`python -m benchmarks.batch_norm`).
- `local`: each worker's own moments (what Horovod and DDP do by default: no collective per
  layer); the moving statistics are averaged over workers before every snapshot, so saved
  files and ranks agree.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import keras

    from .sync import Reducer


def batch_norm_layers(model: keras.Model) -> list[keras.layers.BatchNormalization]:
    """Every BatchNormalization layer, also inside nested models and custom layers."""
    import keras

    return [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.BatchNormalization)]


class BatchNormSync:
    """Applies `train.batch_norm` to a replica's layers and keeps local moving statistics in agreement."""

    def __init__(self, model: keras.Model, mode: str, world: int):
        self.layers = batch_norm_layers(model) if world > 1 else []  # one worker: Keras' own layer, as in fit
        self.averaged = mode == "local" and bool(self.layers)
        self.world = world
        for layer in self.layers:
            layer.synchronized = False  # the layer's own three all-reduces: replaced by one (or none: local)
            if mode == "global":
                layer._moments = types.MethodType(_global_moments, layer)  # called at every call: set before tracing

    def agree(self, reducer: Reducer) -> None:
        """`local`: every rank takes the workers' mean moving statistics (a collective: every rank calls)."""
        if not self.averaged:
            return
        variables = [v for layer in self.layers for v in (layer.moving_mean, layer.moving_variance)]
        summed = reducer.sum([np.asarray(v.numpy()) for v in variables])
        for variable, total in zip(variables, summed, strict=True):
            variable.assign((total / self.world).astype(variable.dtype))


def _global_moments(layer: keras.layers.BatchNormalization, inputs, mask):
    """The global batch's mean and variance for `layer`, from one all-reduce of this worker's
    sums, sums of squares and row count (E[x^2] - E[x]^2, as Keras' synchronized layer)."""
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if mask is not None or context is None:  # masked moments stay Keras' own (per worker)
        return type(layer)._moments(layer, inputs, mask)
    axes = layer._reduction_axes
    sums = tf.reduce_sum(inputs, axis=axes)
    squares = tf.reduce_sum(tf.square(inputs), axis=axes)
    rows = tf.cast(tf.reduce_prod(tf.gather(tf.shape(inputs), axes)), inputs.dtype)
    packed = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.concat([sums, squares, rows[None]], axis=0))
    channels = tf.shape(sums)[0]
    mean = packed[:channels] / packed[-1]
    variance = tf.maximum(packed[channels : 2 * channels] / packed[-1] - tf.square(mean), 0.0)
    return mean, variance

"""BatchNormalization over N workers: the statistics one device would see, or each worker's own.

Keras' BatchNormalization normalizes with the moments of the rows it is given, so on N workers
it would normalize each worker's slice alone and its moving statistics would drift apart rank
by rank (ranks no longer hold one model). `train.batch_norm`:

- `global` (default): every layer uses the moments of the whole global batch. Keras' own
  `synchronized=True` (TensorFlow backend) all-reduces each layer's sums, sums of squares and
  row counts inside the step, so uneven shards (3/3/2) weigh each row alike and every rank
  writes the same moving statistics; the gradient flows back through the all-reduce.
- `local`: each worker's own moments (what Horovod and DDP do by default: no collective per
  layer); the moving statistics are averaged over workers before every snapshot, so saved
  files and ranks agree.
"""

from __future__ import annotations

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
            layer.synchronized = mode == "global"  # read at every call (`_moments`), so set before tracing

    def agree(self, reducer: Reducer) -> None:
        """`local`: every rank takes the workers' mean moving statistics (a collective: every rank calls)."""
        if not self.averaged:
            return
        variables = [v for layer in self.layers for v in (layer.moving_mean, layer.moving_variance)]
        summed = reducer.sum([np.asarray(v.numpy()) for v in variables])
        for variable, total in zip(variables, summed, strict=True):
            variable.assign((total / self.world).astype(variable.dtype))

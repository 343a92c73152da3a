"""Stateless rows at scale: Ray Data streams them to a pool of model replicas, in any order.

Each replica (a Ray Data actor, one GPU each with `use_gpu`) is the model built for
`predict.batch_size` rows with the trained weights (`batches.built_model`); a smaller last
batch is padded with copies of its first row, whose outputs are dropped (`batches.padded`). Every output row carries its input's
keys: `row` (its index in the loader's arrays) or the dataset's own id columns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..data.shards import leaves, take
from .batches import built_model, padded
from .output import named_outputs, output_table

if TYPE_CHECKING:
    from ..spec import ModelSpec

ROW = "row"


class Replica:
    """One replica: the model and (for a loader's rows) the arrays, shared through the object store."""

    def __init__(
        self,
        recipe: ModelSpec,
        weights: Any,
        search_path: list[str],
        batch_size: int,
        keys: list[str],
        x_names: Any = None,
        arrays: Any = None,
    ):
        import ray

        self.model = built_model(recipe, weights, search_path, batch_size)
        self.arrays = ray.get(arrays) if isinstance(arrays, ray.ObjectRef) else arrays
        self.batch_size, self.keys, self.x_names = batch_size, keys, x_names

    def __call__(self, batch: dict[str, np.ndarray]) -> Any:
        from ..data.datasets import features

        keys = {name: batch[name] for name in self.keys}
        if self.arrays is not None:
            x = take(self.arrays, batch[ROW])
        else:
            x = features(batch, self.x_names)
        rows = len(leaves(x)[0][1])
        outputs = named_outputs(self.model, self.model.predict_on_batch(padded(x, np.arange(rows), self.batch_size)))
        return output_table(keys, {name: values[:rows] for name, values in outputs.items()})

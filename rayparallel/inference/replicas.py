"""Stateless rows at scale: Ray Data streams them to a pool of model replicas, in any order.

Each replica (a Ray Data actor, one GPU each with `use_gpu`) is the model built for
`predict.batch_size` rows with the trained weights; a smaller last batch is filled with
copies of its first row, whose outputs are dropped. Every output row carries its input's
keys: `row` (its index in the loader's arrays) or the dataset's own id columns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..data.shards import leaves, take
from .output import fresh_names, named_outputs, output_table

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

        from ..model import build_model
        from ..quiet import import_tensorflow
        from ..spec.references import add_search_path

        import_tensorflow()
        add_search_path(search_path)
        fresh_names()
        self.model = build_model(recipe, batch_size)
        self.model.set_weights(ray.get(weights) if isinstance(weights, ray.ObjectRef) else weights)
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
        filled = np.concatenate([np.arange(rows), np.zeros(self.batch_size - rows, dtype=int)])
        outputs = named_outputs(self.model, self.model.predict_on_batch(take(x, filled)))
        return output_table(keys, {name: values[:rows] for name, values in outputs.items()})

"""What every predict worker does alike: the model built for its batch with the trained weights, and its
rows as batches of exactly that size (a stateful model's batch is its streams; a short one is padded)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..data.shards import take

if TYPE_CHECKING:
    import keras

    from ..spec import ModelSpec


def built_model(recipe: ModelSpec, weights: Any, search_path: list[str], batch_size: int) -> keras.Model:
    """The job's model for `batch_size` rows with `weights` (or their object-store reference), built in a
    predict worker as the training workers build theirs (the user's modules importable from `search_path`)."""
    import ray

    from ..model import build_model
    from ..quiet import import_tensorflow
    from ..spec.references import add_search_path
    from .output import fresh_names

    import_tensorflow()
    add_search_path(search_path)
    fresh_names()
    model = build_model(recipe, batch_size)
    model.set_weights(ray.get(weights) if isinstance(weights, ray.ObjectRef) else weights)
    return model


def padded(x: Any, rows: np.ndarray, size: int) -> Any:
    """The rows `rows` of `x` (-1: none) as a batch of `size`, every gap filled with a copy of a real row
    (whose output the caller drops: rows never mix).

    >>> padded(np.arange(10) * 10, np.array([4, -1, 6]), 5).tolist()
    [40, 40, 60, 40, 40]
    """
    real = rows[rows >= 0]
    filled = np.full(size, real[0])
    filled[: len(rows)] = np.where(rows >= 0, rows, real[0])
    return take(x, filled)

"""Random layers: each worker its own repeatable stream (TensorFlow only, no Ray)."""

from __future__ import annotations

import numpy as np


def test_each_worker_draws_its_own_dropout_masks_and_a_rerun_repeats_them():
    import keras

    from rayparallel.worker.replica import seed_per_rank

    def masks(rank: int) -> np.ndarray:
        keras.utils.set_random_seed(7)  # as every worker does before it builds its replica
        inputs = keras.Input(batch_shape=(4, 64))
        model = keras.Model(inputs, keras.layers.Dropout(0.5)(inputs))
        seed_per_rank(model, seed=7, rank=rank)
        return np.asarray(model(np.ones((4, 64), "float32"), training=True)) > 0

    first, second = masks(0), masks(1)
    assert not np.array_equal(first, second)  # rows i and b + i of a global batch: other masks
    assert np.array_equal(second, masks(1)) and np.array_equal(first, masks(0))  # repeatable
    keras.utils.set_random_seed(7)
    plain = keras.layers.Dropout(0.5)
    inputs = keras.Input(batch_shape=(4, 64))
    assert np.array_equal(first, np.asarray(keras.Model(inputs, plain(inputs))(np.ones((4, 64)), training=True)) > 0)

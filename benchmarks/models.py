"""Models the benchmarks train or checkpoint."""

from __future__ import annotations


def dense_50m(batch_size: int = 1, width: int = 4096, depth: int = 3):
    """A plain MLP of about 50M parameters (200 MB of float32 weights) for checkpoint stalls."""
    import keras

    inputs = keras.Input(shape=(width,))
    x = inputs
    for i in range(depth):
        x = keras.layers.Dense(width, name=f"dense_{i}")(x)
    return keras.Model(inputs, x, name="dense_50m")

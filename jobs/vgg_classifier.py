"""Example and benchmark job: a VGG-style CNN classifying handwritten digits.

Data: scikit-learn's bundled digits set (1,797 8x8 grey images of 0-9, UCI ML hand-written
digits), which ships inside the package (no download). Images are upsampled to 16x16 so
the VGG blocks have room; 80% train, 20% validation, split with a fixed seed.
"""

from __future__ import annotations

import numpy as np


def build_model(batch_size: int, filters: int = 32, dense: int = 128, classes: int = 10):
    import keras
    from keras import layers

    inputs = keras.Input(shape=(16, 16, 1), name="digit")  # stateless: batch left free
    x = inputs
    for block, n in enumerate((filters, filters * 2, filters * 4)):
        x = layers.Conv2D(n, 3, padding="same", activation="relu", name=f"block{block}_conv1")(x)
        x = layers.Conv2D(n, 3, padding="same", activation="relu", name=f"block{block}_conv2")(x)
        x = layers.MaxPooling2D(name=f"block{block}_pool")(x)
    x = layers.Flatten()(x)
    x = layers.Dense(dense, activation="relu")(x)
    outputs = layers.Dense(classes, activation="softmax")(x)
    return keras.Model(inputs, outputs, name="vgg_digits")


def load_data(val_fraction: float = 0.2, seed: int = 0, repeat: int = 1) -> dict:
    """`repeat` tiles the training set (for longer benchmark epochs; same images)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images / 16.0).astype("float32").repeat(2, axis=1).repeat(2, axis=2)[..., None]
    labels = digits.target.astype("int64")
    order = np.random.default_rng(seed).permutation(len(labels))
    cut = int(len(labels) * (1 - val_fraction))
    train, val = order[:cut], order[cut:]
    x_train, y_train = np.tile(images[train], (repeat, 1, 1, 1)), np.tile(labels[train], repeat)
    return {"x_train": x_train, "y_train": y_train, "x_val": images[val], "y_val": labels[val]}

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


def masked_tagger(batch_size: int, mask: bool = True, vocab: int = 1000, tokens: int = 64, tags: int = 8):
    """A token tagger as the Keras masking guide builds it; `mask=False` trains the same net on the padding."""
    import keras

    inputs = keras.Input(batch_shape=(batch_size, tokens), dtype="int32")
    x = keras.layers.Embedding(vocab, 32, mask_zero=mask)(inputs)
    x = keras.layers.LSTM(32, return_sequences=True)(x)
    model = keras.Model(inputs, keras.layers.Dense(tags, activation="softmax")(x))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    return model


def padded_tags(rows: int = 4096, vocab: int = 1000, tokens: int = 64, tags: int = 8):
    """Rows of 4 to `tokens` token ids padded with 0, a tag per token."""
    import numpy as np

    rng = np.random.default_rng(0)
    lengths = rng.integers(4, tokens + 1, rows)
    x = rng.integers(1, vocab, size=(rows, tokens)) * (np.arange(tokens) < lengths[:, None])
    return {"x_train": x.astype("int32"), "y_train": (x % tags).astype("int32")}

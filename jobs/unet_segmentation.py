"""Example job: a small U-Net segmenting generated shapes (discs and squares on noise).

The data are generated here from a seed (no download): each image holds one to three
bright shapes on a noisy background; the mask marks the shape pixels (class 1).
"""

from __future__ import annotations

import numpy as np

from jobs.parquet import write_splits


def build_model(batch_size: int, size: int = 32, filters: int = 8, batch_norm: bool = False):
    """`batch_norm`: each convolution (without its bias) followed by BatchNormalization, then ReLU."""
    import keras
    from keras import layers

    inputs = keras.Input(shape=(size, size, 1), name="image")  # stateless: batch left free

    def conv(x, n):
        if not batch_norm:
            return layers.Conv2D(n, 3, padding="same", activation="relu")(x)
        x = layers.Conv2D(n, 3, padding="same", use_bias=False)(x)
        return layers.ReLU()(layers.BatchNormalization()(x))

    def block(x, n):
        return conv(conv(x, n), n)

    d1 = block(inputs, filters)
    d2 = block(layers.MaxPooling2D()(d1), filters * 2)
    bottom = block(layers.MaxPooling2D()(d2), filters * 4)
    u2 = block(layers.Concatenate()([layers.UpSampling2D()(bottom), d2]), filters * 2)
    u1 = block(layers.Concatenate()([layers.UpSampling2D()(u2), d1]), filters)
    outputs = layers.Conv2D(2, 1, activation="softmax", name="mask")(u1)
    return keras.Model(inputs, outputs, name="unet")


def load_data(samples: int = 512, size: int = 32, val_fraction: float = 0.25, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:size, :size]
    images = rng.normal(0.0, 0.3, size=(samples, size, size)).astype("float32")
    masks = np.zeros((samples, size, size), dtype="int32")
    for i in range(samples):
        for _ in range(rng.integers(1, 4)):
            cy, cx, r = rng.integers(4, size - 4), rng.integers(4, size - 4), rng.integers(2, 7)
            shape = (
                ((yy - cy) ** 2 + (xx - cx) ** 2 <= r * r)
                if rng.random() < 0.5
                else ((abs(yy - cy) <= r) & (abs(xx - cx) <= r))
            )
            masks[i][shape] = 1
    images += masks * 1.0
    cut = int(samples * (1 - val_fraction))
    x, y = images[..., None], masks[..., None]
    return {"x_train": x[:cut], "y_train": y[:cut], "x_val": x[cut:], "y_val": y[cut:]}


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Write the shapes data set as parquet files for Ray Data")
    parser.add_argument("--write-data", required=True, metavar="DIR")
    parser.add_argument("--samples", type=int, default=512)
    args = parser.parse_args()
    write_splits(args.write_data, load_data(samples=args.samples), files=8)

"""Keras datasets against arrays: `python -m benchmarks.keras_inputs [--quick] [--json PATH]`.

The same small CNN on the same PNG files, 2 workers, fed three ways: arrays decoded once by
the loader, a `keras.utils.PyDataset` that decodes batch i from its files (loaded once per
batch for all workers by the batch server), and a `tf.data` pipeline over the same files
(which every worker runs). Figures: `pydataset_loads_per_batch` (calls of `__getitem__` per
global batch per epoch over all workers, the driver's two checks left out; target 1.0),
`pydataset_vs_arrays_throughput` and `tfdata_vs_arrays_throughput` (target >= 0.9).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.figures import report

SIZE, BATCH = 64, 32


def write_files(folder: Path, images: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(images):
        label = int(rng.integers(0, 4))
        pixels = np.clip(rng.normal(60 * label + 30, 40, size=(SIZE, SIZE)), 0, 255).astype("uint8")
        Image.fromarray(pixels).save(folder / f"image-{i:05d}-{label}.png")


def _paths(folder: str) -> list[Path]:
    return sorted(Path(folder).glob("image-*.png"))


def _label(path: Path) -> int:
    return int(path.stem.rsplit("-", 1)[1])


def _decode(path: Path) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(path), dtype="float32")[..., None] / 255.0


def load_arrays(folder: str) -> dict:
    paths = _paths(folder)
    return {"x_train": np.stack([_decode(p) for p in paths]), "y_train": np.array([_label(p) for p in paths])}


def load_pydataset(folder: str, global_batch_size: int) -> dict:
    import keras

    class Files(keras.utils.PyDataset):
        def __init__(self):
            super().__init__(workers=2)
            self.paths = _paths(folder)

        def __len__(self):
            return len(self.paths) // global_batch_size

        def __getitem__(self, index):
            with open(Path(folder) / "calls.log", "a") as log:
                log.write(f"{index}\n")
            paths = self.paths[index * global_batch_size : (index + 1) * global_batch_size]
            return np.stack([_decode(p) for p in paths]), np.array([_label(p) for p in paths])

    return {"x_train": Files()}


def load_tfdata(folder: str, global_batch_size: int) -> dict:
    import tensorflow as tf

    paths = [str(p) for p in _paths(folder)]
    labels = [_label(Path(p)) for p in paths]

    def decode(path, label):
        image = tf.io.decode_png(tf.io.read_file(path), channels=1)
        return tf.cast(image, tf.float32) / 255.0, label

    files = tf.data.Dataset.from_tensor_slices((paths, labels))
    return {"x_train": files.map(decode, num_parallel_calls=2).batch(global_batch_size).prefetch(2)}


def cnn(batch_size: int):
    import keras

    inputs = keras.Input(batch_shape=(batch_size, SIZE, SIZE, 1))
    x = keras.layers.Conv2D(8, 3, strides=2, activation="relu")(inputs)
    x = keras.layers.Conv2D(16, 3, strides=2, activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(4, activation="softmax")(x))


def throughput(loader: str, kwargs: dict, epochs: int, out: Path) -> float:
    import rayparallel

    spec = {
        "name": f"inputs-{loader}",
        "model": {"builder": "benchmarks.keras_inputs:cnn"},
        "data": {"loader": f"benchmarks.keras_inputs:{loader}", "kwargs": kwargs, "layout": "streams"},
        "train": {"global_batch_size": BATCH, "epochs": epochs, "loss": "sparse_categorical_crossentropy"},
        "scaling": {"num_workers": 2},
        "checkpoint": {"enabled": False},
        "mlflow": {"enabled": False},
    }
    result = rayparallel.train(spec, output_dir=out / loader, verbose=False, resume=False)
    return statistics.median(epoch["samples_per_s"] for epoch in result.history[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer files and epochs")
    parser.add_argument("--json", default=None, help="where to write the figures")
    args = parser.parse_args()
    images, epochs = (512, 3) if args.quick else (2048, 4)
    with tempfile.TemporaryDirectory(prefix="rayparallel-bench-") as tmp:
        folder = Path(tmp) / "files"
        folder.mkdir()
        write_files(folder, images)
        kwargs = {"folder": str(folder)}
        arrays = throughput("load_arrays", kwargs, epochs, Path(tmp))
        pydataset = throughput("load_pydataset", kwargs, epochs, Path(tmp))
        calls = len((folder / "calls.log").read_text().split()) - 2  # the driver's check of the first and last
        tfdata = throughput("load_tfdata", kwargs, epochs, Path(tmp))
    batches = images // BATCH
    figures = {
        "images": images,
        "epochs": epochs,
        "samples_per_s_arrays": arrays,
        "samples_per_s_pydataset": pydataset,
        "samples_per_s_tfdata": tfdata,
        "pydataset_loads_per_batch": calls / (batches * epochs),
        "pydataset_vs_arrays_throughput": pydataset / arrays,
        "tfdata_vs_arrays_throughput": tfdata / arrays,
    }
    report(
        figures,
        f"2 workers, {images} PNG files of {SIZE}x{SIZE}: arrays {arrays:.0f} samples/s, PyDataset {pydataset:.0f} "
        f"({figures['pydataset_vs_arrays_throughput']:.2f}x, {figures['pydataset_loads_per_batch']:.2f} loads per "
        f"batch), tf.data {tfdata:.0f} ({figures['tfdata_vs_arrays_throughput']:.2f}x)",
        args.json,
    )


if __name__ == "__main__":
    main()

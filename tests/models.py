"""Small builders and loaders the tests reference from job specs ("tests.models:...")."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def stateful_lstm(batch_size: int, units: int = 6, window: int = 5, dropout: float = 0.0):
    import keras

    inputs = keras.Input(batch_shape=(batch_size, window, 2))
    hidden = keras.layers.LSTM(units, stateful=True, return_sequences=True)(inputs)
    if dropout:
        hidden = keras.layers.Dropout(dropout)(hidden)
    return keras.Model(inputs, keras.layers.Dense(1)(hidden))


def _sines(global_batch_size: int, windows: int) -> tuple[np.ndarray, np.ndarray]:
    """Features (streams, time, 2) and next-value targets (streams, time, 1) of noisy sines."""
    rng = np.random.default_rng(0)
    t = np.arange(windows * 5 + 1)
    phases = rng.uniform(0, 2 * np.pi, size=global_batch_size)
    series = np.sin(0.3 * t[None, :] + phases[:, None]) + 0.1 * rng.normal(size=(global_batch_size, len(t)))
    clock = np.broadcast_to(np.cos(0.3 * t[None, :-1]), series[:, :-1].shape)
    return np.stack([series[:, :-1], clock], axis=-1).astype("float32"), series[:, 1:, None].astype("float32")


def sine_streams(global_batch_size: int, windows: int = 6):
    """Noisy sines, one phase per stream, laid out stream-interleaved for `layout: streams`."""
    feats, target = _sines(global_batch_size, windows)
    x = feats.reshape(global_batch_size, windows, 5, 2).transpose(1, 0, 2, 3).reshape(-1, 5, 2)
    y = target.reshape(global_batch_size, windows, 5, 1).transpose(1, 0, 2, 3).reshape(-1, 5, 1)
    cut = (windows - 2) * global_batch_size
    return {
        "x_train": x[:cut].astype("float32"),
        "y_train": y[:cut].astype("float32"),
        "x_val": x[cut:].astype("float32"),
        "y_val": y[cut:].astype("float32"),
    }


def timeseries_streams(global_batch_size: int, windows: int = 6):
    """`sine_streams` built as a Keras user builds it for a stateful model: each stream's windows by
    `keras.utils.timeseries_dataset_from_array`, zipped so that row i of every batch is stream i."""
    import keras
    import tensorflow as tf

    feats, target = _sines(global_batch_size, windows)

    def windowed(series):
        return keras.utils.timeseries_dataset_from_array(series, None, 5, sequence_stride=5, batch_size=None)

    def batched(streams):
        return tf.data.Dataset.zip(tuple(windowed(s) for s in streams)).map(lambda *rows: tf.stack(rows))

    data = tf.data.Dataset.zip((batched(feats), batched(target)))
    return {"x_train": data.take(windows - 2), "x_val": data.skip(windows - 2)}


def small_cnn(batch_size: int = 4, classes: int = 3):
    import keras

    inputs = keras.Input(shape=(8, 8, 1))  # stateless: no fixed batch
    h = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(inputs, keras.layers.Dense(classes, activation="softmax")(h))


def own_train_step_cnn(batch_size: int = 4, classes: int = 3):
    """`small_cnn` with a `train_step` that calls Keras' own: trained through it."""
    import keras

    class OwnStep(keras.Model):
        def train_step(self, data):
            return super().train_step(data)

    plain = small_cnn(batch_size, classes)
    return OwnStep(plain.input, plain.output)


def guide_train_step(batch_size: int, features: int = 4):
    """The Keras guide "Customizing what happens in fit()", going lower-level: its own loss (mean
    absolute error, whatever `compile` says), trackers and `test_step`, on `dense_regressor`."""
    import keras
    import tensorflow as tf

    class CustomModel(keras.Model):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.loss_tracker = keras.metrics.Mean(name="loss")
            self.mse_metric = keras.metrics.MeanSquaredError(name="mse")
            self.loss_fn = keras.losses.MeanAbsoluteError()

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.loss_fn(y, y_pred)
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(gradients, self.trainable_variables, strict=True))
            self.loss_tracker.update_state(loss)
            self.mse_metric.update_state(y, y_pred)
            return {"loss": self.loss_tracker.result(), "mse": self.mse_metric.result()}

        def test_step(self, data):
            x, y = data
            y_pred = self(x, training=False)
            self.loss_tracker.update_state(self.loss_fn(y, y_pred))
            self.mse_metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

        @property
        def metrics(self):
            return [self.loss_tracker, self.mse_metric]

    plain = dense_regressor(batch_size, features)
    return CustomModel(plain.input, plain.output)


def guide_compute_loss(batch_size: int, features: int = 4):
    """`Model.compute_loss` as Keras' API docs override it (a loss of its own plus the layers'
    losses, its own tracker), compiled by the builder: SGD with momentum comes from compile."""
    import keras
    from keras import ops

    class MyModel(keras.Model):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.loss_tracker = keras.metrics.Mean(name="loss")

        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
            loss = ops.mean((y_pred - y) ** 2) * 0.5
            loss += ops.sum(self.losses)
            self.loss_tracker.update_state(loss)
            return loss

        @property
        def metrics(self):
            return [self.loss_tracker]

    inputs = keras.Input(batch_shape=(batch_size, features))
    hidden = keras.layers.Dense(8, activation="tanh", kernel_regularizer=keras.regularizers.L2(0.01))(inputs)
    model = MyModel(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9))
    return model


def weighted_compute_loss(batch_size: int, features: int = 4):
    """A `compute_loss` that adds a term of its own (a mean over rows) to compile's loss, which takes the
    sample weights: not compiled by the builder, so the job's settings reach it through our compile."""
    import keras
    from keras import ops

    class PenalizedModel(keras.Model):
        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
            loss = super().compute_loss(x, y, y_pred, sample_weight, training=training)
            return loss + 0.1 * ops.mean(ops.abs(y_pred))

    plain = dense_regressor(batch_size, features)
    return PenalizedModel(plain.input, plain.output)


def compiled_regressor(batch_size: int, features: int = 4):
    """A builder that ends with `compile`, as Keras users write one: settings `train:` does not repeat."""
    import keras

    model = dense_regressor(batch_size, features)
    model.compile(
        optimizer=keras.optimizers.SGD(0.05, momentum=0.5),
        loss=keras.losses.Huber(delta=0.5),
        metrics=[keras.metrics.MeanAbsoluteError(name="mae")],
    )
    return model


def no_logs_step(batch_size: int, features: int = 4):
    """A `train_step` that trains but returns no logs."""
    import keras

    class NoLogs(keras.Model):
        def train_step(self, data):
            super().train_step(data)
            return {}

    plain = dense_regressor(batch_size, features)
    return NoLogs(plain.input, plain.output)


def blobs(rows: int = 96, val_rows: int = 24, classes: int = 3):
    rng = np.random.default_rng(1)
    labels = rng.integers(0, classes, size=rows + val_rows)
    images = rng.normal(size=(rows + val_rows, 8, 8, 1)) * 0.5 + labels[:, None, None, None]
    images, labels = images.astype("float32"), labels.astype("int64")
    return {"x_train": images[:rows], "y_train": labels[:rows], "x_val": images[rows:], "y_val": labels[rows:]}


def dense_regressor(batch_size: int, features: int = 4):
    """Stateless, with a fixed batch: trained on `layout: streams` its batches are Keras `fit`'s with shuffle=False."""
    import keras

    inputs = keras.Input(batch_shape=(batch_size, features))
    hidden = keras.layers.Dense(8, activation="tanh")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1)(hidden))


def linear_rows(rows: int = 96, val_rows: int = 32, features: int = 4, weighted: bool = False, bad_weights=False):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(rows + val_rows, features)).astype("float32")
    y = (x @ rng.normal(size=(features, 1)) + 0.1 * rng.normal(size=(rows + val_rows, 1))).astype("float32")
    data = {"x_train": x[:rows], "y_train": y[:rows], "x_val": x[rows:], "y_val": y[rows:]}
    if weighted or bad_weights:
        weights = rng.uniform(0.2, 3.0, size=rows + val_rows).astype("float32")
        data.update(sample_weight_train=weights[: rows - bad_weights], sample_weight_val=weights[rows:])
    return data


def two_outputs(batch_size: int, features: int = 4):
    """A level (regression) and a kind (3 classes) from the same rows: a multi-output model."""
    import keras

    inputs = keras.Input(batch_shape=(batch_size, features))
    hidden = keras.layers.Dense(8, activation="tanh")(inputs)
    level = keras.layers.Dense(1, name="level")(hidden)
    kind = keras.layers.Dense(3, activation="softmax", name="kind")(hidden)
    return keras.Model(inputs, [level, kind])


def levels_and_kinds(rows: int = 96, val_rows: int = 32, features: int = 4):
    data = linear_rows(rows, val_rows, features)
    kinds = np.digitize(np.concatenate([data["y_train"], data["y_val"]])[:, 0], [-0.5, 0.5]).astype("int64")
    data["y_train"] = {"level": data["y_train"], "kind": kinds[:rows]}
    data["y_val"] = {"level": data["y_val"], "kind": kinds[rows:]}
    return data


# --- bad inputs -------------------------------------------------------------------------


def sequential_without_input(batch_size: int):
    import keras

    return keras.Sequential([keras.layers.Dense(3)])


def wide_targets(global_batch_size: int):
    """y with 5 values per step for a model with one: `mse` would broadcast it silently."""
    data = sine_streams(global_batch_size)
    return {"x_train": data["x_train"], "y_train": np.repeat(data["y_train"], 5, axis=-1)}


def not_a_model(batch_size: int):
    return "a string"


def fixed_batch_32(batch_size: int):
    import keras

    inputs = keras.Input(batch_shape=(32, 4))
    return keras.Model(inputs, keras.layers.Dense(1)(inputs))


def mismatched_lengths():
    return {"x_train": np.zeros((40, 8, 8, 1), "float32"), "y_train": np.zeros(39, "int64")}


def too_few_rows():
    return {"x_train": np.zeros((3, 8, 8, 1), "float32"), "y_train": np.zeros(3, "int64")}


def with_nan():
    data = blobs()
    data["x_train"][5, 0, 0, 0] = np.nan
    return data


def cnn_nan_after(batch_size: int = 4, steps: int = 15):
    """small_cnn whose output turns NaN after `steps` training calls (a diverging model)."""
    import keras
    from keras import ops

    class NanAfter(keras.layers.Layer):
        def build(self, input_shape):
            self.calls = self.add_weight(
                shape=(), initializer="zeros", trainable=False, aggregation="only_first_replica", name="calls"
            )

        def call(self, x, training=False):
            if training:
                self.calls.assign_add(1.0)
            poison = ops.where(self.calls > steps, float("nan"), 0.0)
            return x + poison

    inputs = keras.Input(shape=(8, 8, 1))
    h = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3, activation="relu")(inputs))
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(NanAfter()(h)))


# --- job specs the tests start from -------------------------------------------------------

LSTM_JOB = {
    "name": "lstm",
    "model": {"builder": "tests.models:stateful_lstm"},
    "data": {"loader": "tests.models:sine_streams", "layout": "streams"},
    "train": {
        "global_batch_size": 6,
        "epochs": 2,
        "optimizer": {"class_name": "Adam", "config": {"learning_rate": 0.02}},
        "metrics": ["mae"],
        "seed": 3,
    },
    "scaling": {"num_workers": 2},
}


def lstm_job(name: str, *overrides: str) -> dict:
    """The small stateful LSTM job, renamed and changed with `--set`-style overrides."""
    from rayparallel.spec import apply_overrides

    return apply_overrides(dict(LSTM_JOB, name=name), overrides)


def write_parquet(directory, columns: dict, files: int = 3) -> str:
    """Columns of rows as `files` parquet files named in row order (Ray Data reads them so)."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq
    from ray.data.extensions import ArrowTensorArray

    os.makedirs(directory, exist_ok=True)
    rows = len(next(iter(columns.values())))
    cuts = np.linspace(0, rows, files + 1).astype(int)
    for i, (lo, hi) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)):
        table = {
            k: ArrowTensorArray.from_numpy(v[lo:hi]) if v.ndim > 1 else pa.array(v[lo:hi]) for k, v in columns.items()
        }
        pq.write_table(pa.table(table), os.path.join(directory, f"part-{i:03d}.parquet"))
    return str(directory)


def write_sine_streams(directory, global_batch_size: int, stream_major: tuple[str, ...] = ()) -> dict:
    """`sine_streams` as parquet (train/ and val/) with `stream` and `t` columns: rows t-major in 3 files,
    or for the splits in `stream_major` one stream after another, one file per stream."""
    data = sine_streams(global_batch_size)
    paths = {}
    for split in ("train", "val"):
        x, y = data[f"x_{split}"], data[f"y_{split}"]
        row = np.arange(len(x))
        columns = {"x": x, "y": y, "stream": row % global_batch_size, "t": row // global_batch_size}
        files = 3
        if split in stream_major:
            order = np.lexsort((columns["t"], columns["stream"]))
            columns, files = {k: v[order] for k, v in columns.items()}, global_batch_size
        paths[split] = write_parquet(f"{directory}/{split}", columns, files)
    return paths


def parquet_dataset(
    path: str, split: str = "train", drop: str | None = None, limit: int | None = None, descending: str | None = None
):
    """`data.dataset` for tests: `path/split` as parquet, optionally without a column, cut short, or sorted
    by a column from its last value."""
    import ray.data

    dataset = ray.data.read_parquet(f"{path}/{split}")
    if drop:
        dataset = dataset.drop_columns([drop])
    if descending:
        dataset = dataset.sort(descending, descending=True)
    return dataset.limit(limit) if limit is not None else dataset


def val_parquet(path: str, **kwargs):
    return parquet_dataset(path, "val", **kwargs)


def not_a_dataset(path: str):
    return {"path": path}


def sine_streams_shard(shard, global_batch_size: int):
    """A rank-aware loader: only the streams of `shard`, interleaved as `sine_streams` gives all of them."""
    data = sine_streams(global_batch_size)
    own = {}
    for key, array in data.items():
        streams = array.reshape(-1, global_batch_size, *array.shape[1:])  # (t, stream, ...)
        own[key] = streams[:, shard.streams.start : shard.streams.stop].reshape(-1, *array.shape[1:])
    return own


def write_rows(directory, rows: int) -> str:
    """`linear_rows` for `layout: shuffle` as parquet, with each row's number as `row`."""
    data = linear_rows(rows=rows, val_rows=0)
    columns = {"x": data["x_train"], "y": data["y_train"], "row": np.arange(rows)}
    return write_parquet(f"{directory}/train", columns)


def ray_data_job(name: str, root, *overrides: str) -> dict:
    """The small stateful LSTM job (global batch 6, 1 epoch) reading `root/train` and `root/val` through Ray Data."""
    spec = lstm_job(name, "mlflow.enabled=false", "train.epochs=1", *overrides)
    spec["data"] = {
        "dataset": "tests.models:parquet_dataset",
        "val_dataset": "tests.models:val_parquet",
        "kwargs": {"path": str(root)},
        "layout": "streams",
    }
    return spec


def batch_norm_cnn(batch_size: int = 8, classes: int = 3):
    """A small U-Net's encoder shape: convolutions without bias before BatchNormalization, one
    pair inside a nested model (BN found in nested models too)."""
    import keras

    def block(filters: int):
        return [keras.layers.Conv2D(filters, 3, padding="same", use_bias=False), keras.layers.BatchNormalization()]

    inputs = keras.Input(shape=(8, 8, 1))
    h = keras.layers.ReLU()(keras.Sequential(block(4))(inputs))
    for layer in block(6):
        h = layer(h)
    h = keras.layers.GlobalAveragePooling2D()(keras.layers.ReLU()(h))
    return keras.Model(inputs, keras.layers.Dense(classes, activation="softmax")(h))


def tf_data_blobs(
    global_batch_size: int, repeat: bool = False, batch_size: int | None = None, y: bool = False, outputs: int = 1
):
    """`blobs` as keras-io feeds `fit`: `from_tensor_slices(...).batch(B)`, validation data too;
    `repeat`: an infinite training dataset (needs train.steps_per_epoch). `batch_size`, `y` and
    `outputs` (targets for several outputs): bad input."""
    import tensorflow as tf

    data = blobs()
    batch = batch_size or global_batch_size
    targets = data["y_train"] if outputs == 1 else (data["y_train"],) * outputs
    train = tf.data.Dataset.from_tensor_slices((data["x_train"], targets)).batch(batch)
    val = tf.data.Dataset.from_tensor_slices((data["x_val"], data["y_val"])).batch(batch)
    return {"x_train": train.repeat() if repeat else train, "x_val": val, **({"y_train": data["y_train"]} if y else {})}


class CountedImages:
    """A `keras.utils.PyDataset` that loads batch i from PNG files, as the keras-io segmentation
    example's `OxfordPets(keras.utils.Sequence)` does; each load is appended to `calls.log`."""

    def __new__(cls, folder: str, batch_size: int):
        import keras

        class Images(keras.utils.PyDataset):
            def __init__(self):
                super().__init__()
                self.paths = sorted(Path(folder).glob("image-*.png"))

            def __len__(self):
                return len(self.paths) // batch_size

            def __getitem__(self, index):
                with open(Path(folder) / "calls.log", "a") as log:
                    log.write(f"{index}\n")
                paths = self.paths[index * batch_size : (index + 1) * batch_size]
                x = np.stack([keras.utils.img_to_array(keras.utils.load_img(p, color_mode="grayscale")) for p in paths])
                y = np.array([int(p.stem.rsplit("-", 1)[1]) for p in paths])
                return x / 255.0, y

        return Images()


def write_images(folder, rows: int = 64, classes: int = 3) -> None:
    """Images of `blobs`' kind as PNG files, their label in the name."""
    import keras

    data = blobs(rows, 0, classes)
    for i, (image, label) in enumerate(zip(data["x_train"], data["y_train"], strict=True)):
        pixels = np.clip((image - image.min()) / (np.ptp(image) + 1e-6) * 255, 0, 255)
        keras.utils.save_img(Path(folder) / f"image-{i:03d}-{label}.png", pixels, scale=False)


def png_images(folder: str, global_batch_size: int):
    return {"x_train": CountedImages(folder, global_batch_size)}


def sine_streams_shard_that_stalls(shard, global_batch_size: int):
    """`sine_streams_shard`, except that in a worker (an actor; the driver's checks are not one) it never
    returns: a run that stalls before its first step, as a blocked input does."""
    import time

    import ray

    if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
        time.sleep(3600)
    return sine_streams_shard(shard, global_batch_size)


def dataset_that_blocks(path: str):
    """A `data.dataset` function that never returns (a mount that hangs, a lock never freed)."""
    import time

    time.sleep(3600)


def write_blobs_to_predict(directory, rows: int = 40) -> str:
    """`blobs`' validation images as parquet in a shuffled row order, each with its `image_id`."""
    x = blobs(val_rows=rows)["x_val"]
    order = np.random.default_rng(5).permutation(rows)
    return write_parquet(f"{directory}/predict", {"image": x[order], "image_id": order + 1000}, files=3)


def predict_parquet(path: str):
    """`data.predict_dataset` for tests: `path/predict` as parquet."""
    return parquet_dataset(path, "predict")

"""What users would use instead of rayparallel, written plainly, for side-by-side figures.

- `keras_fit`: single-process Keras 3 `model.fit`, run in a fresh subprocess so its thread
  count can be set before TensorFlow starts.
- `bare_loop`: a minimal hand-written MultiWorkerMirroredStrategy loop on Ray's
  `TensorflowTrainer`: the same model, batch, data and threads, no metrics, no progress,
  no checkpoints.
- `sync_probe`: on 2 workers, the time of one gradient synchronization as rayparallel does
  it (the Keras optimizer's `apply_gradients` under `strategy.run`, minus the same update
  without distribution) against a raw MWMS `all_reduce` of the same bytes.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def keras_fit(threads: int, epochs: int, batch: int, repeat: int) -> float:
    """Samples/s of `model.fit` (median of the epochs after the first)."""
    code = f"""
import os, sys, time, json
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
sys.path.insert(0, {REPO!r})
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads({threads})
tf.config.threading.set_inter_op_parallelism_threads({threads})
import keras
from jobs.vgg_classifier import build_model, load_data
keras.utils.set_random_seed(0)
data = load_data(repeat={repeat})
model = build_model(batch_size={batch})
model.compile(keras.optimizers.Adam(0.001), "sparse_categorical_crossentropy", metrics=["accuracy"])
rows = len(data["y_train"]) // {batch} * {batch}
times = []
class Clock(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None): self.t = time.perf_counter()
    def on_epoch_end(self, epoch, logs=None): times.append(time.perf_counter() - self.t)
model.fit(data["x_train"][:rows], data["y_train"][:rows], batch_size={batch}, epochs={epochs}, shuffle=True,
          verbose=0, callbacks=[Clock()])
print("RESULT", json.dumps([rows / t for t in times[1:]]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=900)
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    if not line:
        raise RuntimeError(f"keras fit benchmark failed: {out.stderr[-2000:]}")
    return statistics.median(json.loads(line[0][7:]))


def _bare_loop_worker(config: dict) -> None:
    import ray.train
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    import keras

    sys.path.insert(0, config["repo"])
    from jobs.vgg_classifier import build_model, load_data

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    batch = config["batch"]
    per_worker = batch // world
    data = load_data(repeat=config["repeat"])
    x, y = data["x_train"], data["y_train"]
    with strategy.scope():
        model = build_model(batch_size=per_worker)
        optimizer = keras.optimizers.Adam(0.001)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=None)

    def replica_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(yb, model(xb, training=True)), global_batch_size=batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    step = tf.function(lambda xb, yb: strategy.run(replica_step, args=(xb, yb)))
    steps = len(y) // batch
    rates = []
    for epoch in range(config["epochs"]):
        order = np.random.default_rng([0, epoch]).permutation(len(y))[: steps * batch]
        rows = order.reshape(steps, world, per_worker)[:, rank, :].reshape(-1)
        dataset = tf.data.Dataset.from_tensor_slices((x[rows], y[rows])).batch(per_worker).prefetch(tf.data.AUTOTUNE)
        started = time.perf_counter()
        for xb, yb in dataset:
            step(xb, yb)
        rates.append(steps * batch / (time.perf_counter() - started))
    if rank == 0:  # Ray Train V2 keeps reported metrics only with checkpoints: hand figures over as a file
        with open(config["out"], "w") as f:
            json.dump(rates, f)


def bare_loop(workers: int, epochs: int, batch: int, repeat: int, storage: str) -> float:
    """Samples/s of the bare MWMS loop on Ray Train (median of the epochs after the first)."""
    out = os.path.join(storage, f"bare-{time.time_ns()}.json")
    os.makedirs(storage, exist_ok=True)
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    trainer = TensorflowTrainer(
        _bare_loop_worker,
        train_loop_config={"repo": REPO, "batch": batch, "repeat": repeat, "epochs": epochs, "out": out},
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(name=f"bare-{workers}-{time.time_ns()}", storage_path=storage),
    )
    trainer.fit()
    with open(out) as f:
        return statistics.median(json.load(f)[1:])


def _sync_worker(config: dict) -> None:
    import ray.train
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    import keras

    sys.path.insert(0, config["repo"])
    from jobs.vgg_classifier import build_model

    iterations = config["iterations"]
    with strategy.scope():
        model = build_model(batch_size=32)
        optimizer = keras.optimizers.Adam(0.001)
    local_model, local_optimizer = build_model(batch_size=32), keras.optimizers.Adam(0.001)
    grads = [tf.ones_like(v) * 1e-3 for v in model.trainable_variables]
    nbytes = sum(int(np.prod(g.shape)) * 4 for g in grads)
    flat = tf.ones([nbytes // 4])

    def synced():
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    def raw():
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(flat))

    run_synced = tf.function(lambda: [strategy.run(synced) for _ in range(iterations)])
    run_raw = tf.function(lambda: [strategy.run(raw) for _ in range(iterations)])
    run_local = tf.function(lambda: [local_optimizer.apply_gradients(zip(grads, local_model.trainable_variables))
                                     for _ in range(iterations)])
    figures = {"synced": [], "raw": [], "local": []}
    for _ in range(config["repeats"] + 1):  # the first round traces
        for name, fn in (("raw", run_raw), ("synced", run_synced), ("local", run_local)):
            started = time.perf_counter()
            out = fn()
            tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)
            figures[name].append((time.perf_counter() - started) / iterations)
    result = {name: statistics.median(values[1:]) for name, values in figures.items()}
    result["bytes"] = nbytes
    if ray.train.get_context().get_world_rank() == 0:
        with open(config["out"], "w") as f:
            json.dump(result, f)


def sync_probe(iterations: int, repeats: int, storage: str) -> dict:
    """Seconds per synchronization (optimizer path minus local update) and per raw all_reduce."""
    out = os.path.join(storage, f"sync-{time.time_ns()}.json")
    os.makedirs(storage, exist_ok=True)
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    trainer = TensorflowTrainer(
        _sync_worker,
        train_loop_config={"repo": REPO, "iterations": iterations, "repeats": repeats, "out": out},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=f"sync-{time.time_ns()}", storage_path=storage),
    )
    trainer.fit()
    with open(out) as f:
        metrics = json.load(f)
    return {"gradient_bytes": metrics["bytes"], "raw_allreduce_s": metrics["raw"],
            "optimizer_sync_s": max(metrics["synced"] - metrics["local"], 0.0),
            "optimizer_apply_total_s": metrics["synced"], "local_update_s": metrics["local"]}

"""What users would use instead of rayparallel, written plainly, for side-by-side figures.

- `keras_fit`: single-process Keras 3 `model.fit`, run in a fresh subprocess so its thread
  count can be set before TensorFlow starts.
- `bare_loop`: a minimal hand-written MultiWorkerMirroredStrategy loop on Ray's
  `TensorflowTrainer`: the same model, batch, data, threads and input feed (NumPy views
  per step; tf.data's prefetch threads halve some 2-worker epochs on this 2-core machine,
  see RESULTS.md), no metrics, no progress, no checkpoints. With `sync=False` each
  worker trains alone on its rows: what the machine can do with N processes at all.
- `sync_probe`: on 2 workers, for gradients of several sizes, the time of one gradient
  synchronization as the training step does it (the Keras optimizer's all-reduce of the
  gradient list: concat, one collective, split) against a raw MWMS `all_reduce` of one
  flat tensor of the same bytes, both on rayparallel's own strategy.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial
from typing import Any

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
    line = [text for text in out.stdout.splitlines() if text.startswith("RESULT ")]
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
    scope = strategy.scope() if config["sync"] else contextlib.nullcontext()
    with scope:
        model = build_model(batch_size=per_worker)
        optimizer = keras.optimizers.Adam(0.001)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=None)

    def replica_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(yb, model(xb, training=True)), global_batch_size=batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    if config["sync"]:
        step = tf.function(lambda xb, yb: strategy.run(replica_step, args=(xb, yb)))
    else:
        step = tf.function(replica_step)
    steps = len(y) // batch
    rates = []
    for epoch in range(config["epochs"]):
        order = np.random.default_rng([0, epoch]).permutation(len(y))[: steps * batch]
        rows = order.reshape(steps, world, per_worker)[:, rank, :].reshape(-1)
        xs, ys = x[rows], y[rows]
        started = time.perf_counter()
        for start in range(0, steps * per_worker, per_worker):
            step(xs[start : start + per_worker], ys[start : start + per_worker])
        rates.append(steps * batch / (time.perf_counter() - started))
    if rank == 0:  # Ray Train V2 keeps reported metrics only with checkpoints: hand figures over as a file
        with open(config["out"], "w") as f:
            json.dump(rates, f)


def _run_on_ray(worker: Any, workers: int, config: dict, storage: str, name: str, use_gpu: bool = False) -> Any:
    """Run `worker` on a TensorflowTrainer; rank 0 writes its figures to a JSON file we read back."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    os.makedirs(storage, exist_ok=True)
    out = os.path.join(storage, f"{name}-{time.time_ns()}.json")
    TensorflowTrainer(
        worker,
        train_loop_config=dict(config, repo=REPO, out=out),
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=use_gpu),
        run_config=RunConfig(name=f"{name}-{time.time_ns()}", storage_path=storage),
    ).fit()
    with open(out) as f:
        return json.load(f)


def bare_loop(
    workers: int, epochs: int, batch: int, repeat: int, storage: str, sync: bool = True, use_gpu: bool = False
) -> float:
    """Samples/s of the bare MWMS loop on Ray Train (median of the epochs after the first)."""
    config = {"batch": batch, "repeat": repeat, "epochs": epochs, "sync": sync}
    return statistics.median(_run_on_ray(_bare_loop_worker, workers, config, storage, "bare", use_gpu)[1:])


def _sync_worker(config: dict) -> None:
    import ray.train
    import tensorflow as tf

    from rayparallel.worker.sync import configure_threads, make_strategy

    configure_threads(1)
    strategy = make_strategy(use_gpu=config["use_gpu"])
    sys.path.insert(0, config["repo"])
    from jobs.vgg_classifier import build_model

    iterations, result = config["iterations"], []
    for filters in config["filters"]:
        grads = [tf.ones(v.shape) * 1e-3 for v in build_model(batch_size=32, filters=filters).trainable_variables]
        flat = tf.ones([sum(int(np.prod(g.shape)) for g in grads)])

        def gradient_sync(grads=grads):  # what the Keras optimizer does with the gradients of a step
            return tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, [tf.identity(g) for g in grads]
            )

        def raw(flat=flat):
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(flat))

        def compressed_sync(grads=grads, wire=tf.float16):  # train.gradient_compression (worker/sync.py)
            summed = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, [tf.cast(g, wire) for g in grads]
            )
            return [tf.cast(s, tf.float32) for s in summed]

        probes = [("raw", raw), ("gradient_sync", gradient_sync)]
        probes += [
            ("gradient_sync_fp16", compressed_sync),
            ("gradient_sync_bf16", partial(compressed_sync, wire=tf.bfloat16)),
        ]
        runs = {name: tf.function(lambda fn=fn: [strategy.run(fn) for _ in range(iterations)]) for name, fn in probes}
        timings: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(config["repeats"] + 1):  # interleaved rounds; the first one traces
            for name, run in runs.items():
                started = time.perf_counter()
                tf.nest.map_structure(lambda t: t.numpy(), strategy.experimental_local_results(run()))
                timings[name].append((time.perf_counter() - started) / iterations)
        timings = {name: statistics.median(values[1:]) for name, values in timings.items()}
        result.append(
            {
                "filters": filters,
                "tensors": len(grads),
                "bytes": int(flat.shape[0]) * 4,
                "raw_allreduce_s": timings["raw"],
                "gradient_sync_s": timings["gradient_sync"],
                "gradient_sync_fp16_s": timings["gradient_sync_fp16"],
                "gradient_sync_bf16_s": timings["gradient_sync_bf16"],
            }
        )
    if ray.train.get_context().get_world_rank() == 0:
        with open(config["out"], "w") as f:
            json.dump(result, f)


def sync_probe(
    iterations: int, repeats: int, storage: str, filters: tuple = (8, 16, 32, 64), use_gpu: bool = False
) -> list[dict]:
    """Seconds per gradient synchronization and per raw all_reduce, for VGG models of several widths."""
    config = {"iterations": iterations, "repeats": repeats, "filters": list(filters), "use_gpu": use_gpu}
    return _run_on_ray(_sync_worker, 2, config, storage, "sync", use_gpu)

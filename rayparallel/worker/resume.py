"""Resume state: what Ray Train checkpoints so a restarted worker group continues exactly.

Kept apart from the exported weight files: model weights, the optimizer's variables (step
count, moments), and the position (the next epoch; data order and RNG derive from
`(seed, epoch)`). Saved at epoch ends only, so stateful streams resume at a boundary where
their states are reset anyway.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import keras
    import ray.train
    import tensorflow as tf

STATE, META = "state.npz", "meta.json"


def snapshot(variables: list) -> list:
    """Point-in-time values of `variables` as tensors, in about a millisecond.

    TensorFlow copies a variable's buffer before updating it in place while a read value
    still refers to it, so later training steps never change a snapshot. Converting to NumPy
    (the slow copy) is left to whoever needs it, e.g. the checkpoint client's thread. Every
    rank calls this at the same point: reading distributed variables may be a collective.
    """
    import tensorflow as tf

    return [tf.identity(v.value) for v in variables]


def digest(arrays: list) -> str:
    """SHA-256 of the arrays' bytes: equal on every rank while the replicas stay in step."""
    sha = hashlib.sha256()
    for array in arrays:
        sha.update(np.ascontiguousarray(array).tobytes())
    return sha.hexdigest()


def to_checkpoint(weights: list, optimizer_values: list, meta: dict) -> ray.train.Checkpoint:
    """A `ray.train.Checkpoint` in a fresh temp folder (Ray copies it to storage_path)."""
    import ray.train

    folder = Path(tempfile.mkdtemp(prefix="rayparallel-resume-"))
    arrays = {f"w{i}": np.asarray(w) for i, w in enumerate(weights)}
    arrays.update({f"o{i}": np.asarray(v) for i, v in enumerate(optimizer_values)})
    np.savez(folder / STATE, **arrays)
    (folder / META).write_text(json.dumps(dict(meta, weights=len(weights), optimizer=len(optimizer_values))))
    return ray.train.Checkpoint.from_directory(str(folder))


def restore(
    checkpoint: ray.train.Checkpoint | None,
    strategy: tf.distribute.Strategy,
    model: keras.Model,
    optimizer: keras.optimizers.Optimizer,
) -> dict | None:
    """Load resume state into the replica and optimizer; returns its meta, or None."""
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as folder:
        meta = json.loads((Path(folder) / META).read_text())
        with np.load(Path(folder) / STATE) as arrays:
            weights = [arrays[f"w{i}"] for i in range(meta["weights"])]
            optimizer_values = [arrays[f"o{i}"] for i in range(meta["optimizer"])]
    with strategy.scope():
        model.set_weights(weights)
        for variable, value in zip(optimizer.variables, optimizer_values, strict=True):
            variable.assign(value)
    return meta

"""Resume state: what a restarted worker group needs to continue exactly, on any worker count.

Model weights, the optimizer's variables (step count, moments) and the position: data order
and RNG derive from `(seed, epoch)`, so a position is an epoch and a step. Epoch ends go to
Ray Train as checkpoints; with `run.resume_every_n_steps`, points inside an epoch also carry
the running epoch (`EpochState`: loss and metric sums over all workers, every stream's RNN
state in stream order), so whichever rank owns a stream after a restart gets its state.
The files are `rayparallel.checkpoint.resume_state`'s.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..checkpoint.resume_state import damage, read_state, write_state
from ..errors import RayParallelError

if TYPE_CHECKING:
    import keras
    import ray.train
    import tensorflow as tf

    from .step import ReplicaSteps
    from .sync import Reducer


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


def state_arrays(weights: list, optimizer_values: list, epoch_state: dict | None = None) -> dict:
    """The arrays of one resume point (`rayparallel.checkpoint.resume_state` names them)."""
    arrays = {f"w{i}": w for i, w in enumerate(weights)}  # tensors or arrays: converted where they are written
    arrays.update({f"o{i}": v for i, v in enumerate(optimizer_values)})
    arrays.update(epoch_state or {})
    return arrays


def counts(weights: list, optimizer_values: list) -> dict:
    return {"weights": len(weights), "optimizer": len(optimizer_values)}


def to_checkpoint(weights: list, optimizer_values: list, meta: dict) -> ray.train.Checkpoint:
    """An epoch end as a `ray.train.Checkpoint` in a fresh temp folder (Ray copies it to storage_path)."""
    import ray.train

    folder = Path(tempfile.mkdtemp(prefix="rayparallel-resume-"))
    write_state(folder, state_arrays(weights, optimizer_values), dict(meta, **counts(weights, optimizer_values)))
    return ray.train.Checkpoint.from_directory(str(folder))


def read_point(folder: str | None, checkpoint: ray.train.Checkpoint | None) -> tuple[dict, dict] | None:
    """(arrays, meta) of the point to resume from, or None for a fresh start.

    `folder` is the recorder's choice in local or mounted storage (the newest intact point,
    epoch ends and the steps between), the same answer for every rank. Storage elsewhere
    (s3://...) holds epoch ends only: Ray's latest checkpoint, which must be intact.
    """
    if folder is not None:
        return read_state(Path(folder))
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as local:
        why = damage(Path(local))
        if why is not None:
            raise RayParallelError(f"resume state: expected an intact checkpoint, received {checkpoint.path} ({why})")
        return read_state(Path(local))


def restore(
    arrays: dict,
    meta: dict,
    strategy: tf.distribute.Strategy,
    model: keras.Model,
    optimizer: keras.optimizers.Optimizer,
) -> None:
    """Load a point's weights and optimizer variables into the replica."""
    weights = [arrays[f"w{i}"] for i in range(meta["weights"])]
    optimizer_values = [arrays[f"o{i}"] for i in range(meta["optimizer"])]
    with strategy.scope():
        model.set_weights(weights)
        for variable, value in zip(optimizer.variables, optimizer_values, strict=True):
            variable.assign(value)


class EpochState:
    """The running epoch as a point inside it needs it, the same arrays on every rank.

    Loss and metric states are summed over the workers (a restart puts the sums on rank 0
    and zeros elsewhere: figures are summed again at the epoch's end), and each stateful
    layer's states are gathered into the global batch's stream order (`rows` is this rank's
    slice of it), so the arrays do not depend on the worker count.
    """

    def __init__(self, steps: ReplicaSteps, reducer: Reducer, stateful: list, rows: tuple[int, int], global_batch: int):
        import keras

        self._steps, self._reducer = steps, reducer
        self._rows, self._global_batch = rows, global_batch
        self._metric_variables = [v for m in steps.metrics for v in m.variables]
        self._stream_states = [v for layer in stateful for v in keras.tree.flatten(layer.states)]
        scale = steps.loss_scale
        self._own = [scale.value, scale.good_steps] if scale is not None else []  # identical on every rank

    def gather(self) -> dict[str, np.ndarray]:
        """A collective: every rank calls it at the same step."""
        start, stop = self._rows
        placed = []
        for state in self._stream_states:
            full = np.zeros((self._global_batch, *state.shape[1:]))
            full[start:stop] = np.asarray(state.numpy())
            placed.append(full)
        local = [np.asarray(self._steps.loss_total.numpy())] + [np.asarray(v.numpy()) for v in self._metric_variables]
        loss_total, *rest = self._reducer.sum(local + placed)
        metrics, streams = rest[: len(self._metric_variables)], rest[len(self._metric_variables) :]
        arrays = {"e_loss_total": np.asarray(loss_total)}
        arrays.update({f"e_metric{i}": value for i, value in enumerate(metrics)})
        arrays.update({f"e_stream{i}": value for i, value in enumerate(streams)})
        arrays.update({f"e_own{i}": np.asarray(v.numpy()) for i, v in enumerate(self._own)})
        return arrays

    def load(self, arrays: dict, steps_done: int, rank: int) -> None:
        """Into freshly reset states: the sums on rank 0, this rank's streams everywhere."""
        start, stop = self._rows

        def on_rank_0(value: np.ndarray) -> np.ndarray:
            return value if rank == 0 else np.zeros_like(value)

        self._steps.loss_total.assign(on_rank_0(arrays["e_loss_total"]))
        for i, variable in enumerate(self._metric_variables):  # Keras variables: dtype is a NumPy name
            variable.assign(on_rank_0(arrays[f"e_metric{i}"]).astype(variable.dtype))
        for i, state in enumerate(self._stream_states):
            state.assign(arrays[f"e_stream{i}"][start:stop].astype(state.dtype))
        for i, variable in enumerate(self._own):
            variable.assign(arrays[f"e_own{i}"])
        self._steps.steps_run.assign(steps_done)

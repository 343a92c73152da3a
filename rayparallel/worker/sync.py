"""Gradient and metric synchronization across workers: MultiWorkerMirroredStrategy collectives.

Ray's TensorFlow backend writes `TF_CONFIG`; the strategy built from it is the sync engine.
Gradients are all-reduced by the Keras optimizer's `apply_gradients` inside
`strategy.run`; metric states are summed where figures are needed by :class:`Reducer`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from ..hooks import hook

if TYPE_CHECKING:
    import keras
    import ray
    import tensorflow as tf


def configure_threads(cpus_per_worker: float) -> None:
    """A worker that reserved N CPUs runs N intra-op threads (must precede any TF op)."""
    import tensorflow as tf

    threads = max(1, int(cpus_per_worker))
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)


def make_strategy(use_gpu: bool) -> tf.distribute.MultiWorkerMirroredStrategy:
    """MWMS with NCCL on GPUs and the ring on CPUs; a dead or hung peer is `StepWatchdog`'s to catch.

    No `CommunicationOptions(timeout_seconds=...)`: TensorFlow starts one thread per collective
    that sleeps for the whole timeout, so at hundreds of collectives a second they pile up by
    the ten thousand until thread creation fails (`std::system_error` in the collective
    executor: a 2-worker run of 8,192 short steps aborted so here in its second epoch).
    """
    import tensorflow as tf

    implementation = (
        tf.distribute.experimental.CommunicationImplementation.NCCL
        if use_gpu and tf.config.list_physical_devices("GPU")
        else tf.distribute.experimental.CommunicationImplementation.RING
    )
    options = tf.distribute.experimental.CommunicationOptions(implementation=implementation)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


class StepWatchdog:
    """Fails this worker when no step has finished for `timeout_s` (a dead or hung peer).

    One daemon thread for the whole run, instead of TensorFlow's thread per collective. The loop
    calls `beat()` after every step; the first step (tracing, compiling) is not timed. On expiry
    it first hands the reason to `on_expiry` (the recorder keeps it for the driver's error), then
    aborts the collective ops, which makes a waiting collective raise, so the worker fails and
    Ray Train restarts the group or ends the run (`failure.max_failures`). A worker waiting on a
    peer outside TensorFlow (Ray Train's report barrier at an epoch end) does not wake from that:
    when the loop has not unwound (`disarm()`) `grace_s` later, the process exits, which Ray sees
    at once.
    """

    def __init__(
        self, timeout_s: float, on_expiry: Callable[[str], ray.ObjectRef | None] | None = None, grace_s: float = 3.0
    ):
        self.timeout_s, self.grace_s, self._on_expiry = timeout_s, grace_s, on_expiry
        self._last: float | None = None  # None: not armed yet, or disarmed
        threading.Thread(target=self._watch, name="rayparallel-watchdog", daemon=True).start()

    def beat(self) -> None:
        self._last = time.monotonic()

    def disarm(self) -> None:
        """Training is over, or the loop is unwinding from an error: nothing more to time."""
        self._last = None

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.timeout_s / 4))
            last = self._last  # read once: the loop may disarm in between
            if last is not None and time.monotonic() - last > self.timeout_s:
                break
        message = (
            f"run.collective_timeout_s: expected a step to finish within {self.timeout_s:g} s, received none "
            "(a peer died or hangs)"
        )
        expired = time.monotonic()
        noted = self._on_expiry(message) if self._on_expiry else None
        hook("tf_context")().abort_collective_ops(hook("tf_errors").UNAVAILABLE, message)
        if noted is not None:
            import ray

            with contextlib.suppress(Exception):  # the reason is a courtesy: never let it keep us alive
                ray.wait([noted], timeout=self.grace_s)
        while self._last is not None and time.monotonic() - expired < self.grace_s:
            time.sleep(0.1)
        if self._last is not None:  # stuck outside TensorFlow: only ending the process frees the run
            print(f"rayparallel: {message}; ending this worker", file=sys.stderr, flush=True)
            os._exit(1)


_step = threading.local()  # the batch tensors (x, y, w) of the step being traced on this thread


@contextlib.contextmanager
def step_inputs(*batch: object) -> Iterator[None]:
    """While a step is traced in this block, the gradient all-reduce can tell which sparse gradients
    come from the batch (`sum_shared_slices`)."""
    import tensorflow as tf

    before = getattr(_step, "ops", None)
    _step.ops = {t.op for t in tf.nest.flatten(batch) if isinstance(t, tf.Tensor)}
    try:
        yield
    finally:
        _step.ops = before


def from_batch(tensor: tf.Tensor, batch_ops: set) -> bool:
    """Whether `tensor` is computed from the batch's tensors: a walk up its graph (when the step is traced)."""
    seen, stack = set(), [tensor.op]
    while stack:
        op = stack.pop()
        if op in batch_ops:
            return True
        if op not in seen:
            seen.add(op)
            stack.extend(t.op for t in op.inputs)
    return False


def sum_shared_slices(optimizer: keras.optimizers.Optimizer) -> None:
    """Make the optimizer sum, rather than gather, the sparse gradients whose rows do not come from the batch.

    An embedding looked up at rows that are not the batch's (a position embedding: `pos(arange(maxlen))`,
    broadcast over the batch) has in one process one gradient row per looked-up row, summed over the batch.
    Every worker holds those same rows with its own rows' sums; TensorFlow's all-reduce of `IndexedSlices`
    concatenates them, so each row would appear once per worker. The update (a scatter-add) is the same, but
    Keras' `global_clipnorm` and `clipnorm` norm the slices' values as they are, duplicates apart: the norm
    would no longer be the one `fit` computes, and the clip scales another gradient. These values are summed
    instead (dense, of the same shape on every worker, packed into the one all-reduce of the other gradients),
    which is the gradient one process has.
    Slices looked up at the batch's rows (a token embedding) stay gathered: one process has one row per token
    of the batch, duplicates unmerged, and so does the concatenation.
    """
    import tensorflow as tf

    all_reduce = optimizer._all_reduce_sum_gradients

    def reduce(grads_and_vars):
        pairs = list(grads_and_vars)
        context, batch_ops = tf.distribute.get_replica_context(), getattr(_step, "ops", None)
        if context is None or context.num_replicas_in_sync == 1 or batch_ops is None:
            return all_reduce(pairs)
        shared = {
            i
            for i, (g, _) in enumerate(pairs)
            if isinstance(g, tf.IndexedSlices) and not from_batch(g.indices, batch_ops)
        }
        # their values as dense gradients: packed into the one all-reduce of the others, no collective of their own
        reduced = all_reduce([(g.values, v) if i in shared else (g, v) for i, (g, v) in enumerate(pairs)])
        return [
            (tf.IndexedSlices(r, pairs[i][0].indices, pairs[i][0].dense_shape) if i in shared else r, v)
            for i, (r, v) in enumerate(reduced)
        ]

    optimizer._all_reduce_sum_gradients = reduce


WIRE_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


def compress_gradients(optimizer: keras.optimizers.Optimizer, mode: str) -> None:
    """Make the optimizer's gradient all-reduce send `mode` ("fp16", "bf16") instead of float32.

    Horovod's `Compression.fp16` idea: each gradient is cast down before the collective and
    back to its own dtype after it, so the update itself runs at full precision. Half the
    bytes cross the wire; the sums are rounded (not exact: docs/speed.md, "Gradient compression").
    Keras' TensorFlow optimizer all-reduces in `_all_reduce_sum_gradients`; wrapping it on
    this one instance keeps everything else (clipping, loss scaling, the update) as it was.
    """
    if mode == "none":
        return
    import tensorflow as tf

    wire = WIRE_DTYPES[mode]
    all_reduce = optimizer._all_reduce_sum_gradients

    def compressed(grads_and_vars):
        pairs = list(grads_and_vars)
        sent = [(None if g is None else tf.cast(g, wire), v) for g, v in pairs]
        summed = all_reduce(sent)
        return [
            (None if g is None else tf.cast(g, own.dtype), v) for (g, v), (own, _) in zip(summed, pairs, strict=True)
        ]

    optimizer._all_reduce_sum_gradients = compressed


def clip_after_all_reduce(optimizer: keras.optimizers.Optimizer) -> None:
    """Make the optimizer clip the global gradient, as one device does, not each worker's share.

    Keras' optimizer clips (`clipnorm`, `clipvalue`, `global_clipnorm`) before its all-reduce,
    so under a strategy each worker would clip its partial gradient and N workers would train
    another model than one. On this one instance the clipping moves after the all-reduce
    (after `compress_gradients`' cast back, when both are set).
    """
    if all(getattr(optimizer, name) is None for name in ("clipnorm", "clipvalue", "global_clipnorm")):
        return
    clip, all_reduce = optimizer._clip_gradients, optimizer._all_reduce_sum_gradients

    def reduce_then_clip(grads_and_vars):
        pairs = list(all_reduce(grads_and_vars))
        return list(zip(clip([g for g, _ in pairs]), [v for _, v in pairs], strict=True))

    optimizer._clip_gradients = lambda grads: grads
    optimizer._all_reduce_sum_gradients = reduce_then_clip


def average_over_workers(optimizer: keras.optimizers.Optimizer, world: int) -> None:
    """Make the optimizer apply the workers' mean gradient, not their sum: every step runs Keras' loss on
    each worker as one process runs it, times the workers (`loss_reduction`)."""
    if world == 1:
        return
    import tensorflow as tf

    all_reduce = optimizer._all_reduce_sum_gradients

    def mean(gradient):
        if isinstance(gradient, tf.IndexedSlices):
            return tf.IndexedSlices(gradient.values / world, gradient.indices, gradient.dense_shape)
        return gradient / world

    optimizer._all_reduce_sum_gradients = lambda grads_and_vars: [(mean(g), v) for g, v in all_reduce(grads_and_vars)]


class Reducer:
    """Sums a list of NumPy arrays over all workers in one collective (every rank must call)."""

    def __init__(self, strategy: tf.distribute.Strategy):
        import tensorflow as tf

        self._strategy = strategy

        def replica_sum(flat):
            local = tf.identity(flat)  # placed on this replica's device, as all_reduce requires
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, local)

        self._run = tf.function(lambda flat: strategy.run(replica_sum, args=(flat,)))

    def gather(self, values: list[int]) -> list[list[int]]:
        """Every worker's `values` (the same length on each), by rank: one sum of rank-placed rows."""
        context = _train_context()
        table = np.zeros((context.get_world_size(), len(values)))
        table[context.get_world_rank()] = values
        return self.sum([table])[0].astype(int).tolist()

    def sum(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        if not arrays:
            return []
        shapes = [np.shape(a) for a in arrays]
        flat = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])
        total = self._strategy.experimental_local_results(self._run(flat))[0].numpy()
        out, start = [], 0
        for shape in shapes:
            size = int(np.prod(shape))
            out.append(total[start : start + size].reshape(shape))
            start += size
        return out


def _train_context():
    import ray.train

    return ray.train.get_context()

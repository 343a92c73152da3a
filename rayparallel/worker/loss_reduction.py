"""Keras' own losses on each worker's rows, reduced over the global batch.

Each worker calls the Keras `Loss` itself (`Loss.__call__`): its `call`, the Keras mask of the
predictions (`Embedding(mask_zero=True)`, `Masking`, ...), sample weights of every shape `fit`
takes and the loss's `reduction`. In one process a mean-reducing loss is the sum over the
batch's kept elements divided by their count, or by the weights' sum for
`mean_with_sample_weight`. Under a strategy Keras divides by each replica's own count and by
the replica count: a mean of per-replica means, wrong whenever the replicas keep different
counts (uneven padding). Here each worker's share is its own sum divided by the *global*
divisor, so the shares add up, in the optimizer's gradient all-reduce, to the loss of the
whole global batch, as one device computes it.

A divisor known from shapes alone (no mask, no weights in it) is scaled by global batch /
worker rows when the step is traced; one that depends on the data (a mask's count, the
weights' sum) is summed over the workers: one scalar collective per loss and step.

Every step (ours and a model's own) averages the workers' gradients (`sync.average_over_workers`),
as each worker runs Keras' step code as one process runs it: its losses are these shares times the
number of workers, whose mean is the global loss, and the regularizers (added whole on each worker)
average to themselves.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..hooks import hook

if TYPE_CHECKING:
    import keras

MEANS = ("sum_over_batch_size", "mean", "mean_with_sample_weight")

_traced = threading.local()  # (global batch, this worker's rows, workers) while one of our steps is traced


@contextlib.contextmanager
def global_batch_losses(global_batch: int, rows: int, world: int) -> Iterator[None]:
    """While a step on this worker's `rows` is traced in this block, Keras' losses compute what they
    compute in one process, over the global batch's divisors (module doc), times the `world` of workers.

    Keras scales losses by 1/replicas under `tf.distribute` (`scale_loss_for_distribution`): off. Its
    loss trackers take `unscale_loss_for_distribution(loss)` weighted by this worker's rows: scaled by
    global batch / (world x rows), so their states summed over the workers are the global batch's mean
    with uneven shards too (1 with even ones). Only in the block and on its thread (a strategy with
    several local replicas traces each in a thread of its own): the driver's checks, and another run's
    step traced later in the process, get Keras' own functions.
    """
    _install()
    before = getattr(_traced, "batches", None)
    _traced.batches = (global_batch, rows, world)
    try:
        yield
    finally:
        _traced.batches = before


def _install() -> None:
    """Keras' loss module's three functions wrapped once: in a step traced in `global_batch_losses` on this
    thread, ours; anywhere else, Keras' own."""
    from keras import ops

    module = hook("keras_losses")
    if getattr(module.reduce_weighted_values, "__wrapped__", None) is not None:
        return
    keras_reduce, keras_scale, keras_unscale = (
        module.reduce_weighted_values,
        module.scale_loss_for_distribution,
        module.unscale_loss_for_distribution,
    )

    def reduce_weighted_values(values, sample_weight=None, mask=None, reduction="sum_over_batch_size", dtype=None):
        batches = getattr(_traced, "batches", None)
        if batches is None or reduction not in (*MEANS, "sum"):
            return keras_reduce(values, sample_weight, mask, reduction, dtype)
        return _globally(keras_reduce, batches[:2], values, sample_weight, mask, reduction, dtype)

    def scale_loss_for_distribution(value):
        return keras_scale(value) if getattr(_traced, "batches", None) is None else value

    def unscale_loss_for_distribution(value):
        batches = getattr(_traced, "batches", None)
        if batches is None:
            return keras_unscale(value)
        global_batch, rows, world = batches
        tracked = global_batch / (world * rows) if rows else 1  # no row of a short last batch: the tracker adds 0
        return value if tracked == 1 else ops.multiply(value, ops.cast(tracked, value.dtype))

    for wrapper, keras_function in (
        (reduce_weighted_values, keras_reduce),
        (scale_loss_for_distribution, keras_scale),
        (unscale_loss_for_distribution, keras_unscale),
    ):
        wrapper.__wrapped__ = keras_function
        setattr(module, keras_function.__name__, wrapper)


def keras_loss(identifier: Any) -> keras.losses.Loss:
    """The `Loss` object `compile` makes of an identifier: a function is wrapped as Keras wraps it."""
    import keras

    loss = keras.losses.get(identifier)
    if loss is None or isinstance(loss, keras.losses.Loss):
        return loss
    return hook("keras_loss_function_wrapper")(loss, name=getattr(loss, "__name__", None))


def _globally(keras_reduce, batches: tuple[int, int], values, sample_weight, mask, reduction: str, dtype):
    """Keras' weighted sum of this worker's values over the global divisor, times the workers."""
    import tensorflow as tf

    if reduction == "sum":  # this worker's sum is its share of the global batch's
        share = keras_reduce(values, sample_weight, mask, reduction, dtype)
    else:
        share = _share(keras_reduce, batches, values, sample_weight, mask, reduction, dtype)
    return share * tf.distribute.get_strategy().num_replicas_in_sync


def _share(keras_reduce, batches: tuple[int, int], values, sample_weight, mask, reduction: str, dtype):
    import tensorflow as tf
    from keras import ops

    values = ops.convert_to_tensor(values, dtype=dtype)
    if values.shape.rank == 0:  # Keras leaves it as it is
        replicas = tf.distribute.get_strategy().num_replicas_in_sync  # a scalar: a mean over its rows, a share each
        return keras_reduce(values, sample_weight, mask, reduction, dtype) / replicas
    # the mask as 0/1 weights; no row (of a short last batch): Keras' "sum" gives the empty values back, so 0
    summed = ops.sum(keras_reduce(values, sample_weight, mask, "sum", dtype))
    if reduction == "mean_with_sample_weight" and (sample_weight is not None or mask is not None):
        weights = sample_weight if sample_weight is None else ops.convert_to_tensor(sample_weight, dtype=dtype)
        weights = hook("keras_apply_mask")(weights, mask, dtype=values.dtype, reduction="sum")
        _, weights = hook("keras_same_rank")(values, ops.cast(weights, values.dtype))
        divisor = _summed_over_workers(ops.sum(weights))
    elif mask is not None:  # Keras: the kept elements' count (`apply_mask`)
        divisor = _summed_over_workers(ops.sum(ops.cast(mask, values.dtype)))
    elif values.shape.is_fully_defined() and values.shape[0] == batches[1]:  # a value per row (and more): B/b times
        per_row = values.shape.num_elements() / batches[1] if batches[1] else 1  # no row: a sum of 0 over anything
        divisor = ops.cast(per_row * batches[0], values.dtype)
    else:
        divisor = _summed_over_workers(ops.cast(ops.size(values), values.dtype))
    return ops.divide_no_nan(summed, divisor)


def _summed_over_workers(value):
    import tensorflow as tf

    value = tf.stop_gradient(value)
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value
    return context.all_reduce(tf.distribute.ReduceOp.SUM, value)

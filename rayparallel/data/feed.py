"""What a worker trains on, batch by batch, wherever its rows live.

The loop sees one interface, `Feed`; four sources stand behind it:

- a plain loader's arrays (`ArrayFeed`), loaded once by the driver and put in Ray's object
  store, read by every worker of a node without a copy; each worker takes its slice of every
  global batch (`shards.worker_steps`), the last, shorter one too where the model's batch is
  free (`DataSource.last_partial`), so any worker count trains the model `fit` would;
- a rank-aware loader's rows (`ArrayFeed` over this worker's own rows): the loader was told
  the worker's `Shard` and returned only its rows;
- Ray Data (`DatasetFeed`): this worker's dataset shard, streamed (`datasets.shard_batches`);
- a loader's `tf.data.Dataset` or `keras.utils.PyDataset` (`KerasInputFeed`): every worker
  calls the loader and takes its slice of each global batch (`keras_inputs`).

`wait_s` adds up the time the loop waited for its next batch (the input pipeline's cost);
`epoch_start_waits` keeps each training epoch's wait for its first batch (a plan's start-up).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DataError
from ..spec import JobSpec, Shard
from ..spec.schema import rank_rows
from . import datasets, keras_inputs, shards
from .epoch_ahead import EpochAhead

if TYPE_CHECKING:
    import ray
    from ray.actor import ActorHandle

Batch = tuple[Any, Any, np.ndarray | None]  # x, y, sample weights (None: none, as fit passes them)


@dataclass
class DataSource:
    """What the driver hands the workers (`train_loop_config`): one of the four sources."""

    arrays: shards.Data | ray.ObjectRef | None = None  # a plain loader's arrays (launch puts them in the store)
    rank_aware: bool = False  # every worker calls the loader for its own rows
    datasets: datasets.DatasetInput | None = None  # Ray Data: the counts and columns; the plans go to Ray Train
    keras_input: bool = False  # the loader returns datasets: every worker calls it, but for served ones
    served: keras_inputs.KerasInput | None = None  # PyDatasets: their batches come from `batch_server`
    batch_server: ActorHandle | None = None  # started by the driver (`launch.shared_with_workers`)
    last_partial: bool = False  # arrays: the rows past the last full batch are a last, shorter one (as in fit)


def open_feed(
    source: DataSource, spec: JobSpec, rank: int, world: int, agree: Callable[[list[int]], list[list[int]]]
) -> Feed:
    """This worker's feed; `agree` gathers one list of figures from every worker (a collective)."""
    global_batch = spec.train.global_batch_size
    if source.datasets is not None:
        return DatasetFeed(source.datasets, global_batch, rank, world, spec.train.epochs)
    train = spec.train
    seed = [train.seed] if spec.data.layout == "shuffle" else None  # PyDatasets; streams: the order kept
    if source.batch_server is not None:
        return KerasInputFeed(source.served, train.class_weight, global_batch, rank, world, seed, source.batch_server)
    if source.keras_input:
        shard = Shard.of(rank, world, global_batch) if source.rank_aware else None
        out = shards.call_loader(spec.data, global_batch, shard)
        opened = keras_inputs.open_input(
            out, shard.batch_size if shard else global_batch, train.steps_per_epoch, train.validation_steps
        )
        if shard is not None:  # its own pipeline: every row of its batches is this worker's
            rank, world, global_batch = 0, 1, shard.batch_size  # the global batch of its own pipeline
        return KerasInputFeed(opened, train.class_weight, global_batch, rank, world, seed)
    if source.rank_aware:
        shard = Shard.of(rank, world, global_batch)
        return own_rows_feed(
            shards.load_data(spec.data, global_batch, spec.train.class_weight, shard), spec, shard, agree
        )
    import ray

    data = ray.get(source.arrays) if isinstance(source.arrays, ray.ObjectRef) else source.arrays  # zero-copy
    return ArrayFeed(data, spec.data.layout, spec.train.seed, global_batch, rank, world, source.last_partial)


class Feed:
    steps: int  # training steps per epoch, the same on every worker
    val_steps: int  # 0: no validation data
    short_last = (0, 0)  # the global rows of the last training and validation steps where shorter (0: full)
    sample_x: Any  # features of some rows, as the source gives them (a model's own step is built on them)
    sample_y: Any  # training targets of those rows (compile's loss and metrics are built on them)
    baselines: dict

    def __init__(self) -> None:
        self.wait_s = 0.0
        self.epoch_start_waits: list[float] = []

    def train(self, epoch: int) -> Iterator[Batch]:
        return self._timed(self._train(epoch), self.epoch_start_waits)

    def batch_at(self, step: int, global_batch: int, val: bool = False) -> int:
        """The global rows of step `step` (1-based) of a training (or validation) pass."""
        last, steps = (self.short_last[1], self.val_steps) if val else (self.short_last[0], self.steps)
        return last if last and step == steps else global_batch

    def rows_through(self, step: int, global_batch: int, val: bool = False) -> int:
        """The global rows of a pass's first `step` steps."""
        return (step - 1) * global_batch + self.batch_at(step, global_batch, val)

    def val(self) -> Iterator[Batch]:
        return self._timed(self._val())

    def _train(self, epoch: int) -> Iterator[Batch]:
        raise NotImplementedError

    def _val(self) -> Iterator[Batch]:
        raise NotImplementedError

    def _timed(self, batches: Iterator[Batch], first_waits: list[float] | None = None) -> Iterator[Batch]:
        while True:
            started = time.perf_counter()
            batch = next(batches, None)
            waited = time.perf_counter() - started
            self.wait_s += waited
            if first_waits is not None:
                first_waits.append(round(waited, 4))
                first_waits = None
            if batch is None:
                return
            yield batch


class ArrayFeed(Feed):
    """Arrays in memory: all rows (this worker takes its slice of each global batch) or only its own."""

    def __init__(
        self,
        data: shards.Data,
        layout: str,
        seed: int | list[int],
        global_batch: int,
        rank: int,
        world: int,
        last_partial: bool = False,
    ):
        super().__init__()
        self.data, self.layout, self.seed, self.last_partial = data, layout, seed, last_partial
        self.global_batch, self.rank, self.world = global_batch, rank, world
        self.steps = shards.steps_per_epoch(data.train.rows, global_batch, last_partial)
        self.val_steps = shards.steps_per_epoch(data.val.rows, global_batch, last_partial) if data.val else 0
        self.train_rows = min(data.train.rows, self.steps * global_batch)
        self.val_rows = min(data.val.rows, self.val_steps * global_batch) if data.val else 0
        self.short_last = (self.train_rows % global_batch, self.val_rows % global_batch)
        self.sample_x, self.sample_y, self.baselines = data.train.x, data.train.y, data.baselines

    def _train(self, epoch: int) -> Iterator[Batch]:
        order = shards.epoch_order(self.data.train.rows, epoch - 1, self.layout, self.seed)
        return shards.batches(self.data.train, self._steps(order[: self.train_rows]))

    def _val(self) -> Iterator[Batch]:
        return shards.batches(self.data.val, self._steps(np.arange(self.val_rows)))

    def _steps(self, order: np.ndarray) -> Iterator[np.ndarray]:
        return shards.worker_steps(order, self.global_batch, self.rank, self.world, self.last_partial)


def own_rows_feed(
    data: shards.Data, spec: JobSpec, shard: Shard, agree: Callable[[list[int]], list[list[int]]]
) -> Feed:
    """A rank-aware loader's rows: every worker runs as many steps as the one with the fewest.

    `agree` gathers one figure per worker (a collective). With streams each worker holds whole
    streams, so counts that differ mean the loader cut them differently: an error, not a silent cut.
    """
    # its rows as the whole data set of a one-worker run with batch b, shuffled from (seed, rank, epoch)
    feed = ArrayFeed(data, spec.data.layout, [spec.train.seed, shard.rank], shard.batch_size, 0, 1)
    counts, val_counts = zip(*agree([feed.steps, feed.val_steps]), strict=True)  # by rank
    if spec.data.layout == "streams" and len(set(counts)) > 1:
        raise DataError(
            f"data.loader: expected every worker's shard to give the same number of steps (one per t), "
            f"received {list(counts)} (by rank)"
        )
    feed.steps, feed.val_steps = min(counts), min(val_counts)
    return feed


class DatasetFeed(Feed):
    """This worker's Ray Data shards (`ray.train.get_dataset_shard`), streamed batch by batch."""

    def __init__(self, opened: datasets.DatasetInput, global_batch: int, rank: int, world: int, epochs: int):
        import ray.train

        super().__init__()
        self.opened, self.rank = opened, rank
        start, stop = rank_rows(global_batch, world, rank)
        self.streams, self.per_worker = range(start, stop), stop - start
        self.steps = opened.steps(opened.train_rows, global_batch)
        self.val_steps = opened.steps(opened.val_rows, global_batch)
        # odd epochs from one shard, even ones from the other: the next starts before this one ends
        self.shards = [ray.train.get_dataset_shard(name) for name in ("train", datasets.ALTERNATE)]
        self.val_shard = ray.train.get_dataset_shard("val") if opened.val_rows else None
        self.ahead = EpochAhead(self._epoch, epochs, self.steps)
        self.baselines = {}
        self.sample_x = datasets.features(opened.sample, opened.x)
        self.sample_y = datasets.features(opened.sample, opened.y)

    def _train(self, epoch: int) -> Iterator[Batch]:
        return self.ahead.epoch(epoch)

    def _epoch(self, epoch: int) -> Iterator[Batch]:
        shuffle = None
        if self.opened.layout == "shuffle":
            shuffle = int(np.random.default_rng([self.opened.seed, epoch, self.rank]).integers(2**31))
        shard = self.shards[(epoch - 1) % 2]
        return datasets.shard_batches(shard, self.opened, self.steps, self.per_worker, self.streams, shuffle)

    def _val(self) -> Iterator[Batch]:
        return datasets.shard_batches(self.val_shard, self.opened, self.val_steps, self.per_worker, self.streams, None)


class KerasInputFeed(Feed):
    """A loader's datasets: this worker's slice of each of their global batches, in their order."""

    def __init__(
        self,
        opened: keras_inputs.KerasInput,
        class_weight: dict | None,
        batch: int,
        rank: int,
        world: int,
        seed: list[int] | None = None,
        server: ActorHandle | None = None,
    ):
        super().__init__()
        self.opened, self.class_weight, self.batch, self.seed = opened, class_weight, batch, seed
        self.server, self.world = server, world
        self._val_passes = 0
        self.rows = slice(*rank_rows(batch, world, rank))
        self.steps = opened.train.steps
        self.val_steps = opened.val.steps if opened.val else 0
        x, y, _ = opened.train.first
        self.sample_x, self.sample_y, self.baselines = x, y, {}
        self._train_batches: Iterator | None = None  # read on across epochs (train.steps_per_epoch)

    def _train(self, epoch: int) -> Iterator[Batch]:
        split = self.opened.train
        if self._train_batches is None or not split.read_on:
            first_pass = 0 if split.read_on else epoch - 1
            self._train_batches = keras_inputs.global_batches(
                split, "train", first_pass, self._seed(epoch), self.server, self.world
            )
            if split.read_on:  # a restarted run goes on where the epochs before it stopped
                for _ in keras_inputs.epoch_batches(self._train_batches, (epoch - 1) * self.steps, self.batch):
                    pass
        for batch in keras_inputs.epoch_batches(self._train_batches, self.steps, self.batch):
            yield self._mine(batch, self.class_weight)

    def _seed(self, epoch: int) -> list[int] | None:
        """Read on across epochs: one seed for all passes; else each epoch's own."""
        if self.seed is None:
            return None
        return self.seed if self.opened.train.read_on else [*self.seed, epoch]

    def _val(self) -> Iterator[Batch]:
        self._val_passes += 1
        batches = keras_inputs.global_batches(self.opened.val, "val", self._val_passes, None, self.server, self.world)
        for batch in keras_inputs.epoch_batches(batches, self.val_steps, self.batch):
            yield self._mine(batch, None)

    def _mine(self, batch: tuple, class_weight: dict | None) -> Batch:
        x, y, w = (shards.take(part, self.rows) if part is not None else None for part in batch)
        if class_weight is not None:
            w = shards.class_weights(y, class_weight)
        return x, y, None if w is None else np.asarray(w, "float32")

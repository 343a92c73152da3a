"""Row ownership: which rows each worker gets, step by step (pure NumPy)."""

from __future__ import annotations

import numpy as np
import pytest

from rayparallel.data.shards import (
    Split,
    batches,
    class_weights,
    epoch_order,
    global_batch_at,
    steps_per_epoch,
    worker_rows,
    worker_steps,
)
from rayparallel.errors import DataError


def test_streams_each_worker_owns_a_fixed_ordered_slice_of_streams():
    batch, workers, steps = 8, 2, 5
    order = epoch_order(batch * steps + 3, epoch=4, layout="streams", seed=0)  # 3 rows of remainder dropped
    for rank in range(workers):
        rows = worker_rows(order, batch, rank, workers).reshape(steps, batch // workers)
        streams = rows % batch
        assert (streams == np.arange(rank * 4, rank * 4 + 4)).all()  # same streams every step
        assert (rows[:, 0] == np.arange(steps) * batch + rank * 4).all()  # in time order


def test_workers_partition_each_global_batch_without_overlap():
    order = epoch_order(48, epoch=1, layout="shuffle", seed=3)
    parts = [worker_rows(order, 12, r, 3) for r in range(3)]
    assert all(len(p) == 16 for p in parts)
    for step in range(4):
        joined = np.concatenate([p[step * 4 : (step + 1) * 4] for p in parts])
        assert (joined == order[step * 12 : (step + 1) * 12]).all()


def test_shuffle_is_seeded_per_epoch_and_identical_everywhere():
    a = epoch_order(100, epoch=0, layout="shuffle", seed=1)
    assert (a == epoch_order(100, epoch=0, layout="shuffle", seed=1)).all()
    assert not (a == epoch_order(100, epoch=1, layout="shuffle", seed=1)).all()
    assert sorted(a) == list(range(100))


def test_batches_feed_each_worker_its_rows_in_step_order_for_every_input():
    x = {"a": np.arange(20) * 10, "b": np.arange(20) * 100}
    split = Split(x=x, y=np.arange(20))
    order = epoch_order(20, epoch=2, layout="shuffle", seed=5)
    rows = worker_rows(order, 8, rank=1, num_workers=2)  # 2 steps x 4
    fed = list(batches(split, worker_steps(order, 8, rank=1, num_workers=2)))
    assert len(fed) == 2
    for step, (xb, yb, wb) in enumerate(fed):
        expected = rows[step * 4 : (step + 1) * 4]
        assert (yb == expected).all() and (xb["a"] == expected * 10).all() and (xb["b"] == expected * 100).all()
        assert wb is None  # no weights: none, as fit passes none to the loss
    weighted = Split(x=x, y=np.arange(20), w=np.arange(20, dtype="float32") / 2)
    for _, yb, wb in batches(weighted, worker_steps(order, 8, rank=1, num_workers=2)):
        assert (wb == yb / 2).all()  # each row keeps its own weight
    per_token = Split(x=x, y=np.arange(20), w=np.arange(60, dtype="float32").reshape(20, 3))
    for _, yb, wb in batches(per_token, worker_steps(np.arange(20), 5, rank=0, num_workers=1)):
        assert wb.shape == (5, 3) and (wb[:, 0] == yb * 3).all()  # a weight per token stays with its row


def test_a_last_shorter_batch_is_split_across_the_workers_as_fit_would_take_its_rows():
    """57 rows, global batch 8: 7 full steps and an eighth of 1 row, which rank 0 takes (ranks 1 and 2 none);
    without `last_partial` the row is left out and every step is full."""
    order = epoch_order(57, epoch=0, layout="shuffle", seed=2)
    assert steps_per_epoch(57, 8, last_partial=True) == 8 and steps_per_epoch(57, 8) == 7
    assert [global_batch_at(step, 57, 8) for step in (1, 7, 8)] == [8, 8, 1]
    steps = [list(worker_steps(order, 8, rank, 3, last_partial=True)) for rank in range(3)]
    assert [len(rows) for rows in steps[0]] == [3] * 7 + [1] and len(steps[2][-1]) == 0
    for step in range(8):  # each global batch once, in the epoch's order, split in rank order
        joined = np.concatenate([ranks[step] for ranks in steps])
        assert (joined == order[step * 8 : (step + 1) * 8]).all()
    assert [len(list(worker_steps(order, 8, rank, 3))) for rank in range(3)] == [7, 7, 7]


def test_class_weights_by_label_as_keras_fit_makes_them():
    weights = {0: 1.0, 2: 5.0}
    assert class_weights(np.array([0, 1, 2, 2]), weights).tolist() == [1.0, 1.0, 5.0, 5.0]  # missing: 1.0
    assert class_weights(np.array([[0], [2]]), weights).tolist() == [1.0, 5.0]
    assert class_weights(np.eye(3)[[2, 0, 1]], weights).tolist() == [5.0, 1.0, 1.0]  # one-hot: argmax
    with pytest.raises(DataError, match=r"train.class_weight: expected keys among the labels 0..2, received \['3'\]"):
        class_weights(np.array([0, 1, 2]), {0: 1.0, 3: 2.0})
    with pytest.raises(DataError, match=r"expected class labels \(n,\) or one-hot targets \(n, classes\), received"):
        class_weights(np.zeros((4, 5, 1)), weights)


def test_uneven_worker_counts_own_fixed_streams_and_cover_each_batch_once():
    batch, workers, steps = 16, 3, 4
    order = epoch_order(batch * steps, epoch=0, layout="streams", seed=0)
    owned = []
    for rank, size in enumerate((6, 5, 5)):
        rows = worker_rows(order, batch, rank, workers).reshape(steps, size)
        assert (rows % batch == rows[0] % batch).all()  # the same streams every step, in time order
        owned.append(rows[0] % batch)
    assert np.concatenate(owned).tolist() == list(range(batch))  # every stream once, in rank order


class _StoredStream:
    """One stream's rows as Ray Data's iterator hands them: dicts of columns, `batch_size` rows at a time."""

    def __init__(self, stream: int, steps: int):
        self.columns = {"stream": np.full(steps, stream), "t": np.arange(steps), "x": np.arange(steps) * 10 + stream}

    def iter_batches(self, batch_size: int, batch_format: str):
        rows = len(self.columns["t"])
        for start in range(0, rows, batch_size):
            yield {name: column[start : start + batch_size] for name, column in self.columns.items()}


def test_stream_major_rows_step_in_lockstep_across_chunks():
    from rayparallel.data.datasets import lockstep

    steps = list(lockstep([_StoredStream(s, 7) for s in (2, 3, 4)], chunk_rows=3))  # chunks of 3, 3, 1 rows
    assert len(steps) == 7
    for t, batch in enumerate(steps):
        assert batch["stream"].tolist() == [2, 3, 4] and batch["t"].tolist() == [t] * 3
        assert batch["x"].tolist() == [t * 10 + 2, t * 10 + 3, t * 10 + 4]
    short = [_StoredStream(0, 7), _StoredStream(1, 5)]
    assert len(list(lockstep(short, chunk_rows=3))) == 5  # a short stream ends them all: shard_batches says so


def test_a_streams_dataset_is_t_major_or_stream_major_from_its_first_rows():
    from rayparallel.data.datasets import STREAM_MAJOR, T_MAJOR, stored_order

    def rows(stream, t):
        return {"stream": np.array(stream), "t": np.array(t)}

    assert stored_order(rows([0, 1, 2, 3], [0] * 4), "data.dataset", 4) == T_MAJOR
    assert stored_order(rows([0, 0, 0, 0], [0, 1, 2, 3]), "data.dataset", 4) == STREAM_MAJOR
    assert stored_order(rows([0, 0, 1, 1], [0, 1, 0, 1]), "data.dataset", 4) == STREAM_MAJOR  # streams of 2 rows
    for stream, t in (([1, 0, 2, 3], [0] * 4), ([0, 0, 0, 0], [0, 2, 1, 3]), ([0, 0, 1, 1], [0, 1, 1, 2])):
        with pytest.raises(DataError, match=r"^data.dataset: expected rows stored t-major .* or stream-major") as e:
            stored_order(rows(stream, t), "data.dataset", 4)
        assert "\n" not in str(e.value)

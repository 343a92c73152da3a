"""Row ownership: which rows each worker gets, step by step (pure NumPy)."""

from __future__ import annotations

import numpy as np

from rayparallel.worker.shards import epoch_order, worker_rows


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
        joined = np.concatenate([p[step * 4:(step + 1) * 4] for p in parts])
        assert (joined == order[step * 12:(step + 1) * 12]).all()


def test_shuffle_is_seeded_per_epoch_and_identical_everywhere():
    a = epoch_order(100, epoch=0, layout="shuffle", seed=1)
    assert (a == epoch_order(100, epoch=0, layout="shuffle", seed=1)).all()
    assert not (a == epoch_order(100, epoch=1, layout="shuffle", seed=1)).all()
    assert sorted(a) == list(range(100))

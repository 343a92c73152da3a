"""A loader's `keras.utils.PyDataset`, each global batch loaded once for all workers, ahead of their steps.

Running the user's loading on every worker and keeping 1/N of it (what tf.distribute's DATA
auto-shard does) multiplies decoding by N. Instead one actor on the driver's node holds the
dataset; every worker asks it for the same batches in the same order (a few steps ahead),
the first request of a batch starts its load in the actor's thread pool (so several load in
parallel, as `PyDataset(workers=...)` would), and the loaded batch is kept until every
worker has fetched it. Each worker then takes its own rows of it.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray.actor import ActorHandle

# requests a worker keeps in flight: the batches of its next steps load while it trains
AHEAD = 3

Key = tuple[str, int, int, bool]  # split, pass, batch index, last batch of its pass


class BatchServer:
    """The PyDatasets by split (`train`, `val`); run as a threaded Ray actor (`start_batch_server`)."""

    def __init__(self, datasets: dict[str, Any], threads: int):
        self._datasets = datasets
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="rayparallel-batches")
        self._lock = threading.Lock()
        self._loading: dict[Key, Future] = {}
        self._served: Counter = Counter()
        self.loads = 0

    def batch(self, key: Key, workers: int) -> Any:
        """Batch `key` (loaded once, whoever asks first); forgotten once `workers` have fetched it."""
        with self._lock:
            future = self._loading.get(key)
            if future is None:
                future = self._loading[key] = self._pool.submit(self._load, key)
        result = future.result()
        with self._lock:
            self._served[key] += 1
            if self._served[key] >= workers:
                self._loading.pop(key, None)
                del self._served[key]
                pass_read(self._datasets[key[0]], key)  # once every worker has its last batch
        return result

    def load_count(self) -> int:
        """Calls of the datasets' `__getitem__` so far (benchmarks.keras_inputs)."""
        return self.loads

    def _load(self, key: Key) -> Any:
        split, _, index, _ = key
        self.loads += 1
        return self._datasets[split][index]


def pass_read(dataset: Any, key: tuple) -> None:
    """After the last batch of a pass (`keras_inputs.batch_keys`), the PyDataset's `on_epoch_end`, as fit calls it."""
    if key[3] and hasattr(dataset, "on_epoch_end"):
        dataset.on_epoch_end()


def start_batch_server(datasets: dict[str, Any]) -> ActorHandle:
    """On this node, without a CPU of its own (the workers hold them); loads as `workers=` asks, at least 2."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    threads = max(2, max(getattr(d, "workers", 1) for d in datasets.values()))
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    actor = ray.remote(BatchServer).options(num_cpus=0, max_concurrency=64, scheduling_strategy=here)
    return actor.remote(datasets, threads)


def served(server: ActorHandle, keys: Iterator[Key], workers: int) -> Iterator[Any]:
    """The batches of `keys` in order, `AHEAD` requests in flight."""
    import ray

    pending = [server.batch.remote(key, workers) for key in itertools.islice(keys, AHEAD)]
    while pending:
        ref = pending.pop(0)
        following = next(keys, None)
        if following is not None:
            pending.append(server.batch.remote(following, workers))
        yield ray.get(ref)

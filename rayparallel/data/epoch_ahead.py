"""Ray Data's next epoch started before this one ends, so its plan's start-up hides behind the last steps.

Every epoch through Ray Data is a new execution of the plan: listing files, read tasks, Ray
Train's split, the first blocks. That takes seconds before the first batch, and the workers
would wait for it at every epoch's start. Epochs alternate between two shards of the same
dataset (`datasets.ALTERNATE`, each with its own split coordinator: a split cannot start its
next epoch before every worker has finished the one in progress), so epoch e+1's execution
can begin on the other shard while epoch e is still training. It begins when the steps left
would take about as long as a plan's start-up (the first epoch's wait for its first batch,
the slowest start: later ones, opened ahead, compete with the steps for the CPUs and would
only look slower), in a thread that fetches the first batch; the epoch's own code runs
unchanged. Two plans run side by side for that while: a worker holds the blocks of both then.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

LEAD = 1.5  # open the next epoch this many first start-ups before this one's end


class EpochAhead:
    """Training batches epoch after epoch, each next epoch opened while the one before runs its last steps."""

    def __init__(self, open_epoch: Callable[[int], Iterator[Any]], epochs: int, steps: int):
        self.open_epoch, self.epochs, self.steps = open_epoch, epochs, steps
        self.start_up_s: float | None = None  # the first epoch's wait for its first batch
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rayparallel-epoch-ahead")
        self._next: tuple[int, Iterator[Any], Future] | None = None

    def epoch(self, epoch: int) -> Iterator[Any]:
        """Epoch `epoch`'s batches: opened ahead by the epoch before, or now."""
        started = time.perf_counter()
        ahead, self._next = self._next, None
        if ahead is not None and ahead[0] == epoch:
            batches, batch = ahead[1], ahead[2].result()  # the wait for the plan's start-up, if any is left
        else:
            batches = self.open_epoch(epoch)
            batch = next(batches, None)
        if self.start_up_s is None:
            self.start_up_s = time.perf_counter() - started
        step_started = time.perf_counter()
        step = 0
        while batch is not None:
            step += 1
            if self._next is None and epoch < self.epochs and self._due(step, time.perf_counter() - step_started):
                self._open_ahead(epoch + 1)
            yield batch
            batch = next(batches, None)

    def _due(self, step: int, seconds: float) -> bool:
        """True when the steps after this one would take about LEAD x the first start-up, or this is the last.

        `seconds` went to the `step - 1` steps before this one (the first one's trace included).
        """
        left, done = self.steps - step, step - 1
        return left <= 0 or (done > 0 and left * seconds / done <= LEAD * (self.start_up_s or 0.0))

    def _open_ahead(self, epoch: int) -> None:
        batches = self.open_epoch(epoch)
        self._next = (epoch, batches, self._pool.submit(next, batches, None))

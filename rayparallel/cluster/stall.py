"""Say why a run makes no progress, within a minute, instead of a console that says nothing.

A run that waits (for the cluster's resources, its input, a peer) looks from the console like
one that works: nothing moves. The driver watches the signs of life the recorder passes on
(rank 0's start-up phases, progress, epochs) and after `run.stall_warning_s` without one says
what the run was doing when it stopped moving, again every `run.stall_warning_s`. It only
speaks: the step watchdog (`run.collective_timeout_s`) stays what fails a run.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from ..recorder.events import EpochEnded, Event, PhaseReached, Progress

# The last start-up phase rank 0 reached -> what the run is waiting for (`rayparallel.startup.PHASES`)
WAITING = {
    "workers_started": "rank 0 is importing TensorFlow",
    "tensorflow_imported": "the workers are connecting (MultiWorkerMirroredStrategy): a peer has not started",
    "strategy_ready": "rank 0 is loading its data (a loader's rows, or a dataset's first batch)",
    "data_loaded": "rank 0 is building the replica",
    "replica_built": "rank 0 is tracing the first step",
    "first_step_traced": "rank 0 is in its first step: waiting for input or for a peer in the gradient all-reduce",
    "first_step_done": "no step since the first: waiting for input or for a peer in the gradient all-reduce",
}


class StallWatch:
    """`saw` every event the driver drains; `warning()` is the line to show when the run has stalled.

    >>> clock = iter([0.0, 61.0, 62.0, 130.0]).__next__
    >>> watch = StallWatch(60, lambda: "2 workers x 1 CPU, 0 CPU free", clock)
    >>> print(watch.warning())  # 61 s without a sign of life: what the run waits for
    no progress for 61 s: the worker group has not started (2 workers x 1 CPU, 0 CPU free): Ray is still starting it, or waiting for the cluster's resources
    >>> watch.warning() is None, watch.warning() is not None  # once every 60 s
    (True, True)
    """

    def __init__(self, every_s: float, resources: Callable[[], str], clock: Callable[[], float] = time.monotonic):
        self.every_s = every_s
        self._resources = resources  # what the workers need and the cluster has: asked only when needed
        self._clock = clock
        self._phase: str | None = None
        self._where: str | None = None  # the newest step or epoch seen
        self._last = clock()
        self._warned: float | None = None

    def saw(self, event: Event) -> None:
        if isinstance(event, PhaseReached):  # a start-up, or a restarted worker group's: its phase says more
            self._phase, self._where = event.phase, None
        elif isinstance(event, Progress):
            self._where = f"epoch {event.epoch} step {event.step}/{event.steps}"
        elif isinstance(event, EpochEnded):
            self._where = f"the end of epoch {event.epoch}"
        else:
            return
        self._last, self._warned = self._clock(), None

    def warning(self) -> str | None:
        if not self.every_s:
            return None
        now = self._clock()
        quiet = now - self._last
        if quiet < self.every_s or (self._warned is not None and now - self._warned < self.every_s):
            return None
        self._warned = now
        if self._where:
            waiting = (
                f"no step finished since {self._where}: waiting for input or for a peer in the gradient all-reduce"
            )
        elif self._phase in WAITING:
            waiting = WAITING[self._phase]
        else:
            waiting = (
                f"the worker group has not started ({self._resources()}): Ray is still starting it, or waiting for "
                "the cluster's resources"
            )
        return f"no progress for {quiet:.0f} s: {waiting}"


@contextlib.contextmanager
def warned_while(waiting: str, every_s: float, say: Callable[[str], None]) -> Iterator[None]:
    """Say every `every_s` that the block still waits for `waiting`: the driver's own waits before the
    worker group (the job's checks call the data function and read a Ray Data job's first batch).

    >>> said = []
    >>> with warned_while("the checks are reading data.dataset's first batch", 0.01, said.append):
    ...     while len(said) < 2:  # a block that takes 2 intervals
    ...         time.sleep(0.001)
    >>> print(said[0])
    WARNING no progress for 0 s: the checks are reading data.dataset's first batch
    """
    if not every_s:
        yield
        return
    started, done = time.monotonic(), threading.Event()

    def warn() -> None:
        while not done.wait(every_s):
            say(f"WARNING no progress for {time.monotonic() - started:.0f} s: {waiting}")

    thread = threading.Thread(target=warn, name="rayparallel-stall", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()

"""Rank 0's side of checkpointing: hand the weights (or a resume point) over and keep training.

The training loop only pays for a snapshot of the weights (tensors that later steps do not
change, taken by the worker's resume module). Converting them to NumPy, copying them into Ray's
object store and calling the actor happen in one background thread, and the actor writes
the file in its own process. At most
`max_pending` saves are in flight: beyond that the loop waits for the oldest, so a slow disk
cannot pile copies of the model up in memory. A failed write surfaces here, at the next
save or at `flush`, as the actor's one-line error.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import ray

from .policy import Saved

if TYPE_CHECKING:
    from ray.actor import ActorHandle


class CheckpointClient:
    def __init__(self, actor: ActorHandle, max_pending: int = 2):
        self._actor, self._max_pending = actor, max_pending
        self._sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rayparallel-ckpt")
        self._pending: list[Future] = []
        self._last: ray.ObjectRef | None = None  # the newest call handed to the actor

    def save(self, weights: list, saved: Saved) -> None:
        """Returns at once; `weights` are tensors or arrays that nothing modifies afterwards."""
        self._hand_over(self._send, weights, saved)

    def save_resume_point(self, arrays: dict, meta: dict) -> None:
        """The same for a resume point inside an epoch (`arrays`: name -> tensor or array)."""
        self._hand_over(self._send_resume_point, arrays, meta)

    def _hand_over(self, send, *args) -> None:
        self._pending.append(self._sender.submit(send, *args))
        while self._pending and self._done(self._pending[0]):
            self._wait(self._pending.pop(0))  # raises a failed write's error
        while len(self._pending) > self._max_pending:
            self._wait(self._pending.pop(0))

    def flush(self, raise_errors: bool = True) -> None:
        pending, self._pending = self._pending, []
        for future in pending:
            try:
                self._wait(future)
            except Exception:
                if raise_errors:
                    raise

    def _send(self, weights: list, saved: Saved) -> ray.ObjectRef:
        arrays = [np.asarray(w) for w in weights]
        return self._in_order(lambda: self._actor.save_checkpoint.remote(arrays, saved))

    def _send_resume_point(self, arrays: dict, meta: dict) -> ray.ObjectRef:
        arrays = {k: np.asarray(v) for k, v in arrays.items()}
        return self._in_order(lambda: self._actor.save_resume_point.remote(arrays, meta))

    def _in_order(self, call) -> ray.ObjectRef:
        """One call at a time: Ray runs a threaded actor's calls in any order, and files (and their warnings)
        must follow the epochs. The actor writes one file at a time anyway (its `io` group)."""
        if self._last is not None:
            ray.wait([self._last], timeout=None)
        self._last = call()
        return self._last

    @staticmethod
    def _done(future: Future) -> bool:
        if not future.done():
            return False
        ready, _ = ray.wait([future.result()], timeout=0)
        return bool(ready)

    @staticmethod
    def _wait(future: Future) -> None:
        ray.get(future.result())

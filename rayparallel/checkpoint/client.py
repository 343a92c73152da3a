"""Rank 0's side of checkpointing: hand the weights over and keep training.

`save` returns as soon as the weights are in Ray's object store; the actor writes them in
its own thread. At most `max_pending` saves are in flight: beyond that the loop waits for the
oldest, so a slow disk cannot pile copies of the model up in memory. A failed write
surfaces here, at the next save or at `flush`, as the actor's one-line error.
"""

from __future__ import annotations

from typing import Any

import ray


class CheckpointClient:
    def __init__(self, actor: Any, max_pending: int = 2):
        self._actor, self._max_pending = actor, max_pending
        self._pending: list = []

    def save(self, weights: list, epoch: int, step: int, batch: int, metrics: dict) -> None:
        self._pending.append(self._actor.save_checkpoint.remote(weights, epoch, step, batch, metrics))
        done, self._pending = ray.wait(self._pending, num_returns=len(self._pending), timeout=0)
        ray.get(done)  # raises a failed write's error
        while len(self._pending) > self._max_pending:
            ray.get(self._pending.pop(0))

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        ray.get(pending)

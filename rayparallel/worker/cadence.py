"""When the workers pause together to reduce the running loss for the console.

Each pause is a collective (every rank takes part), so when it happens must be decided
the same way on every rank: from the step count and from global figures only. With
`train.progress_every_n_steps: 0` (the default) the pauses come about ten times per epoch,
but no closer than `min_seconds` apart, judged by rank 0's time per step, which every rank
learns from the previous pause. On short steps this keeps the pauses from costing
throughput; `progress_every_n_steps: N` pauses every N steps exactly.
"""

from __future__ import annotations

import math


class ProgressCadence:
    def __init__(self, steps_per_epoch: int, every_n_steps: int = 0, min_seconds: float = 2.0):
        self.steps_per_epoch, self.every_n_steps, self.min_seconds = steps_per_epoch, every_n_steps, min_seconds
        self.seconds_per_step: float | None = None  # rank 0's, as of the last pause (same on every rank)
        self._last = self._next = 0

    def start_epoch(self) -> None:
        self._last, self._next = 0, self._stride()

    def due(self, step: int) -> bool:
        """True at the steps where every rank pauses (never at the epoch's last step)."""
        if step != self._next:
            return False
        self._last, self._next = step, step + self._stride()
        return step < self.steps_per_epoch

    def observe(self, seconds: float, steps: int) -> None:
        """Rank 0's seconds for the epoch's first `steps` steps, as reduced at a pause."""
        if seconds > 0 and steps > 0:
            self.seconds_per_step = seconds / steps
            self._next = self._last + self._stride()

    def _stride(self) -> int:
        if self.every_n_steps:
            return self.every_n_steps
        stride = max(1, self.steps_per_epoch // 10)
        if self.seconds_per_step:
            stride = max(stride, math.ceil(self.min_seconds / self.seconds_per_step))
        return stride

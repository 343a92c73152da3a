"""Whether the run ends early, decided once per epoch so every rank leaves after the same one."""

from __future__ import annotations

import threading


class StopArbiter:
    """A callback's reason (the same on every rank) or the driver's request (a Tune scheduler's),
    answered alike to every rank: the first rank's question for an epoch fixes the answer."""

    def __init__(self, epochs: int):
        self._epochs = epochs
        self._lock = threading.Lock()
        self._requested: str | None = None
        self._answers: dict[int, str | None] = {}
        self.stopped: dict | None = None  # the epoch the run ended after, and why

    def request(self, reason: str) -> None:
        """End after the epoch in progress; the first reason given stands."""
        with self._lock:
            self._requested = self._requested or reason

    def after(self, epoch: int, reason: str | None = None) -> str | None:
        with self._lock:
            if epoch not in self._answers:  # after the last epoch a stop changes nothing
                wanted = reason or self._requested
                self._answers[epoch] = wanted if epoch < self._epochs else None
                if self._answers[epoch] and self.stopped is None:
                    self.stopped = {"epoch": epoch, "reason": self._answers[epoch]}
            return self._answers[epoch]

    def state(self) -> dict:
        """What a restarted recorder needs to go on (see `recorder.journal`)."""
        with self._lock:
            return {"requested": self._requested, "answers": list(self._answers.items()), "stopped": self.stopped}

    def restore(self, state: dict) -> None:
        with self._lock:
            self._requested, self.stopped = state["requested"], state["stopped"]
            self._answers = {int(epoch): answer for epoch, answer in state["answers"]}

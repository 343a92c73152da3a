"""What the driver shows of a run: progress events in arrival order, drained by its console."""

from __future__ import annotations

import threading


class EventLog:
    """Events appended from any of the actor's threads, taken out by the driver in order."""

    def __init__(self):
        self._lock = threading.Lock()
        self._events: list[dict] = []

    def add(self, kind: str, **fields) -> None:
        with self._lock:
            self._events.append({"kind": kind, **fields})

    def drain(self) -> list[dict]:
        with self._lock:
            events, self._events = self._events, []
        return events


class EpochHistory:
    """Each epoch's global logs, once: an epoch trained again after a restart has the same figures."""

    def __init__(self):
        self._lock = threading.Lock()
        self._logs: dict[int, dict] = {}

    def record(self, epoch: int, logs: dict) -> bool:
        """Keep the epoch's logs; True the first time the epoch is seen."""
        with self._lock:
            new = epoch not in self._logs
            self._logs[epoch] = dict(logs)
        return new

    def restore(self, history: list[dict]) -> None:
        """Epochs completed before a restart (from the resume checkpoint)."""
        with self._lock:
            for epoch, logs in enumerate(history, start=1):
                self._logs.setdefault(epoch, dict(logs))

    def as_list(self) -> list[dict]:
        with self._lock:
            return [self._logs[e] for e in sorted(self._logs)]

"""What the driver shows of a run: progress events in arrival order, drained by its console.

Each kind of event is its own frozen dataclass: they cross from the recorder actor (and Ray
Train's controller) to the driver, where a misspelt field fails when the event is made, not
when the console reads it.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray.actor import ActorHandle


@dataclass(frozen=True)
class Progress:
    """Rank 0's view of the running epoch; `seconds` since it began (for the console's ETA)."""

    epoch: int
    step: int
    steps: int
    loss: float
    samples_per_s: float
    seconds: float = 0.0


@dataclass(frozen=True)
class EpochEnded:
    epoch: int
    logs: dict
    seconds: float


@dataclass(frozen=True)
class CheckpointWritten:
    epoch: int
    file: str


@dataclass(frozen=True)
class PhaseReached:
    """Rank 0 reached a start-up phase (`rayparallel.startup.PHASES`): a sign of life before the first step."""

    phase: str


@dataclass(frozen=True)
class RunWarning:
    text: str


def warning_key(text: str) -> str:
    """A warning without its numbers, so that "spilled 12 MiB" and "spilled 40 MiB" are shown once.

    >>> warning_key("Spilled 12 MiB, 3 objects") == warning_key("Spilled 40 MiB, 9 objects")
    True
    """
    return re.sub(r"\d+(\.\d+)?", "N", text)


@dataclass(frozen=True)
class Resized:
    """A worker group restarted with another size (`WorkerRegistry.register`'s record of it)."""

    resize: dict


@dataclass(frozen=True)
class TrackingStarted:
    """The MLflow run exists: where it is (`MlflowRecord.announcement`)."""

    info: dict


@dataclass(frozen=True)
class ControllerStarted:
    """Ray Train's controller, which has no other way to the driver, hands over its handle."""

    handle: ActorHandle


Event = (
    Progress
    | EpochEnded
    | CheckpointWritten
    | PhaseReached
    | RunWarning
    | Resized
    | TrackingStarted
    | ControllerStarted
)


class EventLog:
    """Events appended from any of the actor's threads, taken out by the driver in order."""

    def __init__(self):
        self._lock = threading.Lock()
        self._events: list[Any] = []

    def add(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)

    def drain(self) -> list[Event]:
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

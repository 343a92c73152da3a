"""Who trains: every rank of every worker group, the group's size and the resizes between groups."""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, replace
from typing import Any

from ..result import WorkerInfo


class WorkerRegistry:
    """Ranks register as each worker group starts; a group of another size than the last is a resize."""

    def __init__(self, batch_split: Any):
        self._batch_split = batch_split  # world size -> per-worker batch (JobSpec.batch_split)
        self._lock = threading.Lock()
        self._workers: dict[int, WorkerInfo] = {}
        self._world: int | None = None  # the live worker group's size
        self.resizes: list[dict] = []
        self._failure: str | None = None  # why the live group failed, as one of its workers saw it

    def register(self, info: WorkerInfo) -> tuple[dict | None, bool, bool]:
        """(the resize this rank's group is, if any; whether the group's size changed; whether every rank is in)."""
        world = info.world
        resize = None
        with self._lock:
            changed = world != self._world
            if changed and self._world is not None:
                resize = {
                    "at": time.time(),
                    "from": self._world,
                    "to": world,
                    "epoch": info.resumed_from_epoch + 1,
                    "step": info.resumed_from_step,
                    "batch_from": self._batch_split(self._world),
                    "batch_to": self._batch_split(world),
                    "first_step_at": None,  # when the new group's rank 0 finished its first step
                }
                self.resizes.append(resize)
            if changed:
                self._world = world
                self._workers = {rank: w for rank, w in self._workers.items() if rank < world}
            self._workers[info.rank] = info
            self._failure = None  # a new group: an earlier one's failure is not this one's
            return resize, changed, len(self._workers) == world

    def update(self, rank: int, **end: Any) -> None:
        """A rank's figures at the end of training (`WorkerInfo`'s last fields)."""
        with self._lock:
            if rank in self._workers:  # a rank of the live group: it registered as the group started
                self._workers[rank] = replace(self._workers[rank], **end)

    def first_step_done(self, at: float) -> None:
        """The newest group's rank 0 finished its first step (the end of a resize)."""
        with self._lock:
            if self.resizes and self.resizes[-1]["first_step_at"] is None:
                self.resizes[-1]["first_step_at"] = at

    def note_failure(self, rank: int, reason: str) -> None:
        """A worker's own word on why it is about to fail; the first stands."""
        with self._lock:
            self._failure = self._failure or f"rank {rank}: {reason}"

    @property
    def failure(self) -> str | None:
        return self._failure

    def workers(self) -> list[WorkerInfo]:
        with self._lock:
            return [self._workers[r] for r in sorted(self._workers)]

    def state(self) -> dict:
        """What a restarted recorder needs to go on (see `recorder.journal`)."""
        with self._lock:
            workers = [asdict(w) for w in self._workers.values()]
            return {"workers": workers, "world": self._world, "resizes": list(self.resizes)}

    def restore(self, state: dict) -> None:
        with self._lock:
            self._workers = {w["rank"]: WorkerInfo(**w) for w in state["workers"]}
            self._world, self.resizes = state["world"], list(state["resizes"])

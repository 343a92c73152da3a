"""One serving replica: S slots of the model, and the loop that steps them.

Requests only queue a window (after taking or checking the stream's slot); one loop takes, at every
step, the oldest waiting window of each stream that has one, runs them as one model step in a thread of
its own (so HTTP stays served), and answers them. A stream's windows are therefore stepped in the order
it sent them, one per step, and no other slot's state moves (`SlotModel`). A slot's state starts from
zero at the step of the window that started the stream, and the slot is freed once its last window
(`sequence_end`) is answered.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .slots import NotStarted, SlotsFull, SlotTable

if TYPE_CHECKING:
    from ..spec import ModelSpec

logger = logging.getLogger("ray.serve")


@dataclass
class Waiting:
    slot: int
    window: np.ndarray
    start: bool
    end: bool
    answer: asyncio.Future


class StreamReplica:
    """A Ray Serve deployment's replica (`app.build` makes it one): `infer` answers one window of a stream."""

    def __init__(
        self,
        recipe: ModelSpec,
        weights: Any,
        search_path: list[str],
        slots: int,
        idle_timeout_s: float,
        slot_wait_s: float,
    ):
        from ..inference.batches import built_model
        from .slot_model import SlotModel

        self.model = SlotModel(built_model(recipe, weights, search_path, slots))
        self.table = SlotTable(slots, idle_timeout_s)
        self.slot_wait_s = slot_wait_s
        self.waiting: dict[Hashable, deque[Waiting]] = {}
        self.stepper = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rayparallel-step")
        self.wake: asyncio.Event | None = None
        self.replica = _replica_id()
        logger.info(f"rayparallel serve: replica up with {slots} slots, idle timeout {idle_timeout_s:g} s")

    async def infer(self, stream: Hashable, start: bool, end: bool, window: np.ndarray) -> tuple[int, Any, str]:
        """(200, the outputs by name, this replica's id), or (status, one line, id): 400 for a stream that
        holds no slot, 503 when every slot stayed taken for `slot_wait_s`."""
        if self.wake is None:  # the loop lives in the replica's event loop, started with its first request
            self.wake = asyncio.Event()
            asyncio.get_running_loop().create_task(self._steps())
        try:
            slot = await self._slot(stream, start)
        except NotStarted as exc:
            return 400, str(exc), self.replica
        except SlotsFull as exc:
            wanted = f"a free slot within {self.slot_wait_s:g} s"
            return 503, f"sequence_start: expected {wanted}, received none ({exc} of this replica)", self.replica
        answer = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(stream, deque()).append(Waiting(slot, window, start, end, answer))
        self.wake.set()
        return 200, await answer, self.replica

    async def _slot(self, stream: Hashable, start: bool) -> int:
        deadline = asyncio.get_running_loop().time() + self.slot_wait_s
        while True:
            try:
                return self.table.take(stream, start)[0]
            except SlotsFull:
                if asyncio.get_running_loop().time() >= deadline:
                    raise
                await asyncio.sleep(0.01)

    async def _steps(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.waiting:
                heads = {stream: queue.popleft() for stream, queue in self.waiting.items()}
                self.waiting = {stream: queue for stream, queue in self.waiting.items() if queue}
                try:
                    outputs = await loop.run_in_executor(self.stepper, self._step, list(heads.values()))
                except Exception as exc:  # the model failed: every window of the step hears why
                    for head in heads.values():
                        head.answer.set_exception(exc)
                    continue
                for stream, head in heads.items():
                    head.answer.set_result(outputs[head.slot])
                    if head.end:
                        self.table.end(stream)
            for stream in self.table.expire():
                logger.info(f"rayparallel serve: sequence {stream!r} idle past {self.table.idle_timeout_s:g} s, freed")

    def _step(self, heads: list[Waiting]) -> dict[int, dict[str, np.ndarray]]:
        for head in heads:
            if head.start:
                self.model.start(head.slot)
        return self.model.step({head.slot: head.window for head in heads})


def _replica_id() -> str:
    """Ray Serve's id of this replica (what answers name as `rayparallel_replica`), '' outside Serve."""
    from ray import serve

    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # not inside a Ray Serve replica: no context
        return ""

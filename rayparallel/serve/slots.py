"""Which live stream holds which batch row ("slot") of a replica: Triton's sequence batcher, Direct strategy.

A stream takes a slot at `sequence_start` (a start on a live stream restarts it in its own slot), keeps it
while it sends windows, and frees it at `sequence_end` or when it has been idle longer than the idle
timeout. A window of a stream that holds no slot and does not start one is refused, naming
`sequence_start`, as Triton refuses it ("must specify the START flag"). With every slot taken a start
is refused (`SlotsFull`): the caller decides how long to wait for a free one. Pure bookkeeping, with the
clock given: the model step and the protocol are elsewhere (`slot_model`, `protocol`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass


class NotStarted(LookupError):
    """A window of a stream that holds no slot and did not start one."""


class SlotsFull(LookupError):
    """A stream starts while every slot is taken."""


@dataclass
class Held:
    slot: int
    last_seen: float  # the clock's time of the stream's newest window


class SlotTable:
    """`slots` batch rows; the streams that hold them, by sequence id."""

    def __init__(
        self,
        slots: int,
        idle_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
        on_timeout: Callable[[Hashable], None] = lambda stream: None,
    ):
        if slots < 1:
            raise ValueError(f"slots: expected at least 1, received {slots}")
        self.slots, self.idle_timeout_s, self._clock = slots, idle_timeout_s, clock
        self.on_timeout = on_timeout  # told of each stream freed for idleness, whichever call found it idle
        self._held: dict[Hashable, Held] = {}

    def take(self, stream: Hashable, start: bool) -> tuple[int, bool]:
        """The slot of `stream`'s next window, and whether its state starts from zero (a start).

        >>> table = SlotTable(2, idle_timeout_s=1.0, clock=lambda: 0.0)
        >>> table.take("a", start=True), table.take("b", start=True), table.take("a", start=False)
        ((0, True), (1, True), (0, False))
        """
        self.expire()  # an idle stream is as if freed
        now = self._clock()
        held = self._held.get(stream)
        if held is None and not start:
            raise self.not_started(stream)
        if held is None:
            held = Held(self._free_slot(now), now)
            self._held[stream] = held
        held.last_seen = now
        return held.slot, start

    def not_started(self, stream: Hashable) -> NotStarted:
        """The refusal of a window of `stream`, which holds no slot and does not start one."""
        return NotStarted(
            f"sequence_start: expected true on the first window of sequence {stream!r} (it holds no slot: "
            f"never started, ended, or idle past {self.idle_timeout_s:g} s), received false"
        )

    def end(self, stream: Hashable) -> None:
        """`sequence_end`: the stream's slot is free once its last window is answered."""
        self._held.pop(stream, None)

    def expire(self) -> list[Hashable]:
        """The streams idle past the timeout, freed (each told to `on_timeout`, for the replica's log and metrics)."""
        now = self._clock()
        idle = [stream for stream, held in self._held.items() if now - held.last_seen > self.idle_timeout_s]
        for stream in idle:
            del self._held[stream]
            self.on_timeout(stream)
        return idle

    def held(self) -> dict[Hashable, int]:
        """The live streams' slots (those idle past the timeout freed first)."""
        self.expire()
        return {stream: held.slot for stream, held in self._held.items()}

    def _free_slot(self, now: float) -> int:
        taken = {held.slot for held in self._held.values()}
        free = [slot for slot in range(self.slots) if slot not in taken]
        if not free:
            raise SlotsFull(f"every one of the {self.slots} slots holds a live stream")
        return free[0]

"""One serving replica: S slots of the model, and the loop that steps them.

Requests only queue a window (after taking or checking the stream's slot); one loop takes, at every
step, the oldest waiting window of each stream that has one, runs them as one model step in a thread of
its own (so HTTP stays served), and answers them. A stream's windows are therefore stepped in the order
it sent them, one per step, and no other slot's state moves (`SlotModel`). A slot's state starts from
zero at the step of the window that started the stream, and the slot is freed once its last window
(`sequence_end`) is answered.

With a keeper (`kept_states`), the step's states are committed there before any of its windows is
answered (the commit runs beside the next steps of other streams), and a window of a stream this
replica does not hold is continued from the kept state: the stream's replica died, or the ring moved it
here. The keeper's verdict decides each answer: kept (the step's), duplicate (a retry of an answered
window: the kept answer, and the slot put back to the kept state) or stale (this slot was behind: the
kept state put in, and the window stepped again). A request that went away (its caller cancelled it)
is skipped when its answer comes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .endpoints import Forward, KServeEndpoints, listen
from .keeper_link import KeeperLink
from .kept_states import Commit, Kept, Verdict
from .metrics import StreamMetrics
from .protocol import InferRequest, TensorSpec
from .slots import NotStarted, SlotsFull, SlotTable

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

    from ..spec import ModelSpec

logger = logging.getLogger("ray.serve")


@dataclass(frozen=True)
class Http:
    """What a replica serves over HTTP itself (`endpoints`), and the directory it says its address to."""

    name: str
    version: str
    model_input: TensorSpec
    outputs: list[TensorSpec]
    directory: DeploymentHandle


@dataclass
class Waiting:
    stream: Hashable
    slot: int
    window: np.ndarray
    start: bool
    end: bool
    token: str  # the ingress's id of the request, the same on its retries (`kept_states`)
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
        keeper: DeploymentHandle | None = None,
        http: Http | None = None,
    ):
        from ..inference.batches import built_model
        from .slot_model import SlotModel

        self.model = SlotModel(built_model(recipe, weights, search_path, slots))
        self.table = SlotTable(slots, idle_timeout_s, on_timeout=self._timed_out)
        self.metrics = StreamMetrics(slots)
        self.slot_wait_s, self.keeper = slot_wait_s, KeeperLink(keeper) if keeper is not None else None
        self.waiting: dict[Hashable, deque[Waiting]] = {}
        self.windows: dict[Hashable, int] = {}  # each held stream's answered windows, as the keeper counts them
        self.restores: dict[int, list[np.ndarray]] = {}  # state rows to put into a slot before its next step
        self.committing: set[Hashable] = set()  # streams whose last step awaits the keeper's verdict
        self.stepper = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rayparallel-step")
        self.wake = asyncio.Event()
        self.backlog: deque[object] = deque()  # starts waiting for a slot, in arrival order
        self.peers: dict[str, tuple[str, int, int]] = {}  # every replica's (host, port, free slots), as last said
        self.elsewhere: dict[Hashable, tuple[str, float]] = {}  # streams placed on another replica: its address
        self.replica = _replica_id()
        # Ray Serve runs the constructor on the replica's event loop, where the step loops and the HTTP server live
        loop = asyncio.get_running_loop()
        loop.create_task(self._steps())
        if http is not None:  # KServe v2 on a port of its own, to which the front forwards the stream's windows
            loop.create_task(self._serve_http(http))
        logger.info(f"rayparallel serve: replica up with {slots} slots, idle timeout {idle_timeout_s:g} s")

    async def infer(
        self, stream: Hashable, start: bool, end: bool, window: np.ndarray, token: str = "", sent_at: float = 0.0
    ) -> tuple[int, Any, str]:
        """A window from a caller inside Ray (the deployment's handle, routed by the stream as session id):
        see `window`; `token` names the window for its retries (none: applied once per call)."""
        request = InferRequest(stream, start, end, window)
        return await self.window(request, token or uuid.uuid4().hex, sent_at, forwarded=True)

    async def window(
        self, request: InferRequest, token: str, sent_at: float, forwarded: bool = False
    ) -> tuple[int, Any, str]:
        """(200, the outputs by name, this replica's id), or (status, one line, id): 400 for a stream that
        holds no slot, 503 when every slot of the deployment stayed taken for `slot_wait_s`. `token` names the
        window on its retries; `sent_at` (`time.time()`) is when it reached the front: its wait for this replica
        is not idling. Raises `Forward` for a window whose stream this replica placed on another (a start it
        had no room for), unless the window was `forwarded` already (then it is answered here)."""
        stream, start, end = request.sequence_id, request.start, request.end
        placed = self.elsewhere.pop(stream, None)
        if placed is not None and not forwarded:
            if not end:
                self.elsewhere[stream] = (placed[0], time.monotonic())
            raise Forward(placed[0])
        try:
            waited_s = time.time() - sent_at if sent_at else 0.0
            kept = None if start or stream in self.table.held() else await self._recall(stream, token, waited_s)
            if kept is not None and kept.token == token:  # a retry of a window answered before its replica died
                return 200, kept.answer, self.replica
            slot = await self._slot(stream, start or kept is not None, forwarded)
            if kept is not None:
                self.restores[slot], self.windows[stream] = kept.state, kept.windows
                self.metrics.count("taken_over")
            answer = asyncio.get_running_loop().create_future()
            queued = Waiting(stream, slot, request.window, start, end, token, answer)
            self.waiting.setdefault(stream, deque()).append(queued)
            self.wake.set()
            return 200, await answer, self.replica
        except NotStarted as exc:
            return 400, str(exc), self.replica
        except SlotsFull:
            wanted, replicas = f"a free slot within {self.slot_wait_s:g} s", max(len(self.peers), 1)
            taken = (
                f"every one of the {self.table.slots} slots of each of the deployment's {replicas} replicas is taken"
            )
            return 503, f"sequence_start: expected {wanted}, received none ({taken})", self.replica

    async def _serve_http(self, http: Http) -> None:
        """Answer HTTP on a port of its own, and tell the directory where, every second (the fronts forget a
        silent replica)."""
        import ray

        endpoints = KServeEndpoints(http.name, http.version, http.model_input, http.outputs, self.window)
        self.http_runner, port = await listen(endpoints.handle)
        host = ray.util.get_node_ip_address()
        directory = http.directory
        while True:
            free = self.table.slots - len(self.table.held())
            with contextlib.suppress(Exception):  # the directory restarting: next time
                self.peers = await directory.register.remote(self.replica, host, port, free)
            stale = time.monotonic() - self.table.idle_timeout_s
            self.elsewhere = {stream: placed for stream, placed in self.elsewhere.items() if placed[1] > stale}
            await asyncio.sleep(1.0)

    async def _recall(self, stream: Hashable, token: str, waited_s: float) -> Kept | None:
        """The keeper's state of a stream this replica does not hold; NotStarted if there is none to go on from."""
        kept = None if self.keeper is None else await self.keeper.recall(stream, waited_s)
        if kept is None or (kept.ended and kept.token != token):
            raise self.table.not_started(stream)
        return kept

    async def _slot(self, stream: Hashable, start: bool, forwarded: bool) -> int:
        """The stream's slot here. A start that finds none goes to a replica with a free one (unless `forwarded`:
        then it waits here), else waits in arrival order (Triton's backlog) up to `slot_wait_s`: `SlotsFull`."""
        if stream in self.table.held():  # its own slot (a window, or a start again): no wait, no ticket
            return self.table.take(stream, start)[0]
        deadline, ticket = asyncio.get_running_loop().time() + self.slot_wait_s, object()
        self.backlog.append(ticket)
        try:
            while True:
                if self.backlog[0] is ticket:
                    with contextlib.suppress(SlotsFull):
                        return self.table.take(stream, start)[0]
                room = None if forwarded else self._room_elsewhere()
                if room is not None:
                    self.elsewhere[stream] = (room, time.monotonic())
                    raise Forward(room)
                if asyncio.get_running_loop().time() >= deadline:
                    raise SlotsFull(f"no free slot within {self.slot_wait_s:g} s")
                await asyncio.sleep(0.01)
        finally:
            self.backlog.remove(ticket)

    def _room_elsewhere(self) -> str | None:
        """The address of another replica that said it has a free slot (most free first), if any."""
        free = [(room, f"{host}:{port}") for r, (host, port, room) in self.peers.items() if r != self.replica and room]
        return max(free)[1] if free else None

    async def _steps(self) -> None:
        """Step every stream with a window waiting and no step being committed. A step's commit runs beside
        the next steps (the keeper's round trip does not hold the model), and a stream's next window waits
        for its previous one's verdict, which may change its slot (stale, duplicate)."""
        loop = asyncio.get_running_loop()
        while True:
            await self.wake.wait()
            self.wake.clear()
            while ready := [stream for stream in self.waiting if stream not in self.committing]:
                heads = [self.waiting[stream].popleft() for stream in ready]
                self.waiting = {stream: queue for stream, queue in self.waiting.items() if queue}
                try:
                    outputs, states = await loop.run_in_executor(self.stepper, self._step, heads)
                except Exception as exc:  # the model failed: every window of the step hears why
                    for head in heads:
                        _reply(head.answer, error=exc)
                    continue
                self.committing.update(ready)
                loop.create_task(self._answer(heads, outputs, states))
                self.metrics.step(len(heads), len(self.table.held()))
            self.table.expire()

    async def _answer(self, heads: list[Waiting], outputs: dict, states: dict) -> None:
        """The step's windows settled by their verdicts; their streams free to step again."""
        try:
            verdicts = await self._commit(heads, outputs, states)
        except Exception as exc:  # the keeper failed: the step's windows hear why
            for head in heads:
                _reply(head.answer, error=exc)
        else:
            for head, verdict in zip(heads, verdicts, strict=True):
                self._settle(head, outputs[head.slot], *verdict)
        finally:
            self.committing.difference_update(head.stream for head in heads)
            self.wake.set()

    def _timed_out(self, stream: Hashable) -> None:
        self.windows.pop(stream, None)
        self.metrics.count("timed_out")
        logger.info(f"rayparallel serve: sequence {stream!r} idle past {self.table.idle_timeout_s:g} s, freed")

    def _step(self, heads: list[Waiting]) -> tuple[dict[int, dict[str, np.ndarray]], dict[int, list[np.ndarray]]]:
        for slot in list(self.restores):  # popped one by one: a request may add one meanwhile
            self.model.restore(slot, self.restores.pop(slot))
        for head in heads:
            if head.start:
                self.model.start(head.slot)
        outputs = self.model.step({head.slot: head.window for head in heads})
        return outputs, self.model.states_of([head.slot for head in heads]) if self.keeper else {}

    async def _commit(self, heads: list[Waiting], outputs: dict, states: dict) -> list[tuple[Verdict, Kept | None]]:
        if self.keeper is None:
            return [("kept", None)] * len(heads)
        commits = []
        for head in heads:
            after = 0 if head.start else self.windows.get(head.stream, 0)
            commits.append(
                Commit(head.stream, head.token, after, head.start, head.end, outputs[head.slot], states[head.slot])
            )
        return await self.keeper.commit(commits)

    def _settle(self, head: Waiting, outputs: dict[str, np.ndarray], verdict: Verdict, kept: Kept | None) -> None:
        if verdict == "stale" and (kept is None or kept.ended):  # ended or idle elsewhere meanwhile
            self._free(head.stream)
            _reply(head.answer, error=self.table.not_started(head.stream))
            return
        if kept is not None:
            self.windows[head.stream] = kept.windows
        if verdict == "stale":  # this slot was behind the stream: its kept state, and the window again
            self.restores[head.slot] = kept.state
            self.waiting.setdefault(head.stream, deque()).appendleft(head)
            return
        if verdict == "duplicate":  # a retry: the slot back to the state the kept answer left
            self.restores[head.slot], outputs = kept.state, kept.answer
        _reply(head.answer, outputs)
        if head.start and verdict == "kept":
            self.metrics.count("started")
        if head.end:
            self._free(head.stream)
            self.metrics.count("ended")

    def _free(self, stream: Hashable) -> None:
        self.table.end(stream)
        self.windows.pop(stream, None)


def _reply(answer: asyncio.Future, result: Any = None, error: Exception | None = None) -> None:
    """The waiting request's answer, unless it went away (cancelled) meanwhile."""
    if answer.done():
        return
    if error is not None:
        answer.set_exception(error)
    else:
        answer.set_result(result)


def _replica_id() -> str:
    """Ray Serve's id of this replica (what answers name as `rayparallel_replica`), '' outside Serve."""
    from ray import serve

    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # not inside a Ray Serve replica: no context
        return ""

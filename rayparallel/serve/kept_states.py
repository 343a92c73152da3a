"""Every live stream's state after its last answered window, kept outside the replicas.

A replica that dies takes its slots with it, and Ray Serve restarts it empty. So each replica commits
the states of a step's streams here before it answers them, and a replica that receives a window of a
stream it does not hold (its replica died, or the consistent-hash ring moved it) recalls the stream
from here and goes on from its last answered window.

Exactly once: every window carries a token, the front's id of the HTTP request, the same on each of
its retries. A commit whose token is the stream's last answered one is a retry of a window already
applied: the kept answer is returned and the state is not stepped twice. A commit from a replica whose
slot is behind the kept count (the stream moved away and came back) is refused as stale: that replica
puts the kept state in its slot and steps the window again.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

Verdict = Literal["kept", "duplicate", "stale"]
SECRET_HEADER = "x-rayparallel-secret"


@dataclass
class Kept:
    """A stream as its last answered window left it."""

    windows: int  # windows answered since the stream's start
    token: str  # the last answered window's
    answer: dict[str, np.ndarray]
    state: list[np.ndarray]  # the slot's state rows, layer by layer (`SlotModel.states_of`)
    ended: bool  # its last window was `sequence_end` (kept so that a retry of that window is answered)
    seen: float  # the clock's time of the commit


@dataclass
class Commit:
    """One stepped window, as a replica reports it."""

    stream: Hashable
    token: str
    after: int  # the windows the replica's slot had taken before this one (0 for a start)
    start: bool
    end: bool
    answer: dict[str, np.ndarray]
    state: list[np.ndarray]


class KeptStates:
    """The keeper's bookkeeping; a stream idle past `idle_timeout_s` is forgotten, as its slot is freed.

    Idle means without a window: a window that waited for its stream's next replica after a death (up to
    `grace_s`, the front's failover wait) is counted from its arrival, not from its recall, so a failover
    slower than the timeout loses no stream."""

    def __init__(self, idle_timeout_s: float, clock: Callable[[], float] = time.monotonic, grace_s: float = 0.0):
        self.idle_timeout_s, self.grace_s, self._clock = idle_timeout_s, grace_s, clock
        self._kept: dict[Hashable, Kept] = {}
        self._swept = clock()

    def recall(self, stream: Hashable, waited_s: float = 0.0) -> Kept | None:
        """The stream's last answered window, or None (never started, or idle past the timeout when the window
        that asks arrived, `waited_s` ago); a recalled stream is not idle: its window is being applied."""
        self._sweep()
        kept = self._live(stream, min(max(waited_s, 0.0), self.grace_s))
        if kept is not None:
            kept.seen = self._clock()
        return kept

    def commit(self, commits: list[Commit]) -> list[tuple[Verdict, Kept | None]]:
        """One verdict for each commit, with what is kept of its stream afterwards.

        >>> keeper = KeptStates(idle_timeout_s=60.0, clock=lambda: 0.0)
        >>> first = Commit("a", "t1", 0, start=True, end=False, answer={}, state=[])
        >>> [v for v, _ in keeper.commit([first])], [v for v, _ in keeper.commit([first])]
        (['kept'], ['duplicate'])
        """
        self._sweep()
        return [self._one(commit) for commit in commits]

    def _one(self, commit: Commit) -> tuple[Verdict, Kept | None]:
        kept = self._live(commit.stream)
        if kept is not None and kept.token == commit.token:
            return "duplicate", kept
        if not commit.start and (kept is None or kept.ended or kept.windows != commit.after):
            return "stale", kept
        windows = 1 if commit.start else kept.windows + 1
        kept = Kept(windows, commit.token, commit.answer, commit.state, commit.end, self._clock())
        self._kept[commit.stream] = kept
        return "kept", kept

    def _live(self, stream: Hashable, waited_s: float = 0.0) -> Kept | None:
        kept = self._kept.get(stream)
        if kept is not None and self._clock() - kept.seen > self.idle_timeout_s + waited_s:
            del self._kept[stream]
            return None
        return kept

    def _sweep(self) -> None:
        now = self._clock()
        if now - self._swept < 1.0:  # a scan a second at most, to bound memory: `_live` decides each stream
            return
        self._swept = now
        forgotten = self.idle_timeout_s + self.grace_s  # a window may still be on its way to a recall
        idle = [stream for stream, kept in self._kept.items() if now - kept.seen > forgotten]
        for stream in idle:
            del self._kept[stream]


class StateKeeper:
    """The Ray Serve deployment (one replica, `app.build`) holding `KeptStates` for every stream replica.

    The replicas reach it on an HTTP port of its own (`keeper_link`), found through its deployment handle
    (`address`): a commit is then one hop between two event loops, with no Ray Serve router or thread on the
    way. Every request must carry the secret that `address` gives (through Ray) and no pickle crosses the
    port (`wire`). Its handlers have no await between reading and writing the states: each commit is whole.
    """

    def __init__(self, idle_timeout_s: float, grace_s: float = 0.0):
        self.states = KeptStates(idle_timeout_s, grace_s=grace_s)
        self.secret = secrets.token_hex(16)
        self.listening: asyncio.Future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().create_task(self._listen())

    async def address(self) -> tuple[str, int, str]:
        """(host, port, secret) of the keeper's HTTP port, once it listens."""
        return await asyncio.shield(self.listening)

    async def recall(self, stream: Hashable, waited_s: float = 0.0) -> Kept | None:
        return self.states.recall(stream, waited_s)

    async def commit(self, commits: list[Commit]) -> list[tuple[Verdict, Any]]:
        """The verdicts; a kept window's reply carries only its count (the replica holds its answer and state)."""
        return [
            (verdict, replace(kept, answer={}, state=[]) if verdict == "kept" else kept)
            for verdict, kept in self.states.commit(commits)
        ]

    async def _listen(self) -> None:
        import ray
        from aiohttp import web

        from .endpoints import listen
        from .wire import pack, unpack

        async def handle(request: web.Request) -> web.Response:
            if request.headers.get(SECRET_HEADER) != self.secret:
                return web.Response(status=403, text="x-rayparallel-secret: expected the keeper's, received another")
            if request.method != "POST":
                return web.Response(status=405, text=f"method: expected POST, received {request.method}")
            body = unpack(await request.read())
            if request.path == "/commit":
                verdicts = await self.commit([Commit(**commit) for commit in body])
                answer = [[verdict, None if kept is None else vars(kept)] for verdict, kept in verdicts]
            else:
                kept = await self.recall(body["stream"], body["waited_s"])
                answer = None if kept is None else vars(kept)
            return web.Response(body=pack(answer), content_type="application/octet-stream")

        self.runner, port = await listen(handle, "/{path:commit|recall}")
        self.listening.set_result((ray.util.get_node_ip_address(), port, self.secret))

"""A stream replica's way to the keeper: the keeper's own HTTP port, on the replica's event loop.

Through Ray Serve's deployment handle a commit's round trip hops between threads in both processes
(the event loop, Ray Serve's router, Ray's own), each hop waiting for the GIL while the replica steps:
35-45 ms under load here, and every window waits for its step's commit. An HTTP request between the
two event loops takes a fraction of that. The handle still finds the port (`StateKeeper.address`),
again after the keeper restarts.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from .kept_states import SECRET_HEADER, Commit, Kept, Verdict
from .wire import pack, unpack

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle


class KeeperLink:
    """`commit` and `recall` of the keeper (`StateKeeper`), over its HTTP port."""

    def __init__(self, handle: DeploymentHandle):
        self.handle = handle
        self.address: tuple[str, int, str] | None = None
        self.session = None

    async def commit(self, commits: list[Commit]) -> list[tuple[Verdict, Kept | None]]:
        answer = await self._post("commit", [vars(commit) for commit in commits])
        return [(verdict, None if kept is None else Kept(**kept)) for verdict, kept in answer]

    async def recall(self, stream: Hashable, waited_s: float) -> Kept | None:
        kept = await self._post("recall", {"stream": stream, "waited_s": waited_s})
        return None if kept is None else Kept(**kept)

    async def _post(self, path: str, payload: Any) -> Any:
        """One request; after a failure, the keeper's address asked again (it may have restarted) and one more."""
        import aiohttp

        if self.session is None:
            self.session = aiohttp.ClientSession()
        for attempt in range(2):
            if self.address is None:
                self.address = await self.handle.address.remote()
            host, port, secret = self.address
            try:
                async with self.session.post(
                    f"http://{host}:{port}/{path}", data=pack(payload), headers={SECRET_HEADER: secret}
                ) as answer:
                    answer.raise_for_status()
                    return unpack(await answer.read())
            except (aiohttp.ClientError, OSError):
                self.address = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

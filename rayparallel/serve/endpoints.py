"""KServe's v2 endpoints, served over HTTP by each stream replica itself (aiohttp on the replica's event loop).

A window's path is one HTTP hop from the front (`front`: HAProxy, balancing by the stream) to the
replica that holds its slot: no Ray Serve proxy, no ingress deployment, no pickle on the way. Every
request is parsed and checked here (a bad one is answered in one line and never reaches a slot); a
good window goes to `answer_window`, the replica's own. The front names each request with a token
(`x-rayparallel-token`, the same on its retries to another replica after a death: the keeper applies
the window once) and the time it arrived (`x-rayparallel-sent-at`, ms: its wait for a dead replica's
successor is not idling).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .protocol import InferRequest, ProtocolError, TensorSpec, infer_response, parse_infer

if TYPE_CHECKING:
    from aiohttp import web

INFER = re.compile(r"/v2/models/(?P<name>[^/]+)(/versions/(?P<version>[^/]+))?/infer")
TOKEN_HEADER, SENT_AT_HEADER = "x-rayparallel-token", "x-rayparallel-sent-at"
FORWARDED_HEADER = "x-rayparallel-forwarded"  # a window a replica sent on: its receiver never sends it further
AnswerWindow = Callable[[InferRequest, str, float, bool], Awaitable[tuple[int, Any, str]]]


class Forward(Exception):
    """The window goes to the replica at `address` (`host:port`): its stream was placed there."""

    def __init__(self, address: str):
        super().__init__(address)
        self.address = address


class KServeEndpoints:
    """`/v2/...` for one model; `answer_window(request, token, sent_at, forwarded)` -> (status, outputs or one line,
    replica), or `Forward`: the request is sent on as it came, once (`forwarded` tells the receiver), and its
    answer relayed; when that replica cannot be reached, the window is answered here after all."""

    def __init__(
        self, name: str, version: str, model_input: TensorSpec, outputs: list[TensorSpec], answer_window: AnswerWindow
    ):
        self.name, self.version, self.model_input, self.outputs = name, version, model_input, outputs
        self.answer_window = answer_window
        self.session = None  # aiohttp's, for forwarded windows

    async def handle(self, request: web.Request) -> web.Response:
        from aiohttp import web

        try:
            try:
                status, body = await self._answer(request)
            except Forward as forward:
                relayed = await self._forward(request, forward.address)
                if relayed is not None:
                    return relayed
                status, body = await self._answer(request, local=True)
        except ProtocolError as exc:
            status, body = exc.status, exc.body()
        # NaN and infinity as JSON writers and Triton's client read them: a window's NaN is the model's answer
        return web.Response(body=json.dumps(body), status=status, content_type="application/json")

    async def _forward(self, request: web.Request, address: str) -> web.Response | None:
        """The request sent on to the replica at `address`, its answer; None when it cannot be reached."""
        import aiohttp
        from aiohttp import web

        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        headers = {key: value for key, value in request.headers.items() if key.lower().startswith(("x-", "inference-"))}
        headers[FORWARDED_HEADER] = "1"
        try:
            async with self.session.post(
                f"http://{address}{request.path}", data=await request.read(), headers=headers
            ) as answer:
                return web.Response(body=await answer.read(), status=answer.status, content_type="application/json")
        except (aiohttp.ClientError, OSError):
            return None

    async def _answer(self, request: web.Request, local: bool = False) -> tuple[int, dict]:
        path = request.path.rstrip("/")
        if path in ("/v2/health/live", "/v2/health/ready"):
            return 200, {}
        if path in (f"/v2/models/{self.name}", f"/v2/models/{self.name}/versions/{self.version}"):
            return 200, self.metadata()
        if path in (f"/v2/models/{self.name}/ready", f"/v2/models/{self.name}/versions/{self.version}/ready"):
            return 200, {}
        found = INFER.fullmatch(path)
        if found is None or request.method != "POST":
            raise ProtocolError(
                404,
                f"path: expected /v2/models/{self.name}/infer (POST) or /v2/health/..., received {request.method} {path}",
            )
        if found["name"] != self.name:
            raise ProtocolError(404, f"model: expected {self.name!r}, received {found['name']!r}")
        length = request.headers.get("inference-header-content-length")
        header_length = int(length) if length and length.isdigit() else None
        parsed = parse_infer(await request.read(), header_length, self.model_input)
        token = request.headers.get(TOKEN_HEADER) or uuid.uuid4().hex
        sent_at = request.headers.get(SENT_AT_HEADER, "")
        forwarded = local or request.headers.get(FORWARDED_HEADER) == "1"
        status, result, replica = await self.answer_window(
            parsed, token, int(sent_at) / 1000 if sent_at.isdigit() else time.time(), forwarded
        )
        if status != 200:
            raise ProtocolError(status, result)
        answer = infer_response(self.name, self.version, parsed, result, self.outputs)
        answer["parameters"]["rayparallel_replica"] = replica  # the replica that holds the stream's slot
        return 200, answer

    def metadata(self) -> dict:
        """`GET /v2/models/{name}`: the model's inputs and outputs, per window (a leading -1: the rows)."""
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": "keras_tensorflow",
            "inputs": [self.model_input.metadata()],
            "outputs": [spec.metadata() for spec in self.outputs],
        }


async def listen(
    handle: Callable[[web.Request], Awaitable[web.Response]], paths: str = "/{tail:.*}"
) -> tuple[Any, int]:
    """`handle` served on every address of this node, on a port the system picks: (runner, port). Each stream
    replica serves its endpoints so, and the keeper its commits."""
    from aiohttp import web

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_route("*", paths, handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", 0).start()
    return runner, runner.addresses[0][1]

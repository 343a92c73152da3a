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
AnswerWindow = Callable[[InferRequest, str, float], Awaitable[tuple[int, Any, str]]]


class KServeEndpoints:
    """`/v2/...` for one model; `answer_window(request, token, sent_at)` -> (status, outputs or one line, replica)."""

    def __init__(
        self, name: str, version: str, model_input: TensorSpec, outputs: list[TensorSpec], answer_window: AnswerWindow
    ):
        self.name, self.version, self.model_input, self.outputs = name, version, model_input, outputs
        self.answer_window = answer_window

    async def handle(self, request: web.Request) -> web.Response:
        from aiohttp import web

        try:
            status, body = await self._answer(request)
        except ProtocolError as exc:
            status, body = exc.status, exc.body()
        # NaN and infinity as JSON writers and Triton's client read them: a window's NaN is the model's answer
        return web.Response(body=json.dumps(body), status=status, content_type="application/json")

    async def _answer(self, request: web.Request) -> tuple[int, dict]:
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
        status, result, replica = await self.answer_window(
            parsed, token, int(sent_at) / 1000 if sent_at.isdigit() else time.time()
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


async def listen(endpoints: KServeEndpoints) -> tuple[Any, int]:
    """The endpoints served on every address of this node, on a port the system picks: (runner, port)."""
    from aiohttp import web

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_route("*", "/{tail:.*}", endpoints.handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "0.0.0.0", 0)
    await site.start()
    return runner, runner.addresses[0][1]

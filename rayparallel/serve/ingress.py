"""The HTTP side of `rayparallel serve`: KServe's v2 endpoints, each request's stream sent to its replica.

The ingress parses and checks every request (a bad one is answered here, in one line, and never reaches
a replica), then calls the replicas' deployment handle with the stream's id as Ray Serve's session id:
the deployment's consistent-hash request router (`app.build`) sends every window of a stream to the
replica that holds its slot. A replica that dies with the window in flight is told apart from a failing
model (Ray's actor errors): with the states kept, the window is sent again under the same token, so it
is applied once (`kept_states`), and Ray Serve's router sends it to the stream's next replica.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from typing import TYPE_CHECKING, Any

from .protocol import InferRequest, ProtocolError, TensorSpec, infer_response, parse_infer

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle
    from starlette.requests import Request

INFER = re.compile(r"/v2/models/(?P<name>[^/]+)(/versions/(?P<version>[^/]+))?/infer")
logger = logging.getLogger("ray.serve")
FAILOVER_S = 120.0  # how long a window waits for its stream's next replica after a death (a TensorFlow import)


class KServeIngress:
    """A Ray Serve deployment (`app.build` makes it one) answering `/v2/...` for one model."""

    def __init__(
        self,
        replicas: DeploymentHandle,
        name: str,
        version: str,
        model_input: TensorSpec,
        outputs: list[TensorSpec],
        keep_states: bool = True,
    ):
        self.replicas, self.name, self.version = replicas, name, version
        self.model_input, self.outputs, self.keep_states = model_input, outputs, keep_states

    async def __call__(self, request: Request) -> Any:
        from starlette.responses import Response

        try:
            status, body = await self._answer(request)
        except ProtocolError as exc:
            status, body = exc.status, exc.body()
        # NaN and infinity as JSON writers and Triton's client read them: a window's NaN is the model's answer
        return Response(json.dumps(body), status_code=status, media_type="application/json")

    async def _answer(self, request: Request) -> tuple[int, dict]:
        path = request.url.path.rstrip("/")
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
        parsed = parse_infer(await request.body(), header_length, self.model_input)
        status, result, replica = await self._on_replica(parsed)
        if status != 200:
            raise ProtocolError(status, result)
        answer = infer_response(self.name, self.version, parsed, result, self.outputs)
        answer["parameters"]["rayparallel_replica"] = replica  # the replica that holds the stream's slot
        return 200, answer

    async def _on_replica(self, parsed: InferRequest) -> tuple[int, Any, str]:
        """The stream's replica's answer; after a replica's death, its next replica's (states kept)."""
        from ray.exceptions import ActorUnavailableError, RayActorError

        handle = self.replicas.options(session_id=str(parsed.sequence_id))
        token = uuid.uuid4().hex  # the same on every retry: the keeper applies the window once
        sent_at = time.time()  # its wait for the next replica after a death is not the stream's idling
        deadline, retried = asyncio.get_running_loop().time() + FAILOVER_S, False
        while True:
            try:
                return await handle.infer.remote(
                    parsed.sequence_id, parsed.start, parsed.end, parsed.window, token, sent_at
                )
            except (RayActorError, ActorUnavailableError) as exc:
                if not self.keep_states or asyncio.get_running_loop().time() > deadline:
                    kept = f"no replica took it over within {FAILOVER_S:g} s" if self.keep_states else "states not kept"
                    raise ProtocolError(
                        503,
                        f"replica: expected the stream's replica to answer, received its death ({kept}; {type(exc).__name__})",
                    ) from None
                if not retried:  # a death, not a request: said once, then the window waits
                    logger.warning(
                        f"rayparallel serve: the replica of sequence {parsed.sequence_id!r} died "
                        f"({type(exc).__name__}); sending its window to the next replica, up to {FAILOVER_S:g} s"
                    )
                retried = True
                await asyncio.sleep(0.2)

    def metadata(self) -> dict:
        """`GET /v2/models/{name}`: the model's inputs and outputs, per window (a leading -1: the rows)."""
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": "keras_tensorflow",
            "inputs": [self.model_input.metadata()],
            "outputs": [spec.metadata() for spec in self.outputs],
        }

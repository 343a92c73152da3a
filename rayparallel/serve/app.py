"""The Ray Serve application of `rayparallel serve`: a front, N stream replicas of S slots each, their directory.

A window's path: the client -> the front (`front`: HAProxy, hashing the stream on a consistent ring of
the live replicas) -> the replica's own HTTP server (`endpoints`) -> its slot's step -> the answer. Ray
Serve places, health-checks and restarts every part; no window passes through Ray Serve's proxy. Callers
inside Ray reach the replicas through their deployment's handle, routed by Ray Serve's consistent-hash
request router on the session id (the stream's id) with no fallback replica. With the states kept (the
default), a deployment of one replica, the keeper (`kept_states`), holds every stream's state after its
last answered window, so a replica's death loses no stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..hooks import HOOKS
from .front import FAILOVER_S, HAProxyFront, ReplicaDirectory
from .kept_states import StateKeeper
from .protocol import TensorSpec, tensor_spec
from .replica import Http, StreamReplica

if TYPE_CHECKING:
    import keras
    from ray.serve import Application
    from ray.serve.config import RequestRouterConfig

    from ..spec import ModelSpec


@dataclass(frozen=True)
class ServeSettings:
    """What `rayparallel serve` was told, in Ray Serve's words where it has them."""

    name: str  # the model's name in the URL: /v2/models/{name}
    version: str
    num_replicas: int
    slots: int  # streams one replica holds: the model's batch
    idle_timeout_s: float
    slot_wait_s: float  # how long a start waits for a free slot before a 503
    use_gpu: bool = False
    cpus_per_replica: float = 1.0
    keep_states: bool = True  # each step's states kept outside the replica: a replica's death loses no stream
    host: str = "127.0.0.1"  # where the front listens
    port: int = 8000
    head_only: bool = False  # one front, on the head node (`proxy_location="HeadOnly"`), else one on every node
    fronts: int = 1  # the fronts: 1, or the cluster's nodes


def model_tensors(model: keras.Model) -> tuple[TensorSpec, list[TensorSpec]]:
    """The model's one input and its outputs, per window, as the metadata names them."""
    (tensor,) = model.inputs
    outputs = [
        tensor_spec(name, output.dtype, output.shape[1:])
        for name, output in zip(model.output_names, model.outputs, strict=True)
    ]
    return tensor_spec(tensor.name, tensor.dtype, tensor.shape[1:]), outputs


def sticky_router() -> RequestRouterConfig:
    """Ray Serve's consistent-hash request router on the session id (the stream), with no fallback replica."""
    from ray.serve.config import RequestRouterConfig

    return RequestRouterConfig(
        request_router_class=HOOKS["consistent_hash_router"].replace(":", "."),
        request_router_kwargs={"num_virtual_nodes": 100, "num_fallback_replicas": 0},
    )


def build(
    recipe: ModelSpec, weights: Any, search_path: list[str], model: keras.Model, settings: ServeSettings
) -> Application:
    """The application: `model` (the job's, built here for its metadata) served from `weights`; its ingress is
    the front (no HTTP route of Ray Serve's own)."""
    from ray import serve

    keeper = None
    if settings.keep_states:  # one keeper for all the replicas: a commit a step, answered on its event loop
        keeper = serve.deployment(
            StateKeeper, name=f"{settings.name}-states", ray_actor_options={"num_cpus": 0}, max_ongoing_requests=10000
        ).bind(settings.idle_timeout_s, FAILOVER_S)
    directory = serve.deployment(
        ReplicaDirectory,
        name=f"{settings.name}-directory",
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=1000,
    ).bind()
    model_input, outputs = model_tensors(model)
    http = Http(settings.name, settings.version, model_input, outputs, directory)
    replicas = serve.deployment(
        StreamReplica,
        name=f"{settings.name}-streams",
        num_replicas=settings.num_replicas,
        max_ongoing_requests=max(100, 4 * settings.slots),  # every live stream's next windows, not 5
        ray_actor_options={"num_cpus": settings.cpus_per_replica, "num_gpus": 1 if settings.use_gpu else 0},
        request_router_config=sticky_router(),
    ).bind(recipe, weights, search_path, settings.slots, settings.idle_timeout_s, settings.slot_wait_s, keeper, http)
    front = serve.deployment(
        HAProxyFront,
        name=f"{settings.name}-front",
        num_replicas=settings.fronts,
        max_replicas_per_node=1,  # each binds the port on its node
        ray_actor_options={"num_cpus": 0, "resources": {"node:__internal_head__": 0.001} if settings.head_only else {}},
    )
    # slots for replicas in HAProxy: the replicas, and those that replace them after deaths
    return front.bind(directory, settings.host, settings.port, 4 * settings.num_replicas + 8, replicas)

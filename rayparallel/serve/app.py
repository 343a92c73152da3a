"""The Ray Serve application of `rayparallel serve`: an HTTP ingress and N replicas of S slots each.

The replicas' deployment routes by Ray Serve's consistent-hash request router on the session id (the
stream's id, set by the ingress), with no fallback replica: a stream's windows go to the replica that
holds its slot even when it is busy (Ray Serve's default of 2 fallbacks would send them elsewhere, where
the stream has no state). Adding a replica moves only the streams the ring gives it. With the states
kept (the default), a third deployment of one replica, the keeper (`kept_states`), holds every stream's
state after its last answered window, so a replica's death loses no stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..hooks import HOOKS
from .ingress import FAILOVER_S, KServeIngress
from .kept_states import StateKeeper
from .protocol import TensorSpec, tensor_spec
from .replica import StreamReplica

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
    """The application: `model` (the job's, built here for its metadata) served from `weights`."""
    from ray import serve

    router = sticky_router()
    keeper = None
    if settings.keep_states:  # one keeper for all the replicas: a commit a step, answered on its event loop
        keeper = serve.deployment(
            StateKeeper, name=f"{settings.name}-states", ray_actor_options={"num_cpus": 0}, max_ongoing_requests=10000
        ).bind(settings.idle_timeout_s, FAILOVER_S)
    replicas = serve.deployment(
        StreamReplica,
        name=f"{settings.name}-streams",
        num_replicas=settings.num_replicas,
        max_ongoing_requests=max(100, 4 * settings.slots),  # every live stream's next windows, not 5
        ray_actor_options={"num_cpus": settings.cpus_per_replica, "num_gpus": 1 if settings.use_gpu else 0},
        request_router_config=router,
    ).bind(recipe, weights, search_path, settings.slots, settings.idle_timeout_s, settings.slot_wait_s, keeper)
    model_input, outputs = model_tensors(model)
    ingress = serve.deployment(
        KServeIngress, name=f"{settings.name}-http", ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000
    )
    return ingress.bind(replicas, settings.name, settings.version, model_input, outputs, settings.keep_states)

"""What else in the cluster waits for resources: Ray's pending demands, in the driver's words.

The warm worker group (`warm_workers`) holds its workers' CPUs or GPUs between calls; anything
else of the session that needs them (a Ray task, Ray Data, a trainer of the user's own) would
wait for ever without a word. Ray's GCS keeps what waits (the autoscaler's "Pending Demands",
as `ray status` shows them, on a local Ray too): tasks and actors by their resource shape,
placement groups (Ray Train's and Tune's worker groups) by their bundles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray.autoscaler.v2.schema import ResourceDemandSummary


def waiting_for(holds: dict[str, float], demands: ResourceDemandSummary) -> str | None:
    """The first demand that asks for a resource in `holds` (what the group holds), in words; None when
    nothing waits for them (a demand for other resources, say GPUs beside a CPU group, cannot use them)."""
    kinds = [
        ("a placement group (a Ray Train or Tune worker group)", demands.placement_group_demand),
        ("a Ray task or actor", demands.ray_task_actor_demand),
    ]
    for kind, found in kinds:
        for demand in found:
            shapes = [(shape.bundle, shape.count) for shape in demand.bundles_by_count]
            if any(holds.get(key, 0) > 0 and amount > 0 for bundle, _ in shapes for key, amount in bundle.items()):
                return f"{kind} asking for {' + '.join(f'{count} x {_plain(bundle)}' for bundle, count in shapes)}"
    return None


def pending_demands() -> ResourceDemandSummary:
    """What waits in the cluster this process joined (a GCS call of a few milliseconds)."""
    import ray
    from ray.autoscaler.v2.sdk import get_cluster_status

    return get_cluster_status(ray.get_runtime_context().gcs_address).resource_demands


def _plain(bundle: dict[str, float]) -> str:
    """`{'CPU': 2}` rather than `{'CPU': 2.0}`."""
    return str({key: int(amount) if float(amount).is_integer() else amount for key, amount in bundle.items()})

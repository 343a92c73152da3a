"""Job spec: YAML -> validated, typed objects (no Ray, no TensorFlow)."""

from .parse import SpecSource, apply_overrides, load_spec, load_yaml
from .schema import CheckpointSpec, DataSpec, JobSpec, MlflowSpec, ModelSpec, RunSpec, ScalingSpec, Shard, TrainSpec

__all__ = [
    "CheckpointSpec",
    "MlflowSpec",
    "load_spec",
    "SpecSource",
    "apply_overrides",
    "load_yaml",
    "JobSpec",
    "ModelSpec",
    "DataSpec",
    "TrainSpec",
    "ScalingSpec",
    "RunSpec",
    "Shard",
]

"""Ray Train's TensorFlow backend, without importing TensorFlow where it is not needed.

Ray's `TensorflowTrainer` does two things: it writes `TF_CONFIG` on each worker (every
worker's address, this worker's index) so MultiWorkerMirroredStrategy finds its peers, and
it imports `ray.train.tensorflow`, whose package imports TensorFlow. The second happens in
Ray Train's controller too, which never runs TensorFlow: seconds of CPU at the start of
every run, while the workers start on the same cores. This backend does the first alone,
exactly as Ray's `_TensorflowBackend` does, and the run uses Ray's generic data-parallel
trainer.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import ray
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.backend import Backend, BackendConfig

from ..errors import RayParallelError
from ..hooks import hook
from ..spec import JobSpec

if TYPE_CHECKING:
    from ray.train._internal.base_worker_group import BaseWorkerGroup


@dataclass
class TensorflowBackendConfig(BackendConfig):
    @property
    def backend_cls(self) -> type[Backend]:
        return _TensorflowBackend

    @property
    def framework(self):  # what Ray Train's state export records
        return hook("training_framework").TENSORFLOW


def _worker_address() -> str:
    return hook("build_address")(*hook("address_and_port")())


def _write_tf_config(worker_addresses: list[str], index: int) -> None:
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": {"worker": worker_addresses}, "task": {"type": "worker", "index": index}}
    )
    os.environ["TF_USE_LEGACY_KERAS"] = "1"  # as Ray sets it: `tf.keras` is legacy; rayparallel uses `keras`


class _TensorflowBackend(Backend):
    def on_start(self, worker_group: BaseWorkerGroup, backend_config: TensorflowBackendConfig) -> None:
        addresses = worker_group.execute(_worker_address)
        ray.get(
            [
                worker_group.execute_single_async(i, _write_tf_config, worker_addresses=addresses, index=i)
                for i in range(len(worker_group))
            ]
        )


def trainer_class() -> type:
    """Ray Train's data-parallel trainer without its placement-group cleaner, and without its
    Ray Data callback when the run has no Ray Data datasets.

    The cleaner (a detached actor per run) removes the run's placement group once the state
    API does not find the controller alive, and it takes a missing answer as death: on a
    loaded node a live run's workers were destroyed mid-epoch ("its placement group was
    removed"; ray-project/ray#65447 names the false death). The group is the controller's
    own and goes with it, so nothing is left behind without the cleaner. The Ray Data
    callback starts a dataset-manager actor for every worker group, datasets or not: one more
    process at start-up, beside the workers' TensorFlow import on the same cores.
    """
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    cleaner, datasets_callback = hook("placement_group_cleaner"), hook("datasets_callback")

    class Trainer(DataParallelTrainer):
        def _create_default_callbacks(self) -> list:  # Ray Train's, the unneeded left out
            unneeded = (cleaner,) if self.datasets else (cleaner, datasets_callback)
            return [c for c in super()._create_default_callbacks() if not isinstance(c, unneeded)]

    return Trainer


def make_scaling_config(spec: JobSpec) -> ScalingConfig:
    """The job's `scaling:` in Ray Train's words (elastic where it asks for a range of workers)."""
    scaling = spec.scaling
    elastic = {}
    if scaling.elastic:
        if "elastic_resize_monitor_interval_s" not in ScalingConfig.__dataclass_fields__:
            raise RayParallelError(
                f"scaling.num_workers: expected a Ray with elastic training (2.50 or newer) for "
                f"{{min: {scaling.min_workers}, max: {scaling.max_workers}}}, received Ray {ray.__version__}"
            )
        elastic = {
            "num_workers": (scaling.min_workers, scaling.max_workers),
            "elastic_resize_monitor_interval_s": scaling.elastic_resize_monitor_interval_s,
        }
    return ScalingConfig(
        **(elastic or {"num_workers": scaling.num_workers}),
        use_gpu=scaling.use_gpu,
        resources_per_worker=scaling.resources_per_worker or None,
        placement_strategy=scaling.placement_strategy,
    )


def make_run_config(spec: JobSpec, name: str, storage_path: str, callbacks: list) -> RunConfig:
    """The run's name, storage, kept checkpoints and restarts in Ray Train's words."""
    return RunConfig(
        name=name,
        storage_path=storage_path,
        checkpoint_config=CheckpointConfig(num_to_keep=spec.run.checkpoints_to_keep),
        failure_config=FailureConfig(max_failures=spec.failure.max_failures),
        callbacks=callbacks,
    )

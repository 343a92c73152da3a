"""The workers' own checks, run once in the driver before Ray starts any worker.

A bad builder, loader or data set then fails in seconds with one line, instead of after a
cluster start-up with a worker traceback. The same functions run again in every worker.
"""

from __future__ import annotations

import os

from ..spec import JobSpec
from . import replica, shards


def preflight(spec: JobSpec) -> dict:
    """Load the data, build the replica at the per-worker batch, resolve optimizer/loss/metrics.

    Returns the loader's `baselines` (figures to print beside the model's).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    data = shards.load_data(spec.data, spec.train.global_batch_size)
    model = replica.build_replica(spec.model, spec.per_worker_batch_size)
    replica.make_optimizer(spec.train.optimizer)
    replica.per_sample_loss(spec.train.loss)
    replica.make_metrics(spec.train.metrics, spec.train.loss, data.train.y, tuple(model.outputs[0].shape))
    return data.baselines

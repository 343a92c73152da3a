"""What a run records about itself: params from the spec and versions, tags from placement."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..result import WorkerInfo
from ..secrets import mask
from ..spec import JobSpec


def flatten(tree: Any, prefix: str = "") -> dict[str, str]:
    """{"train": {"epochs": 3}} -> {"train.epochs": "3"}: MLflow params are flat strings.

    >>> flatten({"train": {"epochs": 3, "metrics": ["mae"]}})
    {'train.epochs': '3', 'train.metrics': "['mae']"}
    """
    if isinstance(tree, dict) and tree:
        out: dict[str, str] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): str(tree)[:6000]}


def run_params(spec: JobSpec) -> dict[str, str]:
    """The flattened spec but its `tune` section (secrets masked), the worker layout and the versions that ran it.

    Versions come from the installed packages' metadata: importing TensorFlow here would cost
    the recorder seconds of CPU while the workers start.
    """
    from importlib.metadata import version

    from ..version import __version__

    job = spec.recorded()
    job.pop("tune")  # the sweep's settings, not this run's (a sweep's parent run logs them)
    params = flatten(mask(job))
    params.update(
        {
            "num_workers": spec.scaling.described,
            "per_worker_batch_size": spec.batch_split(),
            "version.ray": version("ray"),
            "version.tensorflow": version("tensorflow"),
            "version.keras": version("keras"),
            "version.rayparallel": __version__,
        }
    )
    return params


def worker_tags(workers: Iterable[WorkerInfo]) -> dict[str, str]:
    workers = sorted(workers, key=lambda w: w.rank)
    nodes = sorted({w.node_id for w in workers})
    return {
        "rayparallel.nodes": ",".join(n[:12] for n in nodes),
        "rayparallel.num_nodes": str(len(nodes)),
        "rayparallel.gpus_per_worker": str(max((len(w.gpu_ids) for w in workers), default=0)),
        "rayparallel.gpu_ids": ";".join(f"{w.rank}:{','.join(w.gpu_ids) or '-'}" for w in workers),
    }

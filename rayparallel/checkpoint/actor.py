"""The checkpoint actor: the one process that writes the run's files.

Rank 0 hands it the base model's weights (NumPy arrays through Ray's object store) and the
global figures of each epoch; every rank registers itself once. The actor rebuilds the base
architecture with the user's builder (any batch size loads the same weights), so what it
writes is a plain Keras `.weights.h5` of the base model: never a wrapper, never one file
per worker. It is pinned to the driver's node, so paths it returns are the driver's paths.
The driver polls :meth:`drain` for progress events to print.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import ray

from ..spec import JobSpec
from ..spec.references import add_search_path


@ray.remote(num_cpus=0, max_concurrency=1)
class CheckpointActor:
    def __init__(self, spec: JobSpec, output_dir: str, search_path: list[str]):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        add_search_path(search_path)
        self._spec = spec
        self._dir = Path(output_dir)
        self._model = None  # the base architecture, built on first save
        self._events: list[dict] = []
        self.history: list[dict] = []
        self.workers: dict[int, dict] = {}
        self.final_weights: str | None = None

    def register_worker(self, info: dict) -> None:
        self.workers[info["rank"]] = info

    def log_progress(self, epoch: int, step: int, steps: int, loss: float, samples_per_s: float) -> None:
        self._events.append({"kind": "progress", "epoch": epoch, "step": step, "steps": steps,
                             "loss": loss, "samples_per_s": samples_per_s})

    def end_epoch(self, epoch: int, logs: dict, seconds: float) -> None:
        self.history.append(dict(logs))
        self._events.append({"kind": "epoch", "epoch": epoch, "logs": dict(logs), "seconds": seconds})

    def save_final_weights(self, weights: list) -> str:
        path = self._dir / "final.weights.h5"
        write_weights(self._base_model(), weights, path)
        self.final_weights = str(path)
        return self.final_weights

    def drain(self) -> list[dict]:
        events, self._events = self._events, []
        return events

    def summary(self) -> dict[str, Any]:
        return {"history": self.history, "final_weights": self.final_weights,
                "workers": [self.workers[r] for r in sorted(self.workers)]}

    def _base_model(self) -> Any:
        if self._model is None:
            from ..worker.replica import build_replica

            self._model = build_replica(self._spec.model, self._spec.per_worker_batch_size)
        return self._model


def write_weights(model: Any, weights: list, path: Path) -> None:
    """Keras weights file written atomically: a reader sees the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    model.set_weights(weights)
    partial = path.with_name(f".{path.name[: -len('.weights.h5')]}.partial-{os.getpid()}.weights.h5")
    try:
        model.save_weights(str(partial))
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)

"""The checkpoint actor: the one process that writes the run's files.

Rank 0 hands it the base model's weights (NumPy arrays through Ray's object store) and the
global figures of each epoch; every rank registers itself once. The actor rebuilds the base
architecture with the user's builder (any batch size loads the same weights), so what it
writes is a plain Keras `.weights.h5` of the base model: never a wrapper, never one file
per worker. Writes run in the actor's own `io` thread, in order, while training goes on;
progress and history calls use another thread so the console stays live during a write.
It is pinned to the driver's node, so the paths it writes are the driver's paths.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Optional

import ray

from ..spec import JobSpec
from ..spec.references import add_search_path
from .files import write_weights
from .manifest import model_recipe, write_manifest
from .policy import Policy, Saved

FINAL = "final.weights.h5"


class CheckpointWriter:
    def __init__(self, spec: JobSpec, checkpoint_dir: str, search_path: list[str]):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        add_search_path(search_path)
        self._spec = spec
        self._dir = Path(checkpoint_dir)
        self._model = None  # the base architecture, built on first save
        self._lock = threading.Lock()
        self._events: list[dict] = []
        self._history: dict[int, dict] = {}
        self._workers: dict[int, dict] = {}
        self._policy = Policy(spec.checkpoint)
        self._final: Optional[Saved] = None
        self._recipe: Optional[dict] = None

    # -- from the workers -------------------------------------------------------------
    def register_worker(self, info: dict) -> None:
        with self._lock:
            self._workers[info["rank"]] = info

    def log_progress(self, epoch: int, step: int, steps: int, loss: float, samples_per_s: float) -> None:
        with self._lock:
            self._events.append({"kind": "progress", "epoch": epoch, "step": step, "steps": steps,
                                 "loss": loss, "samples_per_s": samples_per_s})

    def end_epoch(self, epoch: int, logs: dict, seconds: float) -> None:
        with self._lock:
            self._history[epoch] = dict(logs)  # keyed: a resumed epoch replaces its first try
            self._events.append({"kind": "epoch", "epoch": epoch, "logs": dict(logs), "seconds": seconds})

    def best_value(self) -> Optional[float]:
        """The monitor's best so far, so a restarted rank 0 keeps `save_best_only` right."""
        return self._policy.best

    @ray.method(concurrency_group="io")
    def save_checkpoint(self, weights: list, epoch: int, step: int, batch: int, metrics: dict) -> Optional[str]:
        if not self._policy.should_save(metrics):
            return None
        name = self._policy.filename(epoch, step, batch, metrics)
        self._write(weights, self._dir / name)
        entry = Saved(file=name, epoch=epoch, step=step, metrics=dict(metrics))
        for dropped in self._policy.record(entry):
            if dropped.file != name:
                (self._dir / dropped.file).unlink(missing_ok=True)
        self._write_manifest()
        with self._lock:
            self._events.append({"kind": "checkpoint", "epoch": epoch, "file": str(self._dir / name)})
        return str(self._dir / name)

    @ray.method(concurrency_group="io")
    def save_final_weights(self, weights: list, epoch: int, step: int, metrics: dict) -> str:
        self._write(weights, self._dir / FINAL)
        self._final = Saved(file=FINAL, epoch=epoch, step=step, metrics=dict(metrics))
        self._write_manifest()
        return str(self._dir / FINAL)

    # -- from the driver ----------------------------------------------------------------
    def drain(self) -> list[dict]:
        with self._lock:
            events, self._events = self._events, []
        return events

    def summary(self) -> dict[str, Any]:
        with self._lock:
            return {"history": [self._history[e] for e in sorted(self._history)],
                    "final_weights": str(self._dir / FINAL) if self._final else None,
                    "checkpoint_dir": str(self._dir),
                    "checkpoints": [str(self._dir / s.file) for s in self._policy.saved],
                    "workers": [self._workers[r] for r in sorted(self._workers)]}

    # -- internals ----------------------------------------------------------------------
    def _write(self, weights: list, path: Path) -> None:
        write_weights(self._base_model(), weights, path)

    def _write_manifest(self) -> None:
        if self._recipe is None:
            self._recipe = model_recipe(self._spec)
        write_manifest(self._dir, self._recipe, self._policy, self._final)

    def _base_model(self) -> Any:
        if self._model is None:
            from ..worker.replica import build_replica

            self._model = build_replica(self._spec.model, self._spec.per_worker_batch_size)
        return self._model


CheckpointActor = ray.remote(num_cpus=0, concurrency_groups={"io": 1})(CheckpointWriter)

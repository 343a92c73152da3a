"""Writes the base model's weight files and the manifest: never a wrapper, never one per worker.

It rebuilds the base architecture with the user's builder (any batch size loads the same
weights), so each file is a plain Keras `.weights.h5`, written atomically. The recorder
actor runs it in its own `io` thread while training goes on.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import RayParallelError
from ..files import atomic_write
from ..model import build_model
from ..spec import JobSpec
from .manifest import MANIFEST, model_recipe, read_manifest, write_builder, write_manifest
from .policy import Retention, Saved

if TYPE_CHECKING:
    import keras
    import numpy as np


def weight_file_bytes(model: keras.Model) -> int:
    """About what one `.weights.h5` of `model` takes on disk: the values, and HDF5's own
    structure (measured on Keras 3.15: about 2.3 KiB per variable and 6 KiB per file)."""
    import numpy as np

    values = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.weights)
    return values + 2400 * len(model.weights) + 6144


class CheckpointWriter:
    def __init__(self, spec: JobSpec, folder: Path):
        self.spec, self.folder = spec, folder
        self.retention = Retention(spec.checkpoint)
        self.final: Saved | None = None
        self.final_weights: list[np.ndarray] | None = None
        self._model: keras.Model | None = None  # the base architecture, built once
        self._model_lock = threading.Lock()
        self._recipe: dict | None = None

    def save(self, weights: list[np.ndarray], saved: Saved) -> tuple[Path, list[str]]:
        """Write `saved.file`, then delete what `keep` no longer keeps; returns the file and those deleted."""
        path = self.folder / saved.file
        self.write(weights, path)
        deleted = [dropped.file for dropped in self.retention.record(saved) if dropped.file != saved.file]
        for file in deleted:
            (self.folder / file).unlink(missing_ok=True)
        self._write_manifest()
        return path, deleted

    def save_final(self, weights: list[np.ndarray], saved: Saved) -> Path:
        path = self.folder / saved.file
        self.write(weights, path)
        self.final, self.final_weights = saved, weights
        self._write_manifest()
        return path

    def restore(self) -> int:
        """The files the folder's manifest lists (a resumed run's, or a restarted recorder's), kept
        by the same rules from here on; returns how many there are."""
        try:
            body = read_manifest(self.folder)
        except RayParallelError:  # none written yet
            return 0
        self.retention.saved = [Saved(**entry) for entry in body["checkpoints"]]
        self.final = Saved(**body["final"]) if body.get("final") else None
        return len(self.retention.saved)

    def write(self, weights: list[np.ndarray], path: Path) -> None:
        """HDF5 writes the file in a local scratch folder, then plain file I/O copies it over: HDF5 on a disk
        that fills up half way leaves its file behind and errors (or crashes) only when the file is freed."""
        model = self.base_model()
        model.set_weights(weights)
        with tempfile.TemporaryDirectory(prefix="rayparallel-weights-") as scratch:
            local = Path(scratch) / path.name  # Keras wants the .weights.h5 suffix
            model.save_weights(str(local))
            atomic_write(path, lambda partial: shutil.copyfile(local, partial), "checkpoint.dir")

    @property
    def manifest_path(self) -> Path:
        return self.folder / MANIFEST

    def final_model(self, batch_size: int) -> keras.Model:
        """The base model rebuilt at `batch_size` with the final weights (what MLflow logs)."""
        model = build_model(self.spec.model, batch_size)
        model.set_weights(self.final_weights)
        return model

    def model_of(self, file: str, batch_size: int) -> keras.Model | None:
        """The base model rebuilt at `batch_size` with a weight file of the folder; None once it is deleted."""
        path = self.folder / file
        if not path.exists():
            return None
        model = build_model(self.spec.model, batch_size)
        model.load_weights(str(path))
        return model

    def prepare(self) -> None:
        """Builds the base model in a thread, beside the workers' start: otherwise the first save (and the
        run's end, which waits for the final file) waits for TensorFlow's import and the build, seconds.
        An error is left for the first save, which raises it where it is reported. The thread runs at a
        lower priority (Linux schedules threads alone), so it takes the CPU the workers' start leaves idle."""

        def build() -> None:
            with contextlib.suppress(OSError, AttributeError):  # not Linux: the normal priority
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
            with contextlib.suppress(Exception):  # the user's builder: `write` calls it again and reports
                self.base_model()

        threading.Thread(target=build, name="rayparallel-writer-prepare", daemon=True).start()

    def base_model(self) -> keras.Model:
        with self._model_lock:
            if self._model is None:
                self._model = build_model(self.spec.model, self.spec.per_worker_batch_size)
            return self._model

    def _write_manifest(self) -> None:
        if self._recipe is None:
            self._recipe = model_recipe(self.spec)
            write_builder(self.folder, self.spec)
        write_manifest(self.folder, self._recipe, self.retention, self.final)

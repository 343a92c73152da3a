"""`manifest.json` beside the weight files: what each file is and how to rebuild its model.

Export reads it to rebuild the base model through the recorded builder at any batch size.
Written atomically, like the weight files.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from ..errors import RayParallelError
from ..files import atomic_write_text
from ..spec import JobSpec
from .policy import Retention, Saved

MANIFEST = "manifest.json"


def model_recipe(spec: JobSpec) -> dict:
    """How to rebuild the base model: builder, kwargs, the batch it was trained with, versions."""
    import keras

    return {
        "builder": spec.model.builder,
        "kwargs": spec.model.kwargs,
        "trained_batch_size": spec.per_worker_batch_size,
        "keras_version": keras.__version__,
    }


def write_manifest(folder: Path, recipe: dict, retention: Retention, final: Saved | None) -> None:
    best = retention.best_entry()
    body = {
        "model": recipe,
        "monitor": retention.spec.monitor,
        "mode": retention.mode,
        "checkpoints": [asdict(s) for s in retention.saved],
        "best": best.file if best else None,
        "final": asdict(final) if final else None,
    }
    atomic_write_text(folder / MANIFEST, json.dumps(body, indent=2, default=float), "checkpoint.dir")


def read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    if not path.is_file():
        raise RayParallelError(
            f"checkpoint: expected {MANIFEST} in {str(folder)!r} (written by rayparallel train), received none"
        )
    try:
        return json.loads(path.read_text())
    except (ValueError, OSError) as exc:
        raise RayParallelError(
            f"checkpoint: expected a readable {MANIFEST} at {str(path)!r}, received {type(exc).__name__}: {exc}"
        ) from None

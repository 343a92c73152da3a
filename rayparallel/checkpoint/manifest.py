"""`manifest.json` beside the weight files: what each file is and how to rebuild its model.

Export reads it to rebuild the base model through the recorded builder at any batch size.
Written atomically, like the weight files.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from ..errors import RayParallelError, first_line
from ..files import atomic_write, atomic_write_text
from ..spec import JobSpec
from ..spec.references import reference_name
from .policy import Retention, Saved

MANIFEST = "manifest.json"
BUILDER_FILE = "builder.pkl"  # a builder given itself (`rayparallel.fit`), pickled by value


def model_recipe(spec: JobSpec) -> dict:
    """How to rebuild the base model: builder, kwargs, the batch it was trained with, versions."""
    import keras

    recipe = {
        "builder": reference_name(spec.model.builder),
        "kwargs": spec.model.kwargs,
        "trained_batch_size": spec.per_worker_batch_size,
        "keras_version": keras.__version__,
    }
    if callable(spec.model.builder):  # a notebook's function: `load_model` needs it without the notebook
        recipe["builder_file"] = BUILDER_FILE
    return recipe


def write_builder(folder: Path, spec: JobSpec) -> None:
    """The builder by value beside the manifest, for a builder given itself (see `model_recipe`)."""
    if callable(spec.model.builder):
        from ray import cloudpickle

        atomic_write(
            folder / BUILDER_FILE,
            lambda partial: partial.write_bytes(cloudpickle.dumps(spec.model.builder)),
            "checkpoint.dir",
        )


def read_builder(folder: Path, recipe: dict) -> Callable | str:
    """The recorded builder: its `module:function`, or the function itself from `builder_file`."""
    if not recipe.get("builder_file"):
        return recipe["builder"]
    import pickle

    path = folder / recipe["builder_file"]
    try:
        return pickle.loads(path.read_bytes())
    except Exception as exc:  # a missing file, another environment (a module the function needs)
        raise RayParallelError(
            f"checkpoint: expected {recipe['builder']} pickled by value in {str(path)!r}, received "
            f"{type(exc).__name__}: {first_line(exc, 200)} (load it where the packages it uses are installed)"
        ) from None


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


def set_aside(folder: Path) -> tuple[Path, int] | None:
    """Move an earlier run's weight files and manifest into `folder/earlier-<time>/`.

    A fresh run writes its own manifest; files it does not list beside it would later be
    exported with its recipe, possibly for another model. Returns (where, how many) or None.
    """
    files = [
        p
        for p in folder.glob("*")
        if p.is_file() and (p.name.endswith(".weights.h5") or p.name in (MANIFEST, BUILDER_FILE))
    ]
    if not files:
        return None
    target = folder / f"earlier-{time.strftime('%Y%m%d-%H%M%S')}"
    target.mkdir(parents=True, exist_ok=True)
    for path in files:
        path.rename(target / path.name)
    return target, len(files)


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

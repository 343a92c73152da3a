"""Export: rebuild the base model at any batch size and load a checkpoint's weights.

A replica trained with batch b serves as a batch-1 streaming model: the manifest beside
the weights records the builder and its kwargs, and Keras loads weights by layer order and
shape, which do not depend on the batch size.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import RayParallelError
from ..model import build_model
from ..spec import ModelSpec
from ..spec.references import add_search_path
from .manifest import read_manifest

if TYPE_CHECKING:
    import keras


def find_weights(checkpoint: str | os.PathLike, unlisted: bool = False) -> tuple[Path, dict]:
    """A weights file and its manifest; a folder means its best checkpoint (else the final one).

    The manifest's recipe describes the files it lists; a file it does not list (an earlier
    run's, copied in) may be another model, so it is refused unless `unlisted`.
    """
    path = Path(checkpoint)
    if not path.exists():
        raise RayParallelError(
            f"checkpoint: expected a .weights.h5 file or a checkpoint folder, received {str(path)!r} (not found)"
        )
    folder = path if path.is_dir() else path.parent
    manifest = read_manifest(folder)
    if path.is_dir():
        chosen = manifest.get("best") or (manifest.get("final") or {}).get("file")
        if not chosen and manifest.get("checkpoints"):
            chosen = manifest["checkpoints"][-1]["file"]
        if not chosen:
            raise RayParallelError(
                f"checkpoint: expected {str(folder)!r} to list at least one weights file, received none"
            )
        path = folder / chosen
    if not path.is_file():
        raise RayParallelError(
            f"checkpoint: expected the weights file {str(path)!r} listed in the manifest, received none (deleted?)"
        )
    listed = {entry["file"] for entry in manifest.get("checkpoints", [])} | {(manifest.get("final") or {}).get("file")}
    if path.name not in listed and not unlisted:
        raise RayParallelError(
            f"checkpoint: expected a weights file that {str(folder / 'manifest.json')!r} lists, received "
            f"{str(path)!r}, which it does not (an earlier run's file?); --unlisted rebuilds it with this recipe anyway"
        )
    return path, manifest


def load_model(checkpoint: str | os.PathLike, batch_size: int = 1, unlisted: bool = False) -> keras.Model:
    """The base model rebuilt for `batch_size` with the checkpoint's weights.

    >>> model = rayparallel.load_model("runs/stateful-lstm-co2/checkpoints", batch_size=1)  # doctest: +SKIP
    """
    import h5py

    from ..quiet import import_tensorflow

    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
        raise RayParallelError(f"batch_size: expected a positive integer, received {batch_size!r}")
    path, manifest = find_weights(checkpoint, unlisted)
    if not h5py.is_hdf5(path):
        raise RayParallelError(
            f"checkpoint: expected a Keras .weights.h5 (HDF5) file, received {str(path)!r} (corrupt or not HDF5)"
        )
    recipe = manifest["model"]
    import_tensorflow()
    add_search_path([os.getcwd()])  # the builder is imported as from where the job was launched
    model = build_model(ModelSpec(builder=recipe["builder"], kwargs=recipe.get("kwargs") or {}), batch_size)
    try:
        model.load_weights(str(path))
    except Exception as exc:  # Keras raises ValueError/KeyError/OSError for mismatches
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RayParallelError(
            f"checkpoint: expected weights matching the model of {recipe['builder']} with kwargs {recipe.get('kwargs')}, "
            f"received {str(path)!r} that does not fit it ({first})"
        ) from None
    return model


def export(checkpoint: str | os.PathLike, out: str | os.PathLike, batch_size: int = 1, unlisted: bool = False) -> Path:
    """Save the rebuilt model as a full `.keras` file (architecture + weights)."""
    out = Path(out)
    if out.suffix != ".keras":
        raise RayParallelError(f"--out: expected a path ending in '.keras', received {str(out)!r}")
    model = load_model(checkpoint, batch_size, unlisted)
    out.parent.mkdir(parents=True, exist_ok=True)
    model.save(str(out))
    return out

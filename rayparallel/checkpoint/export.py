"""Export: rebuild the base model at any batch size and load a checkpoint's weights.

A replica trained with batch b serves as a batch-1 streaming model: the manifest beside
the weights records the builder and its kwargs, and Keras loads weights by layer order and
shape, which do not depend on the batch size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import RayParallelError, first_line
from ..model import build_model
from ..spec import ModelSpec
from ..spec.references import add_search_path, reference_name
from .manifest import read_builder, read_manifest

if TYPE_CHECKING:
    import keras


def find_weights(checkpoint: str | os.PathLike, unlisted: bool = False) -> tuple[Path, dict, str]:
    """A weights file, its manifest, and why it was taken; a folder means its best checkpoint
    (by the checkpoint monitor), else the final weights, else the newest checkpoint.

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
    why = "the file given"
    if path.is_dir():
        chosen, why = manifest.get("best"), f"the best by {manifest.get('monitor', 'the monitor')}"
        if not chosen:
            chosen, why = (manifest.get("final") or {}).get("file"), "the final weights"
        if not chosen and manifest.get("checkpoints"):
            chosen, why = manifest["checkpoints"][-1]["file"], "the newest checkpoint"
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
    return path, manifest, why


def load_model(
    checkpoint: str | os.PathLike, batch_size: int = 1, unlisted: bool = False, **builder_kwargs: Any
) -> keras.Model:
    """The base model rebuilt for `batch_size` with the checkpoint's weights.

    `builder_kwargs` change the builder's arguments from the recorded ones (a model trained
    on windows of 10 steps, served one step at a time: `window=1`); the weights must fit.

    Examples:
        >>> model = rayparallel.load_model("runs/stateful-lstm-co2/checkpoints", batch_size=1)  # doctest: +SKIP
    """
    return rebuild(checkpoint, batch_size, unlisted, builder_kwargs).model


@dataclass(frozen=True)
class Rebuilt:
    """A checkpoint's model rebuilt: the model, the recipe it was built by, the weights file and why that one."""

    model: keras.Model
    recipe: ModelSpec  # the builder (a name or the function itself) and its kwargs, changes applied
    weights: Path
    why: str  # "the best by val_loss", "the newest", "the file given"...


def rebuild(checkpoint: str | os.PathLike, batch_size: int, unlisted: bool, builder_kwargs: dict) -> Rebuilt:
    """`load_model`'s work: the weights file found, its model rebuilt for `batch_size` and loaded."""
    import h5py

    from ..quiet import import_tensorflow

    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
        raise RayParallelError(f"batch_size: expected a positive integer, received {batch_size!r}")
    path, manifest, why = find_weights(checkpoint, unlisted)
    if not h5py.is_hdf5(path):
        raise RayParallelError(
            f"checkpoint: expected a Keras .weights.h5 (HDF5) file, received {str(path)!r} (corrupt or not HDF5)"
        )
    builder = read_builder(path.parent, manifest["model"])
    recipe = ModelSpec(builder=builder, kwargs=manifest["model"].get("kwargs") or {})
    wanted = ModelSpec(recipe.builder, {**recipe.kwargs, **builder_kwargs})
    import_tensorflow()
    add_search_path([os.getcwd()])  # the builder is imported as from where the job was launched
    model = build_model(wanted, batch_size)
    try:
        model.load_weights(str(path))
    except Exception as exc:  # Keras raises ValueError/KeyError/OSError for mismatches
        raise RayParallelError(_misfit(recipe, wanted, model, path, exc)) from None
    return Rebuilt(model, wanted, path, why)


def _misfit(recipe: ModelSpec, wanted: ModelSpec, model: keras.Model, path: Path, exc: Exception) -> str:
    """One line: the first layer whose weights differ in shape between the trained and the asked-for model."""
    first = first_line(exc)
    if wanted.kwargs != recipe.kwargs:
        trained = build_model(recipe, 1)
        for old, new in zip(trained.layers, model.layers, strict=False):
            old_shapes = [tuple(w.shape) for w in old.weights]
            new_shapes = [tuple(w.shape) for w in new.weights]
            if old_shapes != new_shapes:
                return (
                    f"model.kwargs: expected arguments that keep the trained weights' shapes, received "
                    f"{wanted.kwargs}: layer {new.name!r} has weights {new_shapes}, trained {old_shapes} "
                    f"with {recipe.kwargs}"
                )
    return (
        f"checkpoint: expected weights matching the model of {reference_name(wanted.builder)} with kwargs {wanted.kwargs}, "
        f"received {str(path)!r} that does not fit it ({first})"
    )


@dataclass(frozen=True)
class Exported:
    """What `export` wrote: the `.keras` file, the weights file it took, and why that one."""

    path: Path
    weights: Path
    why: str  # "the best by val_loss", "the newest", "the file given"...


def export(
    checkpoint: str | os.PathLike,
    *,
    out: str | os.PathLike,
    batch_size: int = 1,
    unlisted: bool = False,
    **builder_kwargs: Any,
) -> Exported:
    """Save the rebuilt model as a full `.keras` file (architecture + weights) at `batch_size`."""
    out = Path(out)
    if out.suffix != ".keras":
        raise RayParallelError(f"--out: expected a path ending in '.keras', received {str(out)!r}")
    rebuilt = rebuild(checkpoint, batch_size, unlisted, builder_kwargs)
    out.parent.mkdir(parents=True, exist_ok=True)
    rebuilt.model.save(str(out))
    return Exported(out, rebuilt.weights, rebuilt.why)

"""Resume state: what Ray Train checkpoints so a restarted worker group continues exactly.

Kept apart from the exported weight files: model weights, the optimizer's variables (step
count, moments), and the position (the next epoch; data order and RNG derive from
`(seed, epoch)`). Saved at epoch ends only, so stateful streams resume at a boundary where
their states are reset anyway.

A crash mid-write or a full disk can leave a damaged `state.npz`: its SHA-256 is in
`meta.json`, and a resume takes the newest intact checkpoint (the driver says which it
skipped and why; every rank makes the same choice).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import RayParallelError

if TYPE_CHECKING:
    import keras
    import ray.train
    import tensorflow as tf

STATE, META = "state.npz", "meta.json"


def snapshot(variables: list) -> list:
    """Point-in-time values of `variables` as tensors, in about a millisecond.

    TensorFlow copies a variable's buffer before updating it in place while a read value
    still refers to it, so later training steps never change a snapshot. Converting to NumPy
    (the slow copy) is left to whoever needs it, e.g. the checkpoint client's thread. Every
    rank calls this at the same point: reading distributed variables may be a collective.
    """
    import tensorflow as tf

    return [tf.identity(v.value) for v in variables]


def digest(arrays: list) -> str:
    """SHA-256 of the arrays' bytes: equal on every rank while the replicas stay in step."""
    sha = hashlib.sha256()
    for array in arrays:
        sha.update(np.ascontiguousarray(array).tobytes())
    return sha.hexdigest()


def to_checkpoint(weights: list, optimizer_values: list, meta: dict) -> ray.train.Checkpoint:
    """A `ray.train.Checkpoint` in a fresh temp folder (Ray copies it to storage_path)."""
    import ray.train

    folder = Path(tempfile.mkdtemp(prefix="rayparallel-resume-"))
    arrays = {f"w{i}": np.asarray(w) for i, w in enumerate(weights)}
    arrays.update({f"o{i}": np.asarray(v) for i, v in enumerate(optimizer_values)})
    np.savez(folder / STATE, **arrays)
    counts = {"weights": len(weights), "optimizer": len(optimizer_values), "state_sha256": _file_sha256(folder / STATE)}
    (folder / META).write_text(json.dumps(dict(meta, **counts)))
    return ray.train.Checkpoint.from_directory(str(folder))


def damage(folder: Path) -> str | None:
    """Why the resume state in `folder` cannot be used, or None when it is intact."""
    try:
        meta = json.loads((folder / META).read_text())
    except (OSError, ValueError) as exc:
        return f"{META} unreadable ({type(exc).__name__})"
    if "state_sha256" in meta and (
        not (folder / STATE).is_file() or _file_sha256(folder / STATE) != meta["state_sha256"]
    ):
        return f"{STATE} does not match its checksum (truncated or overwritten)"
    try:
        with np.load(folder / STATE) as arrays:
            missing = [k for k in (f"w{meta['weights'] - 1}", f"o{meta['optimizer'] - 1}") if k not in arrays]
    except Exception as exc:  # NumPy raises several kinds for a damaged archive
        return f"{STATE} unreadable ({type(exc).__name__})"
    return f"{STATE} lacks {missing}" if missing else None


def newest_intact(folders: list[Path]) -> tuple[Path | None, list[str]]:
    """The newest folder whose resume state is intact, and `name: why` for each newer one skipped."""
    skipped = []
    for folder in sorted(folders, key=lambda f: f.name, reverse=True):
        why = damage(folder)
        if why is None:
            return folder, skipped
        skipped.append(f"{folder.name}: {why}")
    return None, skipped


def _intact_folder(latest: Path, checkpoint: ray.train.Checkpoint) -> Path:
    """`latest`, or the newest intact checkpoint before it beside it in local (or mounted) storage."""
    candidates = [latest]
    if _is_local(checkpoint):
        candidates = [f for f in latest.parent.glob("epoch-*") if f.is_dir() and f.name <= latest.name]
    folder, skipped = newest_intact(candidates)
    if folder is None:
        raise RayParallelError(
            f"resume state: expected an intact checkpoint in {str(latest.parent)!r}, received none ({'; '.join(skipped)})"
        )
    return folder


def folder_name(epoch: int, resumed: ray.train.Checkpoint | None) -> str:
    """`epoch-0003`, or `epoch-0003-2` when a resume past a damaged checkpoint trains its epoch again.

    Ray's retention deletes checkpoints by folder: a new one under a damaged one's name would
    be deleted with the old entry. Names still sort in training order.
    """
    name = f"epoch-{epoch:04d}"
    if resumed is None or not _is_local(resumed):
        return name
    parent, candidate, n = Path(resumed.path).parent, name, 1
    while (parent / candidate).exists():
        n += 1
        candidate = f"{name}-{n}"
    return candidate


def _is_local(checkpoint: ray.train.Checkpoint) -> bool:
    from pyarrow.fs import LocalFileSystem

    return isinstance(checkpoint.filesystem, LocalFileSystem)


def _file_sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def restore(
    checkpoint: ray.train.Checkpoint | None,
    strategy: tf.distribute.Strategy,
    model: keras.Model,
    optimizer: keras.optimizers.Optimizer,
) -> dict | None:
    """Load resume state into the replica and optimizer; returns its meta, or None."""
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as latest:
        folder = _intact_folder(Path(latest), checkpoint)
        meta = json.loads((folder / META).read_text())
        with np.load(folder / STATE) as arrays:
            weights = [arrays[f"w{i}"] for i in range(meta["weights"])]
            optimizer_values = [arrays[f"o{i}"] for i in range(meta["optimizer"])]
    with strategy.scope():
        model.set_weights(weights)
        for variable, value in zip(optimizer.variables, optimizer_values, strict=True):
            variable.assign(value)
    return meta

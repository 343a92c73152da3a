"""Resume state on disk: one folder per resume point, `state.npz` plus `meta.json`.

Kept apart from the exported weight files. `state.npz` holds the weights (`w0`, `w1`, ...),
the optimizer's variables (`o0`, ...) and, for a point inside an epoch, the running epoch's
state (loss and metric sums, every stream's RNN state in stream order: see
`rayparallel.worker.resume`). `meta.json` holds the position, the history so far and the
SHA-256 of `state.npz`: a crash mid-write or a full disk can leave a damaged archive, and a
resume then takes the newest intact point.

Folder names sort in training order: `epoch-0003` after three epochs,
`epoch-0003-step-000040` forty steps into the fourth, `epoch-0003-2` when a resume past a
damaged point trains the same position again (a name is never reused: Ray's retention
deletes by folder).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

STATE, META = "state.npz", "meta.json"


def position_name(epoch: int, step: int = 0) -> str:
    """The folder name of the point after `epoch` completed epochs and `step` steps of the next."""
    return f"epoch-{epoch:04d}" + (f"-step-{step:06d}" if step else "")


def unused_name(parent: Path, name: str) -> str:
    """`name`, or `name-2`, `name-3`... when `parent` already holds it."""
    candidate, n = name, 1
    while (parent / candidate).exists():
        n += 1
        candidate = f"{name}-{n}"
    return candidate


def write_state(folder: Path, arrays: dict[str, np.ndarray], meta: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / STATE, **arrays)
    (folder / META).write_text(json.dumps(dict(meta, state_sha256=file_sha256(folder / STATE))))


def write_state_atomically(parent: Path, name: str, arrays: dict[str, np.ndarray], meta: dict) -> Path:
    """Written beside, then renamed into place: a reader sees a whole point or none."""
    target = parent / unused_name(parent, name)
    partial = parent / f".partial-{target.name}"
    shutil.rmtree(partial, ignore_errors=True)
    write_state(partial, arrays, meta)
    partial.rename(target)
    return target


def read_state(folder: Path) -> tuple[dict[str, np.ndarray], dict]:
    meta = json.loads((folder / META).read_text())
    with np.load(folder / STATE) as archive:
        return {key: archive[key] for key in archive.files}, meta


def damage(folder: Path) -> str | None:
    """Why the resume state in `folder` cannot be used, or None when it is intact."""
    try:
        meta = json.loads((folder / META).read_text())
    except (OSError, ValueError) as exc:
        return f"{META} unreadable ({type(exc).__name__})"
    if "state_sha256" in meta and (
        not (folder / STATE).is_file() or file_sha256(folder / STATE) != meta["state_sha256"]
    ):
        return f"{STATE} does not match its checksum (truncated or overwritten)"
    try:
        with np.load(folder / STATE) as arrays:
            missing = [k for k in (f"w{meta['weights'] - 1}", f"o{meta['optimizer'] - 1}") if k not in arrays]
    except Exception as exc:  # NumPy raises several kinds for a damaged archive
        return f"{STATE} unreadable ({type(exc).__name__})"
    return f"{STATE} lacks {missing}" if missing else None


def points(run_folder: Path) -> list[Path]:
    """Every resume point in a Ray run's folder (Ray's epoch ends and the steps between)."""
    return [meta.parent for meta in run_folder.glob(f"epoch-*/{META}")]


def newest_intact(folders: list[Path]) -> tuple[Path | None, list[str]]:
    """The newest folder whose resume state is intact, and `name: why` for each newer one skipped."""
    skipped = []
    for folder in sorted(folders, key=lambda f: f.name, reverse=True):
        why = damage(folder)
        if why is None:
            return folder, skipped
        skipped.append(f"{folder.name}: {why}")
    return None, skipped


def describe_position(meta: dict) -> str:
    """`epoch 3`, or `epoch 3 and 40 steps of epoch 4`, for the console."""
    epoch, step = int(meta["epoch"]), int(meta.get("step", 0))
    return f"epoch {epoch}" + (f" and {step} steps of epoch {epoch + 1}" if step else "")


def file_sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def write_point_keeping(run_folder: Path, arrays: dict[str, np.ndarray], meta: dict, keep: int) -> Path:
    """A resume point inside an epoch, beside Ray's epoch ends; the oldest such points beyond `keep` go.

    Ray's own retention (`CheckpointConfig(num_to_keep)`) deletes only the epoch ends it reported."""
    folder = write_state_atomically(run_folder, position_name(meta["epoch"], meta["step"]), arrays, meta)
    inside = sorted(f for f in points(run_folder) if "-step-" in f.name)
    for old in inside[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return folder

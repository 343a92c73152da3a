"""Atomic file writes: a reader sees the previous file or the new one, never half of one.

Each write goes to a hidden partial file in the same folder, then `os.replace` renames it.
A failed write (permissions, full disk) leaves the previous file as it was and raises one
line naming the folder.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import RayParallelError


class CheckpointWriteError(RayParallelError):
    """A checkpoint file could not be written; earlier files are untouched."""


def ensure_writable(folder: Path) -> None:
    """Fail before training when the checkpoint folder cannot be created or written."""
    _atomic(folder / ".rayparallel-write-test", lambda partial: partial.write_bytes(b"ok"))
    (folder / ".rayparallel-write-test").unlink(missing_ok=True)


def write_weights(model: Any, weights: list, path: Path) -> None:
    """The base model's weights as a Keras `.weights.h5` file."""
    model.set_weights(weights)
    _atomic(path, lambda partial: model.save_weights(str(partial)))


def atomic_write_text(path: Path, text: str) -> None:
    _atomic(path, lambda partial: partial.write_text(text))


def _atomic(path: Path, write: Callable[[Path], Any]) -> None:
    stem, dot, suffix = path.name.partition(".")
    partial = path.with_name(f".{stem}.partial-{os.getpid()}{dot}{suffix}")  # keeps .weights.h5
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(partial)
        os.replace(partial, path)
    except OSError as exc:
        raise CheckpointWriteError(
            f"checkpoint.dir: expected a writable folder with free space, received {str(path.parent)!r} "
            f"({type(exc).__name__}: {exc.strerror or exc}); earlier checkpoints are intact"
        ) from None
    finally:
        with contextlib.suppress(OSError):
            partial.unlink()

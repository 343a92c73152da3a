"""Atomic file writes: a reader sees the previous file or the new one, never half of one.

Each write goes to a hidden partial file in the same folder, then `os.replace` renames it.
A failed write (permissions, full disk) leaves the previous file as it was and raises one
line naming the setting the folder came from (`checkpoint.dir`, `--output-dir`, ...).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import RayParallelError


class WriteError(RayParallelError):
    """A file could not be written; the earlier file of that name is untouched."""


def free_space(folder: Path) -> str:
    """`12.3 MiB free on /mnt/ckpt`, for a line about a failed write."""
    try:
        return f"{shutil.disk_usage(folder).free / 2**20:.1f} MiB free in {folder}"
    except OSError as exc:
        return f"free space in {folder} unknown ({exc.strerror or exc})"


def space_warning(folder: Path, files: int, file_bytes: int, key: str) -> str | None:
    """A line when `folder`'s disk has less room than `files` files of `file_bytes` each, else None."""
    existing = next((p for p in [folder, *folder.parents] if p.exists()), None)
    needed = files * file_bytes
    try:
        free = shutil.disk_usage(existing).free if existing else None
    except OSError:
        free = None
    if free is None or free >= needed:
        return None
    return (
        f"WARNING {key}: expected room for about {needed / 2**20:.1f} MiB of weight files ({files} files of "
        f"{file_bytes / 2**10:.1f} KiB), received {free / 2**20:.1f} MiB free in {folder}; a file that does "
        "not fit is skipped with a warning"
    )


def refuse_unwritable(folder: Path, key: str) -> None:
    """What `ensure_writable` refuses that can be seen without creating anything (an existing file, a file or
    a read-only folder on the way): a run checks it before Ray starts, so a bad folder costs no start."""
    if folder.exists() and not folder.is_dir():
        raise WriteError(f"{key}: expected a folder, received {str(folder)!r} (an existing file)")
    nearest = next(p for p in [folder, *folder.parents] if p.exists())
    if not nearest.is_dir() or not os.access(nearest, os.W_OK | os.X_OK):
        why = "a file on its path" if not nearest.is_dir() else "a folder on its path is not writable"
        raise WriteError(
            f"{key}: expected a writable folder with free space, received {str(folder)!r} ({why}: {nearest})"
        )


def ensure_writable(folder: Path, key: str) -> None:
    """Fail before training when `folder` (set by `key`) cannot be created or written."""
    refuse_unwritable(folder, key)
    probe = folder / ".rayparallel-write-test"
    atomic_write(probe, lambda partial: partial.write_bytes(b"ok"), key)
    probe.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str, key: str) -> None:
    atomic_write(path, lambda partial: partial.write_text(text), key)


def atomic_write(path: Path, write: Callable[[Path], Any], key: str) -> None:
    """`write(partial)` writes the content; then it replaces `path` in one rename."""
    stem, dot, suffix = path.name.partition(".")
    partial = path.with_name(f".{stem}.partial-{os.getpid()}{dot}{suffix}")  # keeps .weights.h5
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(partial)
        os.replace(partial, path)
    except OSError as exc:
        raise WriteError(
            f"{key}: expected a writable folder with free space, received {str(path.parent)!r} "
            f"({type(exc).__name__}: {' '.join(str(exc.strerror or exc).split())}); earlier files are intact"
        ) from None
    finally:
        with contextlib.suppress(OSError):
            partial.unlink()

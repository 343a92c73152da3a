"""The driver's own console lines: printed at once (also into a `ray job` log), or not at all."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

Say = Callable[[str], None]


def printer(verbose: bool) -> Say:
    return partial(print, flush=True) if verbose else (lambda *_: None)


def continue_with(command: str, output_dir: Path) -> str:
    return f"continue with: rayparallel {command} ... --resume --output-dir {output_dir}"


def interrupted(command: str, output_dir: Path, what: str = "") -> str:
    """The line an interrupted run or sweep ends with: how to continue it."""
    done = f"interrupted; {what}; " if what else "interrupted; "
    return f"\nrayparallel: {done}{continue_with(command, output_dir)}"


def plural(count: int, word: str) -> str:
    """`2 workers`, `1 replica`: a count and its word, in the driver's lines."""
    return f"{count} {word}{'' if count == 1 else 's'}"

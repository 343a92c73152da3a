"""Resolve the spec's `"module:function"` references to callables.

The driver, the workers and the run's recorder all resolve the same references, so each
process puts the same `search_path` (the driver's working directory) first on `sys.path`,
once, where it starts: `rayparallel.api`, the worker loop, the recorder, and export.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable

from ..errors import SpecError


def add_search_path(paths: Iterable[str]) -> None:
    """Make the user's modules importable here as they were where the job was launched."""
    for path in reversed(list(paths)):
        if os.path.isdir(path) and path not in sys.path:
            sys.path.insert(0, path)


def resolve(ref: str, key: str) -> Callable:
    """`"jobs.stateful_lstm:build_model"` -> the function; a clear error if it does not resolve."""
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecError(
            f"{key}: expected an importable 'module:function', received {ref!r} "
            f"({type(exc).__name__}: {exc}; searched from {os.getcwd()})"
        ) from None
    target = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise SpecError(f"{key}: expected {module_name!r} to define {attr!r}, received {ref!r} (no such attribute)")
        target = getattr(target, part)
    if not callable(target):
        raise SpecError(f"{key}: expected a callable, received {ref!r} ({type(target).__name__})")
    return target

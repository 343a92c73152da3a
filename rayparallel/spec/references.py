"""Resolve the spec's references to callables: `"module:function"` strings, or the functions themselves.

The driver, the workers and the run's recorder all resolve the same references, so each
process puts the same `search_path` (the driver's working directory) first on `sys.path`,
once, where it starts: `rayparallel.api`, the worker loop, the recorder, and export.

A function given itself (`rayparallel.fit`'s builder, one defined in a notebook cell or in
`__main__`) is not imported anywhere: Ray pickles it by value with the spec (cloudpickle), so
it must be picklable (`check_picklable`). What is written down (job.yaml, MLflow params, the
manifest) names it as `module:qualname` (`named`).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import SpecError, first_line
from .schema import Reference


def add_search_path(paths: Iterable[str]) -> None:
    """Make the user's modules importable here as they were where the job was launched."""
    for path in reversed(list(paths)):
        if os.path.isdir(path) and path not in sys.path:
            sys.path.insert(0, path)


def resolve(ref: Reference, key: str) -> Callable:
    """`"jobs.stateful_lstm:build_model"` -> the function (a function given itself stays as it is)."""
    if callable(ref):
        return ref
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


def reference_name(ref: Any) -> Any:
    """How a reference is written down: a string as it is, a function (or a class) as `module:qualname`.

    >>> reference_name("jobs.stateful_lstm:build_model"), reference_name(reference_name)
    ('jobs.stateful_lstm:build_model', 'rayparallel.spec.references:reference_name')
    """
    if isinstance(ref, str) or not callable(ref):
        return ref
    name = getattr(ref, "__qualname__", None) or type(ref).__qualname__
    return f"{getattr(ref, '__module__', None) or type(ref).__module__}:{name}"


def named(tree: Any) -> Any:
    """A copy of a spec's dict whose functions and other objects (a callback instance) are written by name,
    as YAML, MLflow params and the manifest record them.

    >>> named({"model": {"builder": reference_name, "kwargs": {"units": 8}}, "train": {"metrics": ["mae"]}})
    {'model': {'builder': 'rayparallel.spec.references:reference_name', 'kwargs': {'units': 8}}, 'train': {'metrics': ['mae']}}
    """
    if isinstance(tree, dict):
        return {key: named(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [named(value) for value in tree]
    if tree is None or isinstance(tree, (str, int, float, bool)):
        return tree
    if callable(tree):
        return reference_name(tree)
    return f"{type(tree).__module__}:{type(tree).__qualname__}"  # an object: its class


class Deferred:
    """A function given by value (a notebook's builder), kept pickled until it is first called.

    Unpickling a builder imports what its module imported (Keras, so TensorFlow: 5 s on 2 cores).
    The run's recorder only names the builder until it builds a model for its first save, so its
    copy of the spec holds the builder this way, and it is ready (and answers the workers' first
    calls) without that import.
    """

    def __init__(self, function: Callable):
        from ray import cloudpickle

        self.__module__, self.__qualname__ = function.__module__, function.__qualname__  # for `reference_name`
        self.pickled, self._function = cloudpickle.dumps(function), None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._function is None:
            from ray import cloudpickle

            self._function = cloudpickle.loads(self.pickled)
        return self._function(*args, **kwargs)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_function": None}


def deferred(ref: Reference) -> Reference:
    """`ref` with a function given by value as a `Deferred` (a name stays as it is)."""
    return ref if isinstance(ref, str) or isinstance(ref, Deferred) else Deferred(ref)


def check_picklable(ref: Reference, key: str) -> None:
    """A function given itself must reach the workers by value: one line naming what could not be pickled."""
    if isinstance(ref, str):
        return
    from ray import cloudpickle

    try:
        cloudpickle.dumps(ref)
    except Exception as exc:  # pickling raises TypeError, PicklingError, AttributeError...
        raise SpecError(
            f"{key}: expected a function Ray can send to the workers by value (cloudpickle), received "
            f"{reference_name(ref)} ({type(exc).__name__}: {first_line(exc, 200)})"
        ) from None

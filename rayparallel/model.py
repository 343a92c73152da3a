"""The base model, built by the user's builder for a given batch size.

Workers build their replica at the per-worker batch, the recorder rebuilds the same
architecture to write weight files, and export rebuilds it at any batch (1 for streaming
inference): all three come through here, so a builder is checked the same way everywhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .errors import ModelError, describe
from .spec import ModelSpec
from .spec.references import reference_name, resolve

if TYPE_CHECKING:
    import keras


def build_model(spec: ModelSpec, batch_size: int, dtype_policy: str = "float32") -> keras.Model:
    """`builder(batch_size=..., **kwargs)`, checked to be a Keras model built for that batch."""
    import keras

    builder = resolve(spec.builder, "model.builder")
    with _dtype_policy(dtype_policy):
        model = builder(batch_size=batch_size, **spec.kwargs)
    if not isinstance(model, keras.Model):
        raise ModelError(
            f"model.builder: expected a keras.Model, received {describe(model)} from {reference_name(spec.builder)!r}"
        )
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):  # a Sequential without an Input has none yet
        inputs = None
    if not inputs:
        raise ModelError(
            f"model.builder: expected a model with defined inputs, received a {type(model).__name__} without an "
            f"Input from {reference_name(spec.builder)!r}; start it with keras.Input(batch_shape=(batch_size, ...))"
        )
    for tensor in inputs:
        fixed = tensor.shape[0]
        if fixed is not None and fixed != batch_size:
            raise ModelError(
                f"model.builder: expected a model with batch size {batch_size} (the per-worker batch), "
                f"received input {tensor.name!r} with fixed batch {fixed}; "
                "build keras.Input(batch_shape=(batch_size, ...))"
            )
    return model


@contextlib.contextmanager
def _dtype_policy(name: str) -> Iterator[None]:
    """Layers built inside compute in `name` ("mixed_float16": float16 math, float32 weights)."""
    import keras

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)

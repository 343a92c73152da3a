"""A stateful model built for S slots, stepped for any subset of them: the other slots' states stay as they were.

Keras' stateful layers keep one state row per batch row, and a model call advances every row. A live
server's step has windows for some streams only, so each step runs the whole batch (rows without a
window get zeros) and then puts back the state rows of the slots that had no window: stream i's state
moves only with stream i's windows, and its outputs are what one process computes running stream i's
windows at batch 1 with its state carried (`tests/test_serve_slots.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..inference.output import named_outputs
from ..worker.replica import stateful_layers

if TYPE_CHECKING:
    import keras


class SlotModel:
    """`model` (built for S rows, one input of shape (S, window...)) stepped slot by slot.

    A step is one compiled call (`tf.function`, traced once: the batch and the masks keep their shapes) that
    zeroes the state rows of the slots that start, runs the model, and puts back the state rows of the slots
    without a window, all on the states' own device: no `predict_on_batch`, no host copy of a state."""

    def __init__(self, model: keras.Model):
        if len(model.inputs) != 1 or model.inputs[0].shape[0] is None:
            shapes = [tuple(t.shape) for t in model.inputs]
            raise ValueError(f"model: expected one input with a fixed batch (the slots), received inputs {shapes}")
        self.model = model
        self.slots = int(model.inputs[0].shape[0])
        self.window_shape = tuple(model.inputs[0].shape[1:])
        self.dtype = model.inputs[0].dtype
        self.states = [variable for layer in stateful_layers(model) for variable in layer.states]
        self._batch = np.zeros((self.slots, *self.window_shape), dtype=np.dtype(self.dtype))
        self._call = _compiled_step(model, self.states)
        self._starting: set[int] = set()

    def start(self, slot: int) -> None:
        """The slot's state from zero at its next step, as a new stream's (Keras' initial states are zeros)."""
        self._starting.add(slot)

    def step(self, windows: dict[int, np.ndarray]) -> dict[int, dict[str, np.ndarray]]:
        """One window for each slot in `windows` (slot -> one window, without a batch axis): each slot's
        outputs (by output name, one row each); every slot not in `windows` keeps its state."""
        batch, stepped, starting = self._batch, np.zeros(self.slots, bool), np.zeros(self.slots, bool)
        batch[:] = 0
        for slot, window in windows.items():
            batch[slot] = window
        stepped[list(windows)] = True
        starting[list(self._starting)] = True
        self._starting.clear()
        outputs = named_outputs(self.model, self._call(batch, stepped, starting))
        return {slot: {name: values[slot] for name, values in outputs.items()} for slot in windows}

    def states_of(self, slots: list[int]) -> dict[int, list[np.ndarray]]:
        """Each slot's state rows, layer by layer (what a stream carries if it moves to another replica)."""
        values = [np.asarray(variable.numpy()) for variable in self.states]
        return {slot: [rows[slot].copy() for rows in values] for slot in slots}

    def restore(self, slot: int, rows: list[np.ndarray]) -> None:
        """A stream's state rows (`states_of` of another replica's slot) put into `slot` (a start asked before
        is dropped: the rows are the stream's state)."""
        self._starting.discard(slot)
        for variable, row in zip(self.states, rows, strict=True):
            values = np.array(variable.numpy())
            values[slot] = row
            variable.assign(values)


def _compiled_step(model: keras.Model, states: list) -> Callable:
    """`call(batch, stepped, starting)`: the starting slots' states zeroed, the model run on the batch, the
    states of the slots not stepped put back; the model's outputs for every slot."""
    import tensorflow as tf

    def rows(mask, like):
        return tf.reshape(mask, (-1,) + (1,) * (len(like.shape) - 1))

    @tf.function(reduce_retracing=True)
    def call(batch, stepped, starting):
        for variable in states:
            variable.assign(tf.where(rows(starting, variable), tf.zeros_like(variable.value), variable.value))
        before = [tf.identity(variable.value) for variable in states]
        outputs = model(batch, training=False)
        for variable, old in zip(states, before, strict=True):
            variable.assign(tf.where(rows(stepped, old), variable.value, old))
        return outputs

    return call

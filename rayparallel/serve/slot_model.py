"""A stateful model built for S slots, stepped for any subset of them: the other slots' states stay as they were.

Keras' stateful layers keep one state row per batch row, and a model call advances every row. A live
server's step has windows for some streams only, so each step runs the whole batch (rows without a
window get zeros) and then puts back the state rows of the slots that had no window: stream i's state
moves only with stream i's windows, and its outputs are what one process computes running stream i's
windows at batch 1 with its state carried (`tests/test_serve_slots.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..inference.output import named_outputs
from ..worker.replica import stateful_layers

if TYPE_CHECKING:
    import keras


class SlotModel:
    """`model` (built for S rows, one input of shape (S, window...)) stepped slot by slot."""

    def __init__(self, model: keras.Model):
        if len(model.inputs) != 1 or model.inputs[0].shape[0] is None:
            shapes = [tuple(t.shape) for t in model.inputs]
            raise ValueError(f"model: expected one input with a fixed batch (the slots), received inputs {shapes}")
        self.model = model
        self.slots = int(model.inputs[0].shape[0])
        self.window_shape = tuple(model.inputs[0].shape[1:])
        self.dtype = model.inputs[0].dtype
        self.states = [variable for layer in stateful_layers(model) for variable in layer.states]

    def start(self, slot: int) -> None:
        """The slot's state from zero, as a new stream's (Keras' initial states are zeros)."""
        for variable in self.states:
            rows = np.asarray(variable.numpy())
            rows[slot] = 0
            variable.assign(rows)

    def step(self, windows: dict[int, np.ndarray]) -> dict[int, dict[str, np.ndarray]]:
        """One window for each slot in `windows` (slot -> one window, without a batch axis): each slot's
        outputs (by output name, one row each); every slot not in `windows` keeps its state."""
        batch = np.zeros((self.slots, *self.window_shape), dtype=np.dtype(self.dtype))
        for slot, window in windows.items():
            batch[slot] = window
        before = [np.asarray(variable.numpy()) for variable in self.states]
        outputs = named_outputs(self.model, self.model.predict_on_batch(batch))
        stepped = np.zeros(self.slots, dtype=bool)
        stepped[list(windows)] = True
        for variable, old in zip(self.states, before, strict=True):
            keep = stepped.reshape((-1,) + (1,) * (old.ndim - 1))
            variable.assign(np.where(keep, np.asarray(variable.numpy()), old))
        return {slot: {name: values[slot] for name, values in outputs.items()} for slot in windows}

    def states_of(self, slots: list[int]) -> dict[int, list[np.ndarray]]:
        """Each slot's state rows, layer by layer (what a stream carries if it moves to another replica)."""
        values = [np.asarray(variable.numpy()) for variable in self.states]
        return {slot: [rows[slot].copy() for rows in values] for slot in slots}

    def restore(self, slot: int, rows: list[np.ndarray]) -> None:
        """A stream's state rows (`states_of` of another replica's slot) put into `slot`."""
        for variable, row in zip(self.states, rows, strict=True):
            values = np.asarray(variable.numpy())
            values[slot] = row
            variable.assign(values)
